"""Learning-rate schedules and optimizers (optax).

    paper:   lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)   (eq. 3, section 5.3)
    cosine:  linear warmup to `lr`, then cosine decay to `lr * final_fraction`
    warmup_constant: linear warmup to `lr`, then `lr` (what schedule-free methods take)
    constant: `lr`

The schedules take the paper's step = optax's count + 1. The optimizers are a registry,
OPTIMIZERS, which the built-ins use too: adam, adamw, muon (optax.contrib.muon: the layer
stacks' matrices by orthogonalised momentum, the rest by AdamW; see `muon_dimensions`) and
schedule_free_adamw (optax.contrib, evaluated at its average: `eval_params`)."""

from __future__ import annotations

import difflib

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, ScheduleFreeState

from jaxformer.checks import BadValue, as_given, check_choice, check_int, check_number
from jaxformer.functional.registry import Registry

SCHEDULES = ("paper", "cosine", "warmup_constant", "constant")
UNDECAYED = ("warmup_constant", "constant")  # the schedules a schedule-free optimizer takes

OPTIMIZERS = Registry(
    "optimizer",
    "jaxformer.train.OPTIMIZERS",
    "fn(schedule, *, b1, b2, eps, weight_decay, **options) -> optax.GradientTransformation; "
    "register with takes=(the run options it reads, e.g. 'muon_lr_scale') and with "
    "schedule_free=True when it is optax.contrib.schedule_free (an undecayed schedule)",
)


def paper_schedule(d_model: int, warmup_steps: int = 4000, scale: float = 1.0) -> optax.Schedule:
    """scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), step = count + 1."""
    check_int("d_model", d_model)
    check_int("warmup_steps", warmup_steps)
    check_number("scale", scale, "(0, inf)")

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def make_schedule(
    name: str,
    *,
    lr: float | None = None,
    d_model: int | None = None,
    warmup_steps: int = 4000,
    total_steps: int | None = None,
    final_fraction: float = 0.0,
) -> optax.Schedule:
    """A schedule by name. `paper` takes d_model (and `lr` as an optional multiplier);
    `cosine` takes lr, warmup_steps and total_steps; `warmup_constant` lr and
    warmup_steps; `constant` takes lr."""
    check_choice("schedule", name, SCHEDULES)
    if lr is not None:
        check_number("lr", lr, "(0, inf)")
    if name == "paper":
        if d_model is None:
            raise BadValue("the paper schedule needs d_model")
        return paper_schedule(d_model, warmup_steps, 1.0 if lr is None else lr)
    if lr is None:
        raise BadValue(f"the {name} schedule needs a learning rate lr > 0, got None")
    check_number("final_fraction", final_fraction, "[0, 1]")
    if name == "constant" or (name == "warmup_constant" and warmup_steps == 0):
        return optax.constant_schedule(lr)
    if name == "warmup_constant":
        inner = optax.warmup_constant_schedule(0.0, lr, warmup_steps)
    elif total_steps is None or total_steps <= warmup_steps:
        raise BadValue(
            f"the cosine schedule needs total_steps > warmup_steps, got {total_steps} and {warmup_steps}"
        )
    else:
        inner = optax.warmup_cosine_decay_schedule(
            0.0, lr, warmup_steps, total_steps, end_value=lr * final_fraction
        )
    return lambda count: inner(count + 1)


def make_optimizer(
    schedule: optax.Schedule,
    *,
    name: str = "adam",
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-9,
    weight_decay: float = 0.0,
    clip_norm: float | None = None,
    **options,
) -> optax.GradientTransformation:
    """The registered optimizer `name` over `schedule`, by default Adam(0.9, 0.98, 1e-9) as
    in the paper; `options` are its own (muon: muon_lr_scale, adam_lr_scale, ns_steps);
    with `clip_norm`, global-norm clipping first."""
    check_optimizer(name, options)
    check_number("b1", b1, "[0, 1)")
    check_number("b2", b2, "[0, 1)")
    check_number("eps", eps, "[0, inf)")
    check_number("weight_decay", weight_decay, "[0, inf)")
    fn = OPTIMIZERS[name].fn
    opt = fn(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, **options)
    if clip_norm is None:
        return opt
    check_number("clip_norm", clip_norm, "(0, inf)")
    return optax.chain(optax.clip_by_global_norm(clip_norm), opt)


def check_optimizer(name, options=()) -> None:
    """`name` is a registered optimizer (else one line with the closest name) that takes
    each of `options`, the names of the options given for it."""
    close = difflib.get_close_matches(str(name), OPTIMIZERS.names, n=1)
    if isinstance(name, str) and name not in OPTIMIZERS.names and close:
        raise BadValue(
            f"{as_given('optimizer')} must be one of {OPTIMIZERS.names}, got {name!r}: did you "
            f"mean {close[0]!r}?"
        )
    OPTIMIZERS.check(name)
    takes = {n: OPTIMIZERS[n].options.get("takes", ()) for n in OPTIMIZERS.names}
    for option in options:
        if option not in takes[name]:
            users = " and ".join(n for n in takes if option in takes[n])
            raise BadValue(
                f"{as_given(option)} is not an option of {name}" + (users and f" ({users}'s)")
            )


def eval_params(state):
    """The parameters to evaluate and export of a TrainState: for an optimizer built on
    optax.contrib.schedule_free its average x (`schedule_free_eval_params`; the params it
    trains are the interpolation y), for any other `state.params` itself."""
    is_free = lambda s: isinstance(s, ScheduleFreeState)  # noqa: E731
    found = [s for s in jax.tree.leaves(state.opt_state, is_leaf=is_free) if is_free(s)]
    if not found:
        return state.params
    return optax.contrib.schedule_free_eval_params(found[0], state.params)


@OPTIMIZERS.register("adam")
def _adam(schedule, *, b1, b2, eps, weight_decay):
    if weight_decay:
        raise BadValue("weight_decay needs the 'adamw' optimizer (or muon, schedule_free_adamw)")
    return optax.adam(schedule, b1=b1, b2=b2, eps=eps)


@OPTIMIZERS.register("adamw")
def _adamw(schedule, *, b1, b2, eps, weight_decay):
    return optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)


@OPTIMIZERS.register("schedule_free_adamw", schedule_free=True)
def _schedule_free_adamw(schedule, *, b1, b2, eps, weight_decay):
    return optax.contrib.schedule_free_adamw(
        schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay
    )


# How Muon reads each matrix of the layer stacks as [fan in, fan out] (a stacked-layer axis,
# as scan_layers makes, is a batch axis): Q, K and V each one [E, H * D] matrix over all
# heads, orthogonalised apart from each other (modded-nanogpt's c_q, c_k, c_v), and W^O one
# [H * D, E] matrix.
MUON_MATRICES = {
    **dict.fromkeys(("wq", "wk", "wv"), MuonDimensionNumbers(-3, (-2, -1))),  # [E, H, D]
    "wo": MuonDimensionNumbers((-3, -2), -1),  # [H, D, E]
    **dict.fromkeys(("w1", "w_gate", "w2"), MuonDimensionNumbers(-2, -1)),  # [E, F], [F, E]
}


def muon_dimensions(params) -> dict:
    """Each parameter's MuonDimensionNumbers, None for those AdamW updates: the attention
    and feed-forward matrices inside the layer stacks get Muon; embeddings, the output
    head, norms and biases (the attention biases [H, D] too) get AdamW."""

    def one(path, _):
        names = [getattr(key, "key", None) for key in path]
        return MUON_MATRICES.get(names[-1]) if "layers" in names else None

    return jax.tree_util.tree_map_with_path(one, params)


@OPTIMIZERS.register("muon", takes=("muon_lr_scale", "adam_lr_scale", "ns_steps"))
def _muon(
    schedule, *, b1, b2, eps, weight_decay, muon_lr_scale=10.0, adam_lr_scale=1.0, ns_steps=5
):
    """optax.contrib.muon (momentum 0.95, Nesterov, which its AdamW group takes too, and
    5 steps of the quintic (3.4445, -4.7750, 2.0315)); each group's lr is the schedule's
    times its scale, and the weight decay, times each group's lr, applies to both."""
    check_number("muon_lr_scale", muon_lr_scale, "(0, inf)")
    check_number("adam_lr_scale", adam_lr_scale, "(0, inf)")
    check_int("ns_steps", ns_steps)
    return optax.contrib.muon(
        lambda count: muon_lr_scale * schedule(count),
        ns_steps=ns_steps,
        eps=eps,
        weight_decay=weight_decay,
        adam_b1=b1,
        adam_b2=b2,
        adam_weight_decay=weight_decay,
        adam_learning_rate=lambda count: adam_lr_scale * schedule(count),
        muon_weight_dimension_numbers=muon_dimensions,
    )
