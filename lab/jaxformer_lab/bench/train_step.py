"""`jaxformer bench train-step`: training-step throughput of jaxformer against
`torch.nn.Transformer`, side by side.

The same model on both sides (shared.seq2seq_config: the tiny preset at d_model 256, 2 + 2
post-LN layers), vocabulary 1000, batch 32 with source and target length 64. Four
programs run in interleaved rounds (stats.time_interleaved, the order rotated each round):
jaxformer float32 steps, torch eager float32 steps (where torch is installed), jaxformer
bfloat16-compute steps and [2048, 2048] float32 matrix products (the GEMM peak). Per
program the median over rounds with its 95% interval; the speed against torch is the
median of the per-round ratios. On an NVIDIA GPU float32 products run in TF32 on both
sides. MFU = analytic model FLOPs (beside XLA's `cost_analysis`) / step time / the GEMM
peak. --loss-steps N also trains float32 and bfloat16 from one initialisation on `dates`
and compares their final losses.

The method in full: docs/performance.md, "How the benchmarks measure"."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np

from jaxformer.checks import BadValue, check_int
from jaxformer_lab.bench import host, shared, stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

VOCAB, LENGTH = 1000, 64  # LENGTH: source and target tokens
LR = 1e-4
PEAK_N = 2048  # the GEMM that measures the machine's float32 peak: [N, N] @ [N, N]
TITLES = {
    "jax_float32": "jaxformer, float32",
    "jax_bfloat16": "jaxformer, bfloat16 compute",
    "torch_float32": "torch.nn.Transformer eager, float32",
}


@dataclasses.dataclass(frozen=True)
class TrainStepOptions(Options):
    quick: bool = setting(False, "fewer rounds and loss steps (a CPU in about a minute)")
    rounds: int | None = setting(None, "interleaved rounds, >= 6 (default 10; quick 6)")
    steps_per_round: int = setting(3, "steps of each program per round")
    batch: int = setting(32, "sequences per step")
    loss_steps: int | None = setting(
        None, "steps of the bfloat16 loss check (default 300; quick 100)"
    )

    def __post_init__(self):
        super().__post_init__()
        check_int("--steps-per-round", self.steps_per_round)
        check_int("--batch", self.batch)
        if self.rounds is not None and (not isinstance(self.rounds, int) or self.rounds < 6):
            raise BadValue(f"--rounds must be >= 6 for a 95% interval, got {self.rounds}")
        if self.loss_steps is not None:
            check_int("--loss-steps", self.loss_steps, minimum=0)


@BENCHMARKS.register("train-step", TrainStepOptions)
def run(options: TrainStepOptions) -> Record:
    """Training-step throughput of jaxformer against torch.nn.Transformer."""
    rounds = options.rounds or (6 if options.quick else 10)
    loss_steps = options.loss_steps
    loss_steps = (100 if options.quick else 300) if loss_steps is None else loss_steps
    batch = random_batch(np.random.default_rng(0), options.batch)
    calls, xla = programs(batch, options.steps_per_round)
    say(f"timing {sorted(calls)} in {rounds} rounds of {options.steps_per_round} calls")
    times = stats.time_interleaved(calls, rounds)
    result = figures(times, options.steps_per_round, options.batch)
    result |= {"xla": xla, "rounds": rounds}
    result["machine"] = host.machine_info(None) | shared.conditions()
    if loss_steps:
        say(f"the bfloat16 loss check: {loss_steps} steps in each dtype")
        result["bf16_loss_check"] = loss_curves(loss_steps, options.batch)
    return capture([table(result)], data=result | {"headline": headline(result)})


def random_batch(rng: np.random.Generator, size: int) -> dict:
    shape = (size, LENGTH)
    tokens = {
        k: rng.integers(3, VOCAB, shape, dtype=np.int32) for k in ("src", "tgt_in", "tgt_out")
    }
    return tokens | {"src_valid": np.ones(shape, bool), "tgt_valid": np.ones(shape, bool)}


def analytic_train_flops(config, B: int, S: int, T: int) -> int:
    """Matrix-multiply FLOPs of one training step (forward x 3), embedding lookups excluded."""
    E, F, V, layers = config.d_model, config.d_ff, config.vocab_size, config.num_decoder_layers
    attn_proj = 4 * E * E  # W^Q, W^K, W^V, W^O per token (d_k * H = E)
    ffn = 2 * E * F
    enc = layers * B * S * (attn_proj + ffn + 2 * S * E)  # + Q K^T and P V
    dec_self = B * T * (attn_proj + 2 * T * E)
    dec_cross = B * T * 2 * E * E + B * S * 2 * E * E + B * T * 2 * S * E  # Q, O; K, V; QK, PV
    dec = layers * (dec_self + dec_cross + B * T * ffn)
    return 3 * 2 * (enc + dec + B * T * E * V)


def programs(batch: dict, k: int) -> tuple[dict, dict]:
    """({program: a call of k steps (k GEMMs)}, XLA's FLOPs and memory of each jitted step)."""
    import jax
    import jax.numpy as jnp

    device_batch = {name: jnp.asarray(v) for name, v in batch.items()}
    calls, xla = {}, {}
    for dtype in ("float32", "bfloat16"):
        calls[f"jax_{dtype}"], xla[dtype] = jax_program(dtype, device_batch, k)
    torch_step = torch_program()
    if torch_step is not None:
        calls["torch_float32"] = lambda: [torch_step(batch) for _ in range(k)]
    a = jnp.asarray(np.random.default_rng(0).standard_normal((PEAK_N, PEAK_N)), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    calls["gemm"] = lambda: [matmul(a, a).block_until_ready() for _ in range(k)]
    return calls, xla


def jax_program(dtype: str, batch: dict, k: int):
    """(a call of k jitted steps that waits for the last, XLA's FLOPs and memory)."""
    import jax
    import optax
    from flax import nnx

    from jaxformer import train
    from jaxformer.models import Transformer

    model = Transformer(shared.seq2seq_config(VOCAB, dtype=dtype), rngs=nnx.Rngs(0))
    schedule = optax.constant_schedule(LR)
    optimizer = train.make_optimizer(schedule)
    graphdef, state = train.create_train_state(model, optimizer, seed=0)
    step = train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1)
    compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
    cost, mem = compiled.cost_analysis(), compiled.memory_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    box = {"state": state}

    def call():
        for _ in range(k):
            box["state"], metrics = compiled(box["state"], batch)
        jax.block_until_ready(metrics["loss"])

    info = {"xla_flops": float(cost.get("flops", float("nan")))}
    info |= {"temp_bytes": int(mem.temp_size_in_bytes)}
    return call, info | {"argument_bytes": int(mem.argument_size_in_bytes)}


def torch_program():
    """torch.nn.Transformer's step (batch -> loss) on JAX's device, or None without torch."""
    device = host.torch_device()
    if device is None:
        return None
    import torch
    from torch import nn

    config = shared.seq2seq_config(VOCAB)
    torch.manual_seed(0)
    model = torch_transformer(config, device).to(device)
    optimizer = torch.optim.Adam(model.parameters(), LR, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)

    def step(batch):
        src, tgt_in, tgt_out = (
            torch.from_numpy(batch[k]).long().to(device) for k in ("src", "tgt_in", "tgt_out")
        )
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(src, tgt_in).reshape(-1, VOCAB), tgt_out.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def torch_transformer(config, device: str):
    """nn.Transformer of `config`'s sizes, with jaxformer's tied embedding, scaled by
    sqrt(d_model), and sinusoidal positions."""
    import torch
    from torch import nn

    from jaxformer.functional import sinusoidal_positions

    E, layers = config.d_model, config.num_encoder_layers

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(config.vocab_size, E)
            nn.init.normal_(self.embed.weight, std=E**-0.5)
            self.core = nn.Transformer(
                E,
                config.num_heads,
                layers,
                layers,
                config.d_ff,
                config.dropout_rate,
                batch_first=True,
            )
            positions = np.array(sinusoidal_positions(config.max_len, E))  # a writable copy
            self.register_buffer("positions", torch.from_numpy(positions))
            self.dropout = nn.Dropout(config.dropout_rate)

        def inputs(self, tokens):
            x = self.embed(tokens) * math.sqrt(E) + self.positions[: tokens.shape[1]]
            return self.dropout(x)

        def forward(self, src, tgt):
            causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=device)
            h = self.core(self.inputs(src), self.inputs(tgt), tgt_mask=causal, tgt_is_causal=True)
            return h @ self.embed.weight.T  # tied output projection

    return Model()


def figures(times: dict, k: int, size: int) -> dict:
    """Per program its seconds per step (median, 95% interval) and what follows; the
    speed against torch from the paired rounds; the GEMM peak."""
    flops = analytic_train_flops(shared.seq2seq_config(VOCAB), size, LENGTH, LENGTH)
    per_step = {name: [t / k for t in ts] for name, ts in times.items()}
    gemm = [2 * PEAK_N**3 / t for t in per_step.pop("gemm")]
    peak = stats.median_ci(gemm)
    runs = {}
    for name, seconds in per_step.items():
        ci = stats.median_ci(seconds)
        runs[name] = dict(
            seconds=ci,
            tokens_per_s=size * LENGTH / ci["median"],
            mfu=flops / ci["median"] / peak["median"],
            samples=seconds,
        )
        if "torch_float32" in per_step:
            runs[name]["speed_vs_torch"] = stats.paired_ratio(per_step["torch_float32"], seconds)
    return dict(
        config=dataclasses.asdict(shared.seq2seq_config(VOCAB)),
        batch=dict(B=size, S=LENGTH, T=LENGTH),
        analytic_flops_per_step=flops,
        gemm_peak_flops=peak | {"samples": gemm},
        runs=runs,
        steps_per_round=k,
    )


def loss_curves(steps: int, size: int) -> dict:
    """Train float32 and bfloat16 from the same init on the same `dates` batches."""
    import jax
    from flax import nnx

    from jaxformer import data, train
    from jaxformer.models import Transformer

    tok = data.ByteTokenizer()
    task = data.TaskData("dates", tok, seed=0, dev_size=10)
    curves = {}
    for dtype in ("float32", "bfloat16"):
        config = shared.seq2seq_config(tok.vocab_size, dtype=dtype)
        model = Transformer(config, rngs=nnx.Rngs(0))
        schedule = train.make_schedule(
            "cosine", lr=1e-3, warmup_steps=max(1, steps // 10), total_steps=steps
        )
        optimizer = train.make_optimizer(schedule)
        graphdef, state = train.create_train_state(model, optimizer, seed=0)
        step = jax.jit(train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1))
        losses = []
        for i in range(steps):
            state, metrics = step(state, task.train_batch(i, size))
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


def table(r: dict) -> Table:
    """A row per program: its ms / step with the interval, tokens/s, MFU and speed against torch."""
    rows = []
    for name, run in r["runs"].items():
        s, speed = run["seconds"], run.get("speed_vs_torch")
        rows.append(
            [
                TITLES[name],
                f"{1e3 * s['median']:.0f} [{1e3 * s['low']:.0f}, {1e3 * s['high']:.0f}]",
                f"{run['tokens_per_s']:,.0f}",
                f"{100 * run['mfu']:.0f}%",
                ""
                if speed is None
                else f"{speed['median']:.2f}x [{speed['low']:.2f}, {speed['high']:.2f}]",
            ]
        )
    peak = r["gemm_peak_flops"]
    caption = (
        "d_model 256, 4 heads, 2+2 layers, d_ff 1024, dropout 0.1, shared vocabulary 1000, "
        f"batch {r['batch']['B']} x 64/64 tokens, Adam; {r['analytic_flops_per_step'] / 1e9:.1f} GFLOP per "
        f"step (XLA counts {r['xla']['float32']['xla_flops'] / 1e9:.1f}); float32 GEMM peak "
        f"measured in the same rounds {peak['median'] / 1e9:.0f} GFLOP/s [{peak['low'] / 1e9:.0f}, "
        f"{peak['high'] / 1e9:.0f}]. Medians over {r['rounds']} interleaved rounds with their "
        "95% intervals; speed vs torch: torch's time over the run's, round by round:"
    )
    columns = ["run", "ms / step [95%]", "target tokens / s", "MFU", "speed vs torch [95%]"]
    return Table(columns, rows, "lrrrr", caption=caption, notes=_loss_note(r))


def _loss_note(r: dict) -> list[str]:
    check = r.get("bf16_loss_check")
    if not check:
        return []
    return [
        f"bfloat16 vs float32 on `dates` after {check['steps']} steps (same init and "
        f"batches): mean loss of the last {check['mean_of_last_steps']} steps "
        f"{check['final_loss_bfloat16']:.4f} vs {check['final_loss_float32']:.4f} "
        f"({100 * check['relative_difference']:.2f}% apart)."
    ]


def headline(r: dict) -> dict:
    """The headline: each program's ms / step, its speed against torch, the GEMM peak."""
    line = {f"{n}_ms": round(1e3 * run["seconds"]["median"], 1) for n, run in r["runs"].items()}
    for name, run in r["runs"].items():
        if "speed_vs_torch" in run and name != "torch_float32":
            ci = run["speed_vs_torch"]
            line[f"{name}_vs_torch"] = [round(ci[k], 3) for k in ("median", "low", "high")]
    line["gemm_peak_gflops"] = round(r["gemm_peak_flops"]["median"] / 1e9, 1)
    if "bf16_loss_check" in r:
        line["bf16_loss_rel_diff"] = round(r["bf16_loss_check"]["relative_difference"], 4)
    return line
