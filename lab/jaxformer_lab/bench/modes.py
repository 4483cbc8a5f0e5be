"""The ways the XLA-vs-eager lab runs a workload (workloads.py), each a call that waits for
its output and returns it:

- eager: the pure function f(state, *inputs) = nnx.merge(...)(*inputs), not compiled;
  for the train step also the same step as plain JAX and optax's Adam; disable_jit;
- jit: jax.jit(f) over nnx.split / nnx.merge, the state donated where the call changes it,
  as jaxformer's trainer runs (the train step also without donation, attention also via
  JAX's best kernel); nnx.jit; nnx.jit(graph=False), Flax's tree mode (a module sharing
  Variables, which it refuses, as its split state merged inside); nnx.cached_partial;
- torch: the torch.nn equivalent with the same weights, eager op by op, with torch's
  fused inference fast path off (and on, for the inference workloads); torch.compile in
  modes default, max-autotune and reduce-overhead (CUDA); for the train step the whole
  step compiled as written and as one function of tensors (fullgraph=True).

torch is imported only by the torch modes. Every mode: docs/xla-vs-eager.md, "Modes"."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxformer.checks import BadValue
from jaxformer.nn.parameters import plain
from jaxformer_lab.bench.workloads import LEARNING_RATE, Workload

TREE_JIT = "nnx.jit(graph=False)"  # Flax's tree mode: the module flattened as a pytree
JAX_MODES = ("eager", "disable_jit", "jit", "nnx.jit", TREE_JIT, "nnx.cached_partial")
TORCH_COMPILE_MODES = ("torch.compile max-autotune", "torch.compile reduce-overhead")
# The torch.compile mode each compiled torch mode passes (the others: "default").
_COMPILE_MODE = {"torch.compile max-autotune": "max-autotune"}
_COMPILE_MODE["torch.compile reduce-overhead"] = "reduce-overhead"


def modes_of(w: Workload, device: str | None, compiled: tuple[str, ...] = ()) -> tuple:
    """The modes this workload runs in on this machine: JAX's, and with torch (`device`)
    torch eager (with its fast path, for inference) and the `compiled` torch.compile
    modes this device runs (see `unavailable`)."""
    modes = list(JAX_MODES)
    modes += ["jit, no donation", "eager, functional"] if w.stateful else []
    modes += ["jit, auto attention"] if w.name == "attention" else []
    if device is None:
        return tuple(modes)
    modes += ["torch"] + ([] if w.stateful else ["torch, fast path"])
    return tuple(modes + [m for m in compiled if m not in unavailable(device)])


def unavailable(device: str | None) -> dict[str, str]:
    """Torch modes this device cannot run meaningfully, each with the reason."""
    if device == "cuda":
        return {}
    return {
        "torch.compile reduce-overhead": "CUDA graphs need CUDA tensors; on a CPU torch "
        "skips them and compiles as mode default (not timed twice)"
    }


def pure_function(w: Workload):
    """(f, state): f(state, *inputs) -> output (and the new state where the call changes
    the module), the module's call as a function of its split state."""
    graphdef, state = nnx.split(w.module)

    def f(state, *inputs):
        module = nnx.merge(graphdef, state)
        out = module(*inputs)
        return (out, nnx.state(module)) if w.stateful else out

    return f, state


def functional_step(w: Workload):
    """(step, state) for the train step in plain JAX: step(state, src, tgt_in, tgt_out)
    -> (loss, new state), state = (parameters as nested dicts of arrays, Adam's state);
    the same loss and update as workloads.TrainStep."""
    graphdef, variables = nnx.split(w.module.model)
    params = plain(variables)
    tx = optax.adam(LEARNING_RATE, b1=0.9, b2=0.98, eps=1e-9)

    def step(state, src, tgt_in, tgt_out):
        params, opt_state = state

        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(src, tgt_in)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tgt_out).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, (optax.apply_updates(params, updates), opt_state)

    return step, (params, tx.init(params))


def python_call(w: Workload) -> Callable[[], Any]:
    """The Python that eager and jit-over-split/merge wrap around the module's call, alone:
    nnx.merge of the state (and nnx.state of the result where the call changes it)."""
    graphdef, state = nnx.split(w.module)

    def call():
        module = nnx.merge(graphdef, state)
        return nnx.state(module) if w.stateful else module

    return call


def mode_calls(w: Workload, device: str | None, modes: tuple[str, ...]) -> dict:
    """Mode name -> its call (waits for the output, returns it). Each mode has its own
    copy of the state (torch modes: their own module). Dynamo's caches are emptied first,
    so torch.compile compiles for these shapes alone: a frame it saw at other shapes (an
    earlier workload's) would be recompiled with dynamic shapes."""
    if device is not None and any(m.startswith("torch.compile") for m in modes):
        import torch

        torch.compiler.reset()
    return {mode: mode_call(w, device, mode) for mode in modes}


def mode_call(w: Workload, device: str | None, mode: str) -> Callable[[], Any]:
    """One mode's call (see the module doc)."""
    if mode.startswith("torch"):
        return _torch_mode(w, device, mode)
    f, state = pure_function(w)
    if mode == "eager":
        return _threaded(f, state, w)
    if mode == "eager, functional":
        return _threaded(*functional_step(w), w)
    if mode == "disable_jit":
        return _threaded(f, state, w, jax.disable_jit)
    if mode in ("jit", "jit, no donation"):
        donate = 0 if w.stateful and mode == "jit" else ()
        return _threaded(jax.jit(f, donate_argnums=donate), state, w)
    if mode == "jit, auto attention":
        best = nnx.clone(w.module)
        best.implementation = "auto"
        return _threaded(jax.jit(pure_function(replace(w, module=best))[0]), state, w)
    if mode == TREE_JIT and shares_variables(w.module):  # tree mode refuses aliases
        graphdef, split = nnx.split(nnx.clone(w.module))  # updated in place by the call
        step = nnx.jit(lambda s, *a: nnx.merge(graphdef, s)(*a), graph=False)
        return lambda: jax.block_until_ready(step(split, *w.inputs))
    if mode in ("nnx.jit", TREE_JIT):
        module = nnx.clone(w.module)
        step = nnx.jit(lambda m, *a: m(*a), graph=None if mode == "nnx.jit" else False)
        return lambda: jax.block_until_ready(step(module, *w.inputs))
    if mode == "nnx.cached_partial":
        cached = nnx.cached_partial(nnx.jit(lambda m, *a: m(*a)), nnx.clone(w.module))
        return lambda: jax.block_until_ready(cached(*w.inputs))
    raise BadValue(f"unknown mode {mode!r}")


def shares_variables(module: nnx.Module) -> bool:
    """Whether one Variable sits at two places in the module (tied embeddings): tree mode
    takes such a module only as its split state, merged inside."""
    leaves = jax.tree.leaves(module, is_leaf=lambda v: isinstance(v, nnx.Variable))
    return len({id(v) for v in leaves}) < len(leaves)


def _threaded(f, state, w: Workload, context=contextlib.nullcontext):
    box = [jax.tree.map(jnp.copy, state)]

    def call():
        with context():
            out = f(box[0], *w.inputs)
            if w.stateful:
                out, box[0] = out
            return jax.block_until_ready(out)

    return call


def _torch_mode(w: Workload, device: str, mode: str) -> Callable[[], Any]:
    import torch

    module, inputs, call = w.torch(device)
    fast = mode == "torch, fast path"
    if mode in ("torch", "torch, fast path"):
        return _torch_call(module, inputs, call, device, fast)
    if mode in ("torch.compile", *TORCH_COMPILE_MODES):
        compiled = torch.compile(module, mode=_COMPILE_MODE.get(mode, "default"))
        return _torch_call(compiled, inputs, call, device)
    if mode == "torch.compile step":
        return _torch_call(module, inputs, torch.compile(call), device)
    if mode == "torch.compile functional step":
        step, state = torch_functional_step(w, module)
        return _torch_threaded(torch.compile(step, fullgraph=True), state, inputs, device)
    raise BadValue(f"unknown mode {mode!r}")


def _torch_call(module, inputs, call, device, fast_path: bool = False):
    import torch

    def run():
        before = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(fast_path)
        try:
            out = call(module, *inputs)
        finally:
            torch.backends.mha.set_fastpath_enabled(before)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    return run


def _torch_threaded(step, state, inputs, device):
    import torch

    box = [state]

    def run():
        loss, box[0] = step(box[0], *inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        return loss.detach()

    return run


def torch_functional_step(w: Workload, module):
    """(step, state): the torch train step as one function of tensors, step(state, src,
    tgt_in, tgt_out) -> (loss, new state), state = (parameters, Adam's m, v, step count):
    torch.func.grad_and_value over torch.func.functional_call and Adam written out (the
    update of torch.optim.Adam and optax.adam), so dynamo can capture it whole."""
    import torch

    params = {k: v.detach().clone() for k, v in module.named_parameters()}
    buffers = dict(module.named_buffers())
    vocab, b1, b2, eps = w.config.vocab_size, 0.9, 0.98, 1e-9
    autocast = w.config.dtype == "bfloat16"

    def step(state, src, tgt_in, tgt_out):
        params, m, v, t = state

        def loss_of(p):
            with torch.autocast(src.device.type, torch.bfloat16, enabled=autocast):
                logits = torch.func.functional_call(module, (p, buffers), (src, tgt_in))
            flat = logits.float().reshape(-1, vocab)
            return torch.nn.functional.cross_entropy(flat, tgt_out.reshape(-1).long())

        grads, loss = torch.func.grad_and_value(loss_of)(params)
        t = t + 1
        m = {k: b1 * m[k] + (1 - b1) * g for k, g in grads.items()}
        v = {k: b2 * v[k] + (1 - b2) * g * g for k, g in grads.items()}
        fix1, fix2 = 1 - b1**t, 1 - b2**t
        new = {
            k: p - LEARNING_RATE * (m[k] / fix1) / ((v[k] / fix2).sqrt() + eps)
            for k, p in params.items()
        }
        return loss.detach(), (new, m, v, t)

    zeros = {k: torch.zeros_like(p) for k, p in params.items()}
    t0 = torch.zeros((), device=next(iter(params.values())).device)
    return step, (params, zeros, dict(zeros), t0)


def agreement(first: dict[str, list], tolerance: float) -> dict:
    """Per mode, the max abs difference of its first outputs from jit's, relative to the
    largest of jit's, and whether it is within `tolerance`."""
    ref = [np.asarray(o, np.float64) for o in first["jit"]]
    scale = max(float(np.abs(r).max()) for r in ref) or 1.0
    out = {}
    for mode, outputs in first.items():
        diff = max(
            float(np.abs(np.asarray(to_numpy(o), np.float64) - r).max())
            for o, r in zip(outputs, ref, strict=True)
        )
        out[mode] = {"max_abs_diff": diff, "agrees": diff <= tolerance * scale}
    return out


def to_numpy(x):
    """A JAX array or torch tensor as a float32 NumPy array."""
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, np.float32)


def torch_ops(call: Callable[[], Any]) -> collections.Counter:
    """The aten operators one call of a torch mode ran, counted by name (torch's
    dispatches: an op-by-op call shows each op; the fused fast path shows
    _native_multi_head_attention, _transformer_encoder_layer_fwd). Read through a
    TorchDispatchMode, which sees every operator torch dispatches, without starting
    torch's profiler (whose kineto library prints `USDT:` lines)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    with Record() as record:
        call()
    return record.ops


ATTENTION_WORDS = ("attention", "multi_head", "transformer_encoder", "scaled_dot_product")


def attention_ops(ops: collections.Counter) -> list[str]:
    """The attention-related aten operators among `ops`."""
    return sorted(k for k in ops if any(word in k for word in ATTENTION_WORDS))


def torch_graphs(w: Workload, device: str, modes: tuple[str, ...]) -> dict:
    """Per compiled torch mode that ran: dynamo's graphs and graph breaks (with the first
    break reasons) over one call, from torch._dynamo.explain (which traces without
    compiling); run after the timing, as explain resets dynamo's caches."""
    import torch

    out = {}
    for mode in (m for m in modes if m.startswith("torch.compile")):
        module, inputs, call = w.torch(device)
        if mode == "torch.compile functional step":
            step, state = torch_functional_step(w, module)
            fn, args = step, (state, *inputs)
        elif mode == "torch.compile step":
            fn, args = call, (module, *inputs)
        else:
            fn, args = (lambda *a, m=module, c=call: c(m, *a)), inputs
        try:
            ex = torch._dynamo.explain(fn)(*args)
        except Exception as e:  # a mode explain cannot trace: say why
            out[mode] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            continue
        reasons = [str(b.reason).splitlines()[0][:160] for b in ex.break_reasons[:3]]
        out[mode] = {"graphs": ex.graph_count, "breaks": ex.graph_break_count, "reasons": reasons}
    torch.compiler.reset()
    return out
