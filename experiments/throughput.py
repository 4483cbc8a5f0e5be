"""Training-step throughput of jaxformer against `torch.nn.Transformer`, side by side.

The same model on both sides (d_model 256, 4 heads, 2 + 2 post-LN layers, d_ff 1024,
ReLU, dropout 0.1, vocabulary 1000 with one matrix for source and target embeddings and
the output projection, sinusoidal positions, label smoothing 0.1, Adam(0.9, 0.98, 1e-9)),
batch 32 with source and target length 64. One round times a few jaxformer float32 steps,
a few torch (eager, float32) steps, a few jaxformer bfloat16-compute steps, and a large
float32 matrix multiply (the machine's GEMM peak); rounds alternate, so a busy machine
slows all of them alike and the ratios stay meaningful. Medians over rounds. On an NVIDIA
GPU both run there, float32 products in TF32 on both sides (JAX's default precision there;
torch's "high").

Model FLOPs per step are counted analytically (2 per multiply-add of every matrix product
in the forward pass, times 3 for forward + backward) and read from XLA's `cost_analysis`
of the compiled step; MFU = analytic FLOPs / step time / measured GEMM peak.

With `--loss-steps N` (default 300; 100 with --quick) it also trains float32 and bfloat16
from the same initialisation on the same `dates` batches (cosine schedule to 1e-3) and
compares the mean loss of the last fifth of the steps.

    python experiments/throughput.py [--quick]

Prints a final JSON line with ratio_vs_torch, mfu, bf16_ratio_vs_torch; writes
results/throughput.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jaxformer as jf  # noqa: E402
from jaxformer import data, train  # noqa: E402

SIZES = dict(V=1000, E=256, H=4, F=1024, layers=2, B=32, S=64, T=64)
LR = 1e-4
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # what a CPU's matmuls hang on
PEAK_N = 2048  # the GEMM that measures the machine's float32 peak: [N, N] @ [N, N]


def analytic_train_flops(V, E, H, F, layers, B, S, T) -> int:
    """Matrix-multiply FLOPs of one training step (forward x 3), embedding lookups excluded."""
    attn_proj = 4 * E * E  # W^Q, W^K, W^V, W^O per token (d_k * H = E)
    ffn = 2 * E * F
    enc = layers * B * S * (attn_proj + ffn + 2 * S * E)  # + Q K^T and P V
    dec_self = B * T * (attn_proj + 2 * T * E)
    dec_cross = B * T * 2 * E * E + B * S * 2 * E * E + B * T * 2 * S * E  # Q, O; K, V; QK, PV
    dec = layers * (dec_self + dec_cross + B * T * ffn)
    logits = B * T * E * V
    return 3 * 2 * (enc + dec + logits)


def jax_config(dtype: str) -> jf.TransformerConfig:
    s = SIZES
    return jf.TransformerConfig(
        vocab_size=s["V"],
        num_encoder_layers=s["layers"],
        num_decoder_layers=s["layers"],
        d_model=s["E"],
        d_ff=s["F"],
        num_heads=s["H"],
        dropout_rate=0.1,
        label_smoothing=0.1,
        max_len=128,
        dtype=dtype,
    )


def jax_setup(dtype: str, seed: int = 0):
    config = jax_config(dtype)
    model = jf.Transformer(config, rngs=nnx.Rngs(seed))
    schedule = optax.constant_schedule(LR)
    optimizer = train.make_optimizer(schedule)
    graphdef, state = train.create_train_state(model, optimizer, seed=seed)
    step = train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1)
    return state, jax.jit(step, donate_argnums=0)


def random_batch(rng: np.random.Generator):
    s = SIZES
    return {
        "src": rng.integers(3, s["V"], (s["B"], s["S"]), dtype=np.int32),
        "src_valid": np.ones((s["B"], s["S"]), bool),
        "tgt_in": rng.integers(3, s["V"], (s["B"], s["T"]), dtype=np.int32),
        "tgt_out": rng.integers(3, s["V"], (s["B"], s["T"]), dtype=np.int32),
        "tgt_valid": np.ones((s["B"], s["T"]), bool),
    }


def torch_setup(seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    s = SIZES
    # The device JAX runs on: an NVIDIA GPU, with TF32 float32 products as JAX's default
    # precision there uses, or the CPU.
    device = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"
    torch.set_float32_matmul_precision("high" if device == "cuda" else "highest")

    class TorchTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(s["V"], s["E"])
            nn.init.normal_(self.embed.weight, std=s["E"] ** -0.5)
            self.core = nn.Transformer(
                s["E"], s["H"], s["layers"], s["layers"], s["F"], dropout=0.1, batch_first=True
            )
            pos = np.array(jf.functional.sinusoidal_positions(128, s["E"]))  # a writable copy
            self.register_buffer("positions", torch.from_numpy(pos))
            self.dropout = nn.Dropout(0.1)

        def inputs(self, tokens):
            x = self.embed(tokens) * math.sqrt(s["E"]) + self.positions[: tokens.shape[1]]
            return self.dropout(x)

        def forward(self, src, tgt):
            causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=device)
            h = self.core(self.inputs(src), self.inputs(tgt), tgt_mask=causal, tgt_is_causal=True)
            return h @ self.embed.weight.T  # tied output projection

    model = TorchTransformer().to(device)
    optimizer = torch.optim.Adam(model.parameters(), LR, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)

    def step(batch):
        src, tgt_in, tgt_out = (
            torch.from_numpy(batch[k]).long().to(device) for k in ("src", "tgt_in", "tgt_out")
        )
        optimizer.zero_grad(set_to_none=True)
        logits = model(src, tgt_in)
        loss = loss_fn(logits.reshape(-1, s["V"]), tgt_out.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.item()

    return step, torch


def time_calls(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def gemm_peak_sampler():
    a = jnp.asarray(np.random.default_rng(0).standard_normal((PEAK_N, PEAK_N)), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    matmul(a, a).block_until_ready()
    return lambda: matmul(a, a).block_until_ready()


def loss_curves(steps: int) -> dict:
    """Train float32 and bfloat16 from the same init on the same `dates` batches."""
    tok = data.ByteTokenizer()
    task = data.TaskData("dates", tok, seed=0, dev_size=10)
    curves = {}
    for dtype in ("float32", "bfloat16"):
        config = jax_config(dtype).replace(vocab_size=tok.vocab_size)
        model = jf.Transformer(config, rngs=nnx.Rngs(0))
        schedule = train.make_schedule(
            "cosine", lr=1e-3, warmup_steps=max(1, steps // 10), total_steps=steps
        )
        optimizer = train.make_optimizer(schedule)
        graphdef, state = train.create_train_state(model, optimizer, seed=0)
        step = jax.jit(train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1))
        losses = []
        for i in range(steps):
            state, metrics = step(state, task.train_batch(i, SIZES["B"]))
            losses.append(float(metrics["loss"]))
        curves[dtype] = losses
    window = max(1, steps // 5)  # the last fifth: averages out batch-to-batch noise
    f32, bf16 = (statistics.fmean(curves[d][-window:]) for d in ("float32", "bfloat16"))
    return {
        "task": "dates",
        "steps": steps,
        "schedule": "cosine, peak 1e-3, warmup steps / 10",
        "mean_of_last_steps": window,
        "final_loss_float32": f32,
        "final_loss_bfloat16": bf16,
        "relative_difference": abs(bf16 - f32) / f32,
        "curves": curves,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (about a minute)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds")
    parser.add_argument("--steps-per-round", type=int, default=3)
    parser.add_argument("--loss-steps", type=int, default=None, help="0 skips the loss check")
    parser.add_argument("--out", default="results/throughput.json")
    args = parser.parse_args(argv)
    rounds = args.rounds or (4 if args.quick else 10)
    loss_steps = args.loss_steps if args.loss_steps is not None else (100 if args.quick else 300)
    s = SIZES
    tokens = s["B"] * s["T"]  # target tokens per step, as usually quoted
    flops = analytic_train_flops(**s)

    batch_np = random_batch(np.random.default_rng(0))
    batch = {k: jnp.asarray(v) for k, v in batch_np.items()}
    runners, compiled_info = {}, {}
    for dtype in ("float32", "bfloat16"):
        state, step = jax_setup(dtype)
        compiled = step.lower(state, batch).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list | tuple) else cost
        mem = compiled.memory_analysis()
        compiled_info[dtype] = {
            "xla_flops": float(cost.get("flops", float("nan"))),
            "temp_bytes": int(mem.temp_size_in_bytes),
            "argument_bytes": int(mem.argument_size_in_bytes),
        }
        holder = {"state": state}

        def run(step=step, holder=holder):
            holder["state"], metrics = step(holder["state"], batch)
            jax.block_until_ready(metrics["loss"])

        for _ in range(2):
            run()
        runners[f"jax_{dtype}"] = run
    torch_step, torch = torch_setup()
    runners["torch_float32"] = lambda: torch_step(batch_np)
    for _ in range(2):
        runners["torch_float32"]()
    peak = gemm_peak_sampler()

    times = {name: [] for name in runners}
    peak_samples = []
    for _ in range(rounds):
        for name, run in runners.items():
            times[name] += time_calls(run, args.steps_per_round)
        peak_samples += [2 * PEAK_N**3 / t for t in time_calls(peak, 5)]
    step_s = {name: statistics.median(ts) for name, ts in times.items()}
    peak_flops = statistics.median(peak_samples)

    def entry(name):
        t = step_s[name]
        spread = statistics.quantiles(times[name], n=4) if len(times[name]) > 1 else [t, t, t]
        return {
            "ms_per_step": 1e3 * t,
            "ms_best": 1e3 * min(times[name]),
            "ms_quartiles": [1e3 * spread[0], 1e3 * spread[2]],
            "tokens_per_s": tokens / t,
            "model_tflops_per_s": flops / t / 1e12,
            "mfu": flops / t / peak_flops,
        }

    results = {
        "config": s | {"dropout": 0.1, "optimizer": "Adam(0.9, 0.98, 1e-9)"},
        "analytic_flops_per_step": flops,
        "xla": compiled_info,
        "gemm_peak_gflops_median": peak_flops / 1e9,
        "gemm_peak_gflops_best": max(peak_samples) / 1e9,
        "runs": {name: entry(name) for name in runners},
        "rounds": rounds,
        "steps_per_round": args.steps_per_round,
        "machine": machine_info(torch),
    }
    ratio = step_s["torch_float32"] / step_s["jax_float32"]
    bf16_ratio = step_s["torch_float32"] / step_s["jax_bfloat16"]
    best = {name: min(ts) for name, ts in times.items()}
    if loss_steps:
        results["bf16_loss_check"] = loss_curves(loss_steps)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))

    for name in runners:
        e = results["runs"][name]
        print(
            f"{name:15s} {e['ms_per_step']:7.1f} ms/step  {e['tokens_per_s']:8.0f} tok/s  "
            f"MFU {100 * e['mfu']:5.1f}%  (quartiles {e['ms_quartiles'][0]:.0f}-{e['ms_quartiles'][1]:.0f} ms)"
        )
    print(
        f"GEMM peak {peak_flops / 1e9:.0f} GFLOP/s (median; best {max(peak_samples) / 1e9:.0f}); "
        f"analytic {flops / 1e9:.1f} GFLOP/step, XLA {compiled_info['float32']['xla_flops'] / 1e9:.1f}"
    )
    headline = {
        "ratio_vs_torch": round(ratio, 3),
        "mfu": round(results["runs"]["jax_float32"]["mfu"], 3),
        "bf16_ratio_vs_torch": round(bf16_ratio, 3),
        "bf16_mfu": round(results["runs"]["jax_bfloat16"]["mfu"], 3),
        "torch_mfu": round(results["runs"]["torch_float32"]["mfu"], 3),
        "jax_ms_per_step": round(1e3 * step_s["jax_float32"], 1),
        "torch_ms_per_step": round(1e3 * step_s["torch_float32"], 1),
        "gemm_peak_gflops": round(peak_flops / 1e9, 1),
        # Best times: closer to a quiet machine's when others share the cores.
        "ratio_vs_torch_best": round(best["torch_float32"] / best["jax_float32"], 3),
        "bf16_ratio_vs_torch_best": round(best["torch_float32"] / best["jax_bfloat16"], 3),
        "load_average": round(os.getloadavg()[0], 1),
    }
    if loss_steps:
        headline["bf16_loss_rel_diff"] = round(results["bf16_loss_check"]["relative_difference"], 4)
    print(json.dumps(headline))
    return headline


def machine_info(torch=None) -> dict:
    info = {
        "platform": platform.platform(),
        "processor": _cpuinfo("model name") or platform.processor(),
        "vector_extensions": [f for f in VECTOR_FLAGS if f in _cpuinfo("flags").split()],
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "python": platform.python_version(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    if torch is not None:
        info |= {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    return info


def _cpuinfo(field: str) -> str:
    """The first value of `field` in /proc/cpuinfo, or "" where there is none (off Linux)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    main()
