"""Train state and the train and eval steps: pure functions over (graphdef, state), to be
compiled by `jax.jit` or a `jaxformer.parallel` placement.

A batch is a dict of arrays. The decoder side is shared by both model kinds:
    tgt_in [B, T] int     decoder input (the target shifted right, starting with BOS)
    tgt_out [B, T] int    the tokens to predict
    tgt_valid [B, T] bool real target tokens (loss weights; False = padding); leave it out
                          when every token is real, and the step does no padding work
`Transformer` batches add src [B, S] int and src_valid [B, S] bool (optional likewise);
`DecoderLM` batches may add segment_ids and positions [B, T] int for packed rows (their
padding is segment 0; tgt_valid then weighs the loss only)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from jaxformer.checks import (
    BadType,
    BadValue,
    as_given,
    check_choice,
    check_instance,
    check_int,
    check_number,
)
from jaxformer.config import LM_HEADS
from jaxformer.functional import sites
from jaxformer.functional.layers import tied_logits
from jaxformer.functional.losses import LossSums, chunked_cross_entropy, cross_entropy
from jaxformer.models import DecoderLM, Transformer
from jaxformer.nn.parameters import plain
from jaxformer.nn.sharding import constrain_batch
from jaxformer.parallel import per_replica_key, sum_over_replicas
from jaxformer.train.internals import activation_sums, dynamics, site_patterns

Batch = dict[str, jax.Array]
# "auto" takes the chunked head from this many logits B*T*V up (256 MiB in float32) on a
# device that does not report its memory (a CPU), and from an eighth of the device's memory
# in float32 logits on one that does: the chunked head recomputes the [B*T, E] x [E, V]
# product in its backward pass, so it is slower where the dense logits fit.
AUTO_CHUNKED_LOGITS = 2**26


@struct.dataclass
class TrainState:
    """Everything a run needs to continue, as plain arrays (what crosses `jit`):
    restoring it resumes bit-exactly."""

    step: jax.Array  # int32 []: updates applied so far
    params: dict  # the model's parameters: nested dicts of arrays (`nnx.merge` takes them)
    opt_state: optax.OptState  # over params
    rng: jax.Array  # uint32 [2]: base dropout key; step s uses fold_in(rng, s)


def create_train_state(
    model: nnx.Module, optimizer: optax.GradientTransformation, seed: int
) -> tuple[nnx.GraphDef, TrainState]:
    """Split `model` into its static graph and a fresh TrainState of plain arrays."""
    check_instance("model", model, (Transformer, DecoderLM))
    check_int("seed", seed, minimum=None)
    graphdef, variables = nnx.split(model)
    params = plain(variables)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=jax.random.PRNGKey(seed),
    )
    return graphdef, state


def state_layout(graphdef: nnx.GraphDef, state: TrainState) -> TrainState:
    """The shapes of `state` with each parameter, and each optimizer-state entry shaped
    like the parameters (Adam's moments; Muon's, masked to its part of them), as an
    `nnx.Variable` that carries the parameter's logical axes: what a placement reads to
    lay `state` out (`placement.put(state, like=layout)`, `placement.compile(step, layout)`)."""
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), state)
    _, variables = nnx.split(nnx.merge(graphdef, abstract.params))
    structure = jax.tree.structure(abstract.params)
    each = jax.tree.leaves(variables, is_leaf=lambda v: isinstance(v, nnx.Variable))

    def entries(tree) -> list | None:  # per parameter: its entry or a MaskedNode; else None
        try:
            found = structure.flatten_up_to(tree)
        except (TypeError, ValueError):
            return None
        kinds = (jax.ShapeDtypeStruct, optax.MaskedNode)
        return found if all(isinstance(x, kinds) for x in found) else None

    def as_variables(tree):
        if (found := entries(tree)) is None:
            return tree
        return structure.unflatten(
            x if isinstance(x, optax.MaskedNode) else jax.tree.unflatten(jax.tree.structure(v), [x])
            for v, x in zip(each, found, strict=True)
        )

    opt_state = jax.tree.map(
        as_variables, abstract.opt_state, is_leaf=lambda t: entries(t) is not None
    )
    return abstract.replace(params=variables, opt_state=opt_state)


def model_logits(model: nnx.Module, batch: Batch, *, rng: jax.Array | None) -> jax.Array:
    """Teacher-forced logits [B, T, V] of either model kind; dropout iff rng is given."""
    return _teacher_forced(model, batch, rng, hidden=False)


def model_loss_sums(
    model: nnx.Module, batch: Batch, *, rng: jax.Array | None, label_smoothing: float
) -> LossSums:
    """The teacher-forced `LossSums` of `batch`, through the output head that the model's
    `config.lm_head` picks for this batch (`lm_head_choice`): the dense logits (in the
    compute dtype, read by `cross_entropy` in float32), or `chunked_cross_entropy` of the
    last hidden states."""
    check_batch(model, batch)
    targets, weights = batch["tgt_out"], batch.get("tgt_valid")
    head = lm_head_choice(model.config.lm_head, targets.size, model.config.vocab_size)
    hidden = _teacher_forced(model, batch, rng, hidden=True)
    table, bias = model.output_head()
    if head == "chunked":
        return chunked_cross_entropy(
            hidden, table, bias, targets, weights, label_smoothing=label_smoothing
        )
    logits = tied_logits(hidden, table)
    if bias is not None:
        logits = logits.astype(jnp.float32) + bias[None, None, :]
    return cross_entropy(logits, targets, weights, label_smoothing=label_smoothing)


def _teacher_forced(model: nnx.Module, batch: Batch, rng, *, hidden: bool) -> jax.Array:
    """The logits [B, T, V] of either model kind, or with `hidden` its last hidden states
    [B, T, E]; dropout iff rng is given."""
    check_batch(model, batch)
    kw = dict(deterministic=rng is None, rng=rng)
    if isinstance(model, Transformer):
        fn = model.hidden if hidden else model
        return fn(
            batch["src"], batch["tgt_in"], batch.get("src_valid"), batch.get("tgt_valid"), **kw
        )
    if isinstance(model, DecoderLM):
        fn = model.hidden if hidden else model
        packed = batch.get("segment_ids") is not None  # then tgt_valid is no padding prefix
        return fn(
            batch["tgt_in"],
            None if packed else batch.get("tgt_valid"),
            positions=batch.get("positions"),
            segment_ids=batch.get("segment_ids"),
            **kw,
        )
    raise BadType(f"training needs a Transformer or DecoderLM, got {type(model).__name__}")


REQUIRED_KEYS = {  # src_valid and tgt_valid may be left out: then every token is real
    Transformer: ("src", "tgt_in", "tgt_out"),
    DecoderLM: ("tgt_in", "tgt_out"),
}


def check_batch(model: nnx.Module, batch: Batch) -> None:
    """The batch has the keys `model` needs, token ids as integers and [B, T] targets
    (the model checks its own inputs' shapes)."""
    if not isinstance(batch, Mapping):
        raise BadType(f"batch must be a dict of arrays, got {type(batch).__name__}")
    required = REQUIRED_KEYS.get(type(model), ())
    missing = [k for k in required if k not in batch]
    if missing:
        raise BadValue(
            f"batch is missing {missing}; a {type(model).__name__} batch needs {list(required)}"
        )
    if "tgt_out" in batch:
        out, tgt_in = batch["tgt_out"], batch["tgt_in"]
        if not jnp.issubdtype(out.dtype, jnp.integer):
            raise BadType(f"batch['tgt_out'] must hold integer token ids, got dtype {out.dtype}")
        if out.shape != tgt_in.shape:
            raise BadValue(
                f"batch['tgt_out'] shape {out.shape} != batch['tgt_in'] shape {tgt_in.shape}"
            )


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    label_smoothing: float,
    accum_steps: int = 1,
    internals: bool = False,
    trainable: dict | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """The pure step `(state, batch) -> (state, metrics)`: compile it with
    `jax.jit(step, donate_argnums=0)` or a placement's `compile(..., donate_state=True)`.

    With accum_steps = k the batch (leading size k * b) is cut into k micro-batches whose
    gradients are summed in float32 before one update. With `internals`, metrics["internals"]
    also holds `jaxformer.train.internals`' dynamics. `trainable` (bools like the params):
    the others are constants of the loss, for an optimizer that leaves them out (LoRA)."""
    check_int("accum_steps", accum_steps)
    check_number("label_smoothing", label_smoothing, "[0, 1)")
    forward = _loss_sums_and_activations if internals else _loss_sums_only

    def sums_and_grads(params, batch, rng):
        def loss_sum(params):
            if trainable is not None:
                keep = lambda p, t: p if t else jax.lax.stop_gradient(p)  # noqa: E731
                params = jax.tree.map(keep, params, trainable)
            sums, activations = forward(graphdef, params, batch, rng, label_smoothing)
            return sums.loss, (sums, activations)

        (_, aux), grads = jax.value_and_grad(loss_sum, has_aux=True)(params)
        return aux, grads

    def step(state: TrainState, batch: Batch):
        step_rng = per_replica_key(jax.random.fold_in(state.rng, state.step))
        if accum_steps == 1:
            (sums, activations), grads = sums_and_grads(state.params, batch, step_rng)
        else:
            micro = jax.tree.map(_split_leading(accum_steps), batch)
            micro = jax.tree.map(lambda x: constrain_batch(x, batch_axis=1), micro)

            def add(carry, xs):
                i, mb = xs
                s, g = sums_and_grads(state.params, mb, jax.random.fold_in(step_rng, i))
                return jax.tree.map(jnp.add, carry, (s, g)), None

            first = jax.tree.map(lambda x: x[0], micro)
            zeros = jax.tree.map(
                jnp.zeros_like, jax.eval_shape(sums_and_grads, state.params, first, step_rng)
            )
            ((sums, activations), grads), _ = jax.lax.scan(
                add, zeros, (jnp.arange(accum_steps), micro)
            )
        sums, activations, grads = sum_over_replicas((sums, activations, grads))
        grads = jax.tree.map(lambda g: g / jnp.maximum(sums.tokens, 1.0), grads)
        with jax.named_scope("optimizer"):  # named in profiles (jaxformer bench profile)
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        metrics = sums.means() | {
            "lr": schedule(state.step),
            "grad_norm": optax.tree.norm(grads),
        }
        if internals:
            metrics["internals"] = dynamics(grads, state.params, params, activations)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    return step


def make_eval_step(graphdef: nnx.GraphDef, *, label_smoothing: float):
    """The pure `(params, batch) -> LossSums` without dropout (summed over pmap replicas);
    add the sums over batches."""
    check_number("label_smoothing", label_smoothing, "[0, 1)")

    def evaluate(params: dict, batch: Batch) -> LossSums:
        return sum_over_replicas(_loss_sums(graphdef, params, batch, None, label_smoothing))

    return evaluate


def _loss_sums(graphdef, params, batch, rng, label_smoothing) -> LossSums:
    model = nnx.merge(graphdef, params)
    return model_loss_sums(model, batch, rng=rng, label_smoothing=label_smoothing)


def _loss_sums_only(graphdef, params, batch, rng, label_smoothing):
    return _loss_sums(graphdef, params, batch, rng, label_smoothing), {}


def _loss_sums_and_activations(graphdef, params, batch, rng, label_smoothing):
    """The loss sums and the `activation_sums` of the internals' sites in the same pass."""
    model = nnx.merge(graphdef, params)
    patterns = site_patterns(model.config, batch)
    if not patterns:  # no per-layer sites (scan_layers, remat): the norms alone
        return _loss_sums_only(graphdef, params, batch, rng, label_smoothing)
    with sites.recording(patterns) as rec:
        sums = model_loss_sums(model, batch, rng=rng, label_smoothing=label_smoothing)
    return sums, activation_sums(rec.values, batch)


def _split_leading(k: int) -> Callable[[Any], Any]:
    def split(x):
        if x.shape[0] % k:
            raise BadValue(
                f"batch size {x.shape[0]} is not divisible by {as_given('accum_steps', k)}"
            )
        return x.reshape(k, x.shape[0] // k, *x.shape[1:])

    return split


def lm_head_choice(lm_head: str, tokens: int, vocab_size: int) -> str:
    """The head a step uses, "dense" or "chunked": the one `lm_head` names, or what "auto"
    picks for `tokens` (B * T) rows of `vocab_size` logits."""
    check_choice("lm_head", lm_head, LM_HEADS)
    if lm_head != "auto":
        return lm_head
    return "chunked" if tokens * vocab_size >= auto_chunked_logits() else "dense"


def auto_chunked_logits(device: jax.Device | None = None) -> int:
    """From how many logits B*T*V "auto" picks the chunked head on `device` (default: this
    process's first local one): AUTO_CHUNKED_LOGITS, or a 32nd of the memory it reports."""
    stats = (device or jax.local_devices()[0]).memory_stats() or {}
    return max(AUTO_CHUNKED_LOGITS, stats.get("bytes_limit", 0) // 32)
