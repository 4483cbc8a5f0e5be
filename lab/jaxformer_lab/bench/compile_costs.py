"""What compiling costs: the train step's trace + lower and compile seconds against depth and
width with JAX's persistent compilation cache off, cold (empty: compiles and writes) and
warm (reads what the cold compile wrote); and a variable-length workload that counts the
recompilations of jax.jit and torch.compile (static and dynamic shapes), why JAX compiled
again (its jax_explain_cache_misses reasons), and what padding to buckets or to the longest
batch costs instead."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental.compilation_cache import compilation_cache

from jaxformer import nn
from jaxformer.checks import BadValue
from jaxformer.functional.masks import length_mask
from jaxformer_lab.bench import modes, stats
from jaxformer_lab.bench.workloads import bench_config, build

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # one per XLA compilation
MISS = "TRACING CACHE MISS"  # how jax_explain_cache_misses opens each log record


@contextlib.contextmanager
def explained_misses():
    """JAX's tracing-cache misses while open, as {"function", "reason"} dicts (the
    jax_explain_cache_misses option on, its log records read from the "jax" logger and
    kept from the root's); the option and the logger restored on exit."""
    misses: list[dict] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if text.startswith(MISS):
                misses.append(miss_reason(text))

    logger, handler = logging.getLogger("jax"), Handler(logging.DEBUG)
    before, propagate = jax.config.jax_explain_cache_misses, logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    jax.config.update("jax_explain_cache_misses", True)
    try:
        yield misses
    finally:
        jax.config.update("jax_explain_cache_misses", before)
        logger.removeHandler(handler)
        logger.propagate = propagate


def miss_reason(text: str) -> dict:
    """The function and the essential clause of one explained miss: "never seen function",
    or what differs from the closest key seen before (e.g. "different input types: at x,
    now f32[2,4] and before f32[2,3]"), JAX's location lines dropped."""
    lines = [line.strip().removeprefix("* ") for line in text.splitlines()[1:]]
    lines = [line for line in lines if line]
    if lines and lines[0].startswith("never seen function"):
        name = lines[1].split()[0] if len(lines) > 1 else "?"
        return {"function": name, "reason": "never seen function"}
    name = lines[0].split()[1] if lines and lines[0].startswith("for ") else "?"
    keep = [line for line in lines if not line.startswith(("for ", "all previously seen"))]
    return {"function": name, "reason": " ".join(keep)[:240]}


class CompileCounter:
    """Counts XLA compilations while open (jax.monitoring's backend-compile event)."""

    def __init__(self):
        self.count = 0

    def _listen(self, event: str, seconds: float, **_) -> None:
        if event == COMPILE_EVENT:
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listen)


@contextlib.contextmanager
def persistent_cache(folder: str | None):
    """JAX's persistent compilation cache in `folder` (every program written: minimum
    compile time 0), or off with None; the in-memory caches cleared on entry and exit,
    and the cache's settings (folder included) restored on exit."""
    names = (
        "jax_enable_compilation_cache",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_compilation_cache_dir",
    )
    before = {name: getattr(jax.config, name) for name in names}
    jax.clear_caches()
    compilation_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", folder is not None)
    if folder is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        compilation_cache.set_cache_dir(folder)
    try:
        yield
    finally:
        jax.clear_caches()
        compilation_cache.reset_cache()
        for name, value in before.items():
            jax.config.update(name, value)


def _compile_once(f, args) -> tuple[float, float]:
    """Seconds of jax.jit(f).lower(*args) (trace + lower) and of .compile(), after clearing
    JAX's in-memory caches."""
    jax.clear_caches()
    t0 = time.perf_counter()
    lowered = jax.jit(f, donate_argnums=0).lower(*args)
    t1 = time.perf_counter()
    lowered.compile()
    return t1 - t0, time.perf_counter() - t1


def compile_times(
    points: list[dict], repeats: int, dtype: str, caches: tuple[str, ...] = ("off", "cold", "warm")
) -> list[dict]:
    """Per point (d_model, layers, batch, length) of the train step: `repeats` samples of
    trace + lower seconds and of compile seconds with the persistent cache in each of
    `caches`: "off", "cold" (a new empty folder each repeat), "warm" (after the cold
    compile; needs "cold"), as best_median_ci with the samples."""
    if "warm" in caches and "cold" not in caches:
        raise BadValue(f"a warm cache is the cold compile's: caches {caches} lack 'cold'")
    rows = []
    for p in points:
        w = build("train_step", bench_config(p["d_model"], p["layers"], dtype=dtype), **_bl(p))
        f, state = modes.pure_function(w)
        args = (state, *w.inputs)
        samples = {"trace + lower": []} | {COMPILE_KEYS[c]: [] for c in caches}
        for _ in range(repeats):
            seconds = _compile_repeat(f, args, caches)
            for key, value in seconds.items():
                samples[key].append(value)
        times = {k: stats.best_median_ci(v) | {"samples": v} for k, v in samples.items()}
        rows.append(p | {"times_s": times})
    return rows


def _compile_repeat(f, args, caches: tuple[str, ...]) -> dict[str, float]:
    """One repeat of compile_times: {"trace + lower": s, COMPILE_KEYS[cache]: s, ...}."""
    seconds = {}
    if "off" in caches:
        with persistent_cache(None):
            seconds["trace + lower"], seconds[COMPILE_KEYS["off"]] = _compile_once(f, args)
    if "cold" in caches:
        with tempfile.TemporaryDirectory() as folder, persistent_cache(folder):
            lower, seconds[COMPILE_KEYS["cold"]] = _compile_once(f, args)
            seconds.setdefault("trace + lower", lower)
            if "warm" in caches:
                seconds[COMPILE_KEYS["warm"]] = _compile_once(f, args)[1]
    return seconds


COMPILE_KEYS = {
    "off": "compile, cache off",
    "cold": "compile, cold cache",
    "warm": "compile, warm cache",
}


def _bl(p: dict) -> dict:
    return {"batch": p["batch"], "length": p["length"]}


def bucket(length: int, smallest: int = 8) -> int:
    """The bucket a length is padded to: the next power of two, at least `smallest`."""
    return max(smallest, 1 << (length - 1).bit_length())


def variable_lengths(
    d_model: int, batch: int, lengths: list[int], repeats: int, rounds: int, device
) -> dict:
    """One encoder layer over a sequence of batches of `lengths` tokens (right-padded rows
    masked by their lengths), in each strategy of `_strategies`: the compilations its first
    pass made, that pass's seconds (compiling included; `repeats` passes, each from empty
    in-memory caches, the persistent cache off), and a warm pass's seconds over `rounds`
    interleaved rounds with paired ratios against the exact-shape runs (the padding's
    cost). Padded tokens: the share of the tokens run that are padding. Each JAX
    strategy's "reasons": why each batch of one more pass from empty caches missed JAX's
    tracing cache (`explained_misses`), with the batch's length."""
    config = bench_config(d_model, 1)
    layer = nn.EncoderLayer(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, max(lengths), d_model)).astype(np.float32)
    strategies, explainers = _strategies(layer, x, lengths, device)
    first, kept = {}, {}
    with persistent_cache(None), _torch_compile_settings(device):
        for name, make in strategies.items():
            samples, counts = [], []
            for _ in range(repeats):
                run, compiled = make()
                t0 = time.perf_counter()
                counts.append(compiled(run))
                samples.append(time.perf_counter() - t0)
            kept[name] = run
            first[name] = {"compiles": counts, "first_pass_s": stats.best_median_ci(samples)}
        times = stats.time_interleaved(kept, rounds, warmup=1)
        for name, explain in explainers.items():  # untimed: explaining slows tracing
            first[name]["reasons"] = explain()
    steady = {name: stats.median_ci(t) for name, t in times.items()}
    ratios = {
        f"{name} / {base}": stats.paired_ratio(times[name], times[base])
        for name, base in _PADDING_PAIRS
        if name in times
    }
    return {
        "lengths": lengths,
        "batch": batch,
        "d_model": d_model,
        "padded_share": {name: _padded_share(lengths, name) for name in strategies},
        "first": first,
        "steady_s": steady,
        "times": times,
        "ratios": ratios,
    }


# (padded strategy, the exact-shape one it is compared with) for the padding's cost.
_PADDING_PAIRS = (
    ("jit, buckets", "jit, exact shapes"),
    ("jit, pad to longest", "jit, exact shapes"),
    ("torch.compile, buckets", "torch.compile, static shapes"),
    ("torch.compile, dynamic shapes", "torch.compile, static shapes"),
    ("torch.compile, dynamic shapes", "torch"),
)


TORCH_STRATEGIES = (
    "torch",
    "torch.compile, static shapes",
    "torch.compile, dynamic shapes",
    "torch.compile, buckets",
)


def _padded_share(lengths: list[int], strategy: str) -> float:
    run = [_padded_length(n, strategy, max(lengths)) for n in lengths]
    return 1 - sum(lengths) / sum(run)


def _padded_length(n: int, strategy: str, longest: int) -> int:
    if strategy.endswith("buckets"):
        return bucket(n)
    return longest if strategy.endswith("pad to longest") else n


def _strategies(layer, x: np.ndarray, lengths: list[int], device) -> tuple[dict, dict]:
    """(name -> make(): (run, compiled), run() one pass over the batches and compiled(run)
    the compilations that pass makes (running it); JAX's names -> explain(), the reasons
    of a pass's tracing-cache misses)."""
    graphdef, state = nnx.split(layer)

    def f(state, x, n):
        mask = length_mask(n, x.shape[1])
        return nnx.merge(graphdef, state)(x, mask)

    names = ("jit, exact shapes", "jit, buckets", "jit, pad to longest")
    out = {name: _jax_strategy(f, state, _jax_batches(x, lengths, name)) for name in names}
    explainers = {name: _explainer(f, state, x, lengths, name) for name in names}
    if device is not None:
        for name in TORCH_STRATEGIES:
            out[name] = _torch_strategy(layer, x, lengths, name, device)
    return out, explainers


def _jax_batches(x: np.ndarray, lengths: list[int], name: str) -> list:
    longest = max(lengths)
    return [
        (jnp.asarray(_pad(x[:, :n], _padded_length(n, name, longest))), jnp.full(len(x), n))
        for n in lengths
    ]


def _explainer(f, state, x, lengths, name):
    def explain() -> list[dict]:
        jax.clear_caches()
        jitted, out = jax.jit(f), []
        with explained_misses() as misses:
            for n, (xb, nb) in zip(lengths, _jax_batches(x, lengths, name), strict=True):
                seen = len(misses)
                jax.block_until_ready(jitted(state, xb, nb))
                out += [{"length": n} | m for m in misses[seen:] if m["function"] == "f"]
        return out

    return explain


def _jax_strategy(f, state, batches):
    def make():
        jax.clear_caches()
        jitted = jax.jit(f)

        def run():
            for xb, n in batches:
                out = jitted(state, xb, n)
            return jax.block_until_ready(out)

        def compiled(run):
            with CompileCounter() as counter:
                run()
            return counter.count

        return run, compiled

    return make


def _pad(x: np.ndarray, T: int) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, T - x.shape[1]), (0, 0)))


def _torch_strategy(layer, x, lengths, name, device):
    import torch

    from jaxformer.interop.torch import to_torch

    base = to_torch(layer).to(device).eval()
    longest = max(lengths)
    batches = []
    for n in lengths:
        T = _padded_length(n, name, longest)
        pad = torch.arange(T, device=device)[None, :] >= n  # True = padding
        xb = torch.from_numpy(_pad(x[:, :n], T)).to(device)
        batches.append((xb, pad.expand(len(x), T).contiguous()))

    def make():
        forward = _own_code(_layer_call)
        if name != "torch":
            forward = torch.compile(forward, dynamic=name.endswith("dynamic shapes"))

        def run():
            with torch.inference_mode():
                for xb, pad in batches:
                    out = forward(base, xb, pad)
            if device == "cuda":
                torch.cuda.synchronize()
            return out

        def compiled(run):
            before = _torch_graphs()
            run()
            return _torch_graphs() - before

        return run, compiled

    return make


def _layer_call(layer, x, pad):
    return layer(x, src_key_padding_mask=pad)


def _own_code(fn):
    """A copy of `fn` with a code object of its own: dynamo keeps its compiled graphs,
    and what it learnt about shapes, per code object, so each copy compiles alone."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


def _torch_graphs() -> int:
    """Graphs dynamo has compiled so far in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@contextlib.contextmanager
def _torch_compile_settings(device):
    """With torch: dynamo may recompile a frame more than 8 times (a static-shape strategy
    compiles each length), Inductor's FX graph and autograd caches off (each repeat
    compiles again); the fast path off (op by op, as the lab's torch mode)."""
    if device is None:
        yield
        return
    import torch

    fast = torch.backends.mha.get_fastpath_enabled()
    torch.compiler.reset()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with (
            torch._dynamo.config.patch(recompile_limit=1024, accumulated_recompile_limit=4096),
            torch._inductor.config.patch(fx_graph_cache=False),
            torch._functorch.config.patch(enable_autograd_cache=False),
        ):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)
        torch.compiler.reset()
