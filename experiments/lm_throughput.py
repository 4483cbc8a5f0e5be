"""Training throughput and MFU of a GPT-2-small-shaped decoder-only language model.

    python experiments/lm_throughput.py [--quick] [--batch 16] [--remat none|dots|full]
                                        [--scan] [--xla-flags "..."] [--steps 20]
                                        [--attention auto] [--lm-head auto|dense|chunked]
                                        [--layers 12] [--context 1024] [--memory-only]

The model: `TransformerConfig.gpt2_small()`, 12 layers, d_model 768, 12 heads, d_ff 3072,
context 1024, vocabulary 50304, pre-LN, learned positions, tied output (124M parameters);
bfloat16 compute with float32
parameters and AdamW state; one jitted step with donated state. --quick is a small model
(2 layers, d_model 128, context 128, vocabulary 1024) that runs on a CPU in seconds.

FLOPs per token = 6 N (N = every parameter: the tied embedding is used as the output
projection's matrix; the position table's lookups, counted in N, are free) plus attention
12 L T d_model for Q K^T and P V forward and backward, halved because causal attention
needs only the lower triangle: 6 L T d_model. MFU = FLOPs per step / step time / the
device's dense bf16 peak (PEAK_TFLOPS by device kind; on a CPU, or an unknown device, the
MFU is null and only TFLOP/s are given). --xla-flags sets XLA_FLAGS before JAX starts, to
compare flags side by side. --attention and --lm-head set the config's attention_impl and
lm_head; --layers and --context shrink the model. Every run reports XLA's
`memory_analysis()` of the compiled step (temp_bytes: the step's temporaries);
--memory-only compiles and reports that alone, without running a step (for CPUs: no
timing). Prints a final JSON line; writes results/lm_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

# Dense bfloat16 peak TFLOP/s by device kind (vendor data sheets; SXM parts), matched by
# the first key contained in jax's device_kind.
PEAK_TFLOPS = {
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "H200": 989.0,
    "GH200": 989.0,
    "A100": 312.0,
    "L4": 121.0,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,
    "TPU v5p": 459.0,
}
FULL = dict(layers=12, d_model=768, heads=12, d_ff=3072, context=1024, vocab=50304, batch=16)
QUICK = dict(layers=2, d_model=128, heads=4, d_ff=512, context=128, vocab=1024, batch=8)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small model, for CPUs and tests")
    p.add_argument("--batch", type=int, help="sequences per step (default 16; quick 8)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--remat", choices=("none", "dots", "full"), default="none")
    p.add_argument("--scan", action="store_true", help="scan over layers")
    p.add_argument("--xla-flags", default=None, help="XLA_FLAGS for this run")
    p.add_argument("--attention", default="auto", help="attention_impl (default auto)")
    p.add_argument("--lm-head", default="auto", choices=("auto", "dense", "chunked"))
    p.add_argument("--layers", type=int, help="decoder layers (default 12; quick 2)")
    p.add_argument("--context", type=int, help="tokens per sequence (default 1024; quick 128)")
    p.add_argument("--memory-only", action="store_true", help="compile, report memory, no steps")
    p.add_argument("--out", default="results")
    args = p.parse_args(argv)
    for name in ("batch", "steps", "layers", "context"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def peak_tflops(device_kind: str) -> float | None:
    return next((v for k, v in PEAK_TFLOPS.items() if k in device_kind), None)


def flops_per_token(n_params: int, layers: int, context: int, d_model: int) -> float:
    """6 N + causal attention's 6 L T d_model (see the module docstring)."""
    return 6 * n_params + 6 * layers * context * d_model


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.xla_flags is not None:
        os.environ["XLA_FLAGS"] = args.xla_flags
    import jax

    s = sizes(args)
    step, state, batch, n_params = setup(s, args)
    t0 = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    memory = compiled.memory_analysis()
    device = jax.devices()[0].device_kind
    result = dict(
        device=device,
        jax=jax.__version__,
        params=n_params,
        **{k: s[k] for k in s},
        remat=args.remat,
        scan=args.scan,
        attention=args.attention,
        lm_head=args.lm_head,
        resolved=resolved(s, args.attention, args.lm_head),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        compile_seconds=round(compile_s, 2),
        temp_bytes=None if memory is None else int(memory.temp_size_in_bytes),
    )
    if not args.memory_only:
        result |= _timed(compiled, state, batch, args.steps, n_params, s, device)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lm_throughput.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result


def resolved(s: dict, attention: str, lm_head: str) -> dict:
    """What "auto" picks for the model of sizes `s` on this device: the attention kernel
    of its causal, unpadded self-attention in bfloat16, and the LM head."""
    import jax
    import jax.numpy as jnp

    from jaxformer.functional.attention import choose_implementation
    from jaxformer.train.losses import lm_head_choice

    B, T, H = s["batch"], s["context"], s["heads"]
    q = jax.ShapeDtypeStruct((B, T, H, s["d_model"] // H), jnp.bfloat16)
    if attention == "auto":
        attention = choose_implementation(q, q, q, masked=True, padded=False, dropout_rate=0.0)
    return dict(attention=attention, lm_head=lm_head_choice(lm_head, B * T, s["vocab"]))


def sizes(args) -> dict:
    """The model and batch sizes of `args`: FULL or QUICK with --batch, --layers, --context."""
    s = dict(QUICK if args.quick else FULL)
    for name in ("batch", "layers", "context"):
        s[name] = getattr(args, name) or s[name]
    return s


def setup(s: dict, args):
    """(jitted step with donated state, state, batch, parameter count) of the model of sizes
    `s` (FULL or QUICK with overrides) and the options in `args` (parse_args)."""
    import jax
    import numpy as np
    import optax
    from flax import nnx

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    import jaxformer as jf
    from jaxformer import train

    config = jf.TransformerConfig.gpt2_small(
        s["vocab"],
        num_decoder_layers=s["layers"],
        d_model=s["d_model"],
        d_ff=s["d_ff"],
        num_heads=s["heads"],
        max_len=s["context"],
        remat=args.remat,
        scan_layers=args.scan,
        attention_impl=args.attention,
        lm_head=args.lm_head,
    )
    model = jf.DecoderLM(config, rngs=nnx.Rngs(0))
    n_params = jf.count_params(model)
    schedule = optax.constant_schedule(1e-4)
    optimizer = train.make_optimizer(schedule, name="adamw", b2=0.95, eps=1e-8, weight_decay=0.1)
    graphdef, state = train.create_train_state(model, optimizer, seed=0)
    step = jax.jit(
        train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.0), donate_argnums=0
    )
    B, T = s["batch"], s["context"]
    tokens = np.random.default_rng(0).integers(0, s["vocab"], (B, T + 1), dtype=np.int32)
    batch = jax.device_put(
        {"tgt_in": tokens[:, :-1], "tgt_out": tokens[:, 1:]}  # no padding: no tgt_valid
    )
    return step, state, batch, n_params


def _timed(compiled, state, batch, steps: int, n_params: int, s: dict, device: str) -> dict:
    """The median step time of `steps` steps after a first one, and what follows from it."""
    import jax

    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    B, T = s["batch"], s["context"]
    flops = flops_per_token(n_params, s["layers"], T, s["d_model"]) * B * T
    peak = peak_tflops(device)
    return dict(
        step_ms=round(step_s * 1e3, 2),
        tokens_per_second=round(B * T / step_s, 1),
        tflops=round(flops / step_s / 1e12, 3),
        peak_tflops=peak,
        mfu=None if peak is None else round(flops / step_s / 1e12 / peak, 4),
        loss=float(metrics["loss"]),
    )


if __name__ == "__main__":
    main()
