"""Learning-rate schedules and optimizers (optax).

    paper:   lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)   (eq. 3, section 5.3)
    cosine:  linear warmup to `lr`, then cosine decay to `lr * final_fraction`
    constant: `lr`

The schedules take the paper's step = optax's count + 1."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from jaxformer.checks import BadValue, check_choice, check_int, check_number
from jaxformer.train.config import OPTIMIZERS, SCHEDULES


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
    `cosine` takes lr, warmup_steps and total_steps; `constant` takes lr."""
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
    if name == "constant":
        return optax.constant_schedule(lr)
    if total_steps is None or total_steps <= warmup_steps:
        raise BadValue(
            f"the cosine schedule needs total_steps > warmup_steps, got {total_steps} and {warmup_steps}"
        )
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
) -> optax.GradientTransformation:
    """Adam(0.9, 0.98, 1e-9) as in the paper, or AdamW; optional global-norm clipping."""
    check_choice("optimizer", name, OPTIMIZERS)
    check_number("b1", b1, "[0, 1)")
    check_number("b2", b2, "[0, 1)")
    check_number("eps", eps, "[0, inf)")
    check_number("weight_decay", weight_decay, "[0, inf)")
    if name == "adam":
        if weight_decay:
            raise BadValue("weight_decay needs the 'adamw' optimizer")
        opt = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    else:
        opt = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    if clip_norm is None:
        return opt
    check_number("clip_norm", clip_norm, "(0, inf)")
    return optax.chain(optax.clip_by_global_norm(clip_norm), opt)
