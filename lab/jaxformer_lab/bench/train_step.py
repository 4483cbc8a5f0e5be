"""`jaxformer bench train-step`: training-step throughput of jaxformer against
`torch.nn.Transformer`, side by side.

The same model on both sides (shared.seq2seq_config: the tiny preset at d_model 256, 2 + 2
post-LN layers), vocabulary 1000, batch 32 with source and target length 64, timed in
interleaved rounds (stats.time_interleaved): jaxformer float32 and bfloat16-compute steps;
torch eager float32 steps in workers of the interpreter that has torch (pythons.torch_python:
this one, --torch-python, or one found beside it), one per OpenMP wait policy (TORCH_RUNS),
timed by their own clock; and [2048, 2048] float32 products by JAX and by NumPy's BLAS, the
faster's median the GEMM peak. Medians over rounds with 95% intervals; the speed against
torch (the faster torch run) and the share of the peak are taken round by round. On an
NVIDIA GPU float32 products run in TF32 on both sides. TARGETS are judged by their
intervals. --loss-steps N also trains float32 and bfloat16 from one initialisation on
`dates` and compares their final losses. The method: docs/performance.md, "How the
benchmarks measure"."""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import sys
import tempfile

import numpy as np

from jaxformer.checks import BadValue, check_int
from jaxformer_lab.bench import host, load, pythons, rounds, shared, stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

VOCAB, LENGTH = 1000, 64  # LENGTH: source and target tokens
LR = 1e-4
PEAK_N = 2048  # the GEMM that measures the machine's float32 peak: [N, N] @ [N, N]
GEMMS = ("gemm_jax", "gemm_numpy")  # the peak: the faster of JAX's and NumPy's BLAS
TITLES = {
    "jax_float32": "jaxformer, float32",
    "jax_bfloat16": "jaxformer, bfloat16 compute",
    "torch_float32": "torch.nn.Transformer eager, float32",
    "torch_float32_passive": "torch.nn.Transformer eager, float32, OpenMP waiting passively",
}
# torch's runs by OpenMP's wait policy (--torch-waits; the default busy-waits between
# parallel regions, which collapses where other processes want the cores); the speed
# against torch is against the faster of those run.
TORCH_RUNS = {"torch_float32": "default", "torch_float32_passive": "passive"}


@dataclasses.dataclass(frozen=True)
class TrainStepOptions(Options):
    quick: bool = setting(False, "fewer rounds and loss steps (a CPU in about a minute)")
    rounds: int | None = setting(None, "interleaved rounds, >= 6 (default 10; quick 6)")
    steps_per_round: int = setting(3, "steps of each program per round")
    batch: int = setting(32, "sequences per step")
    loss_steps: int | None = setting(
        None, "steps of the bfloat16 loss check (default 300; quick 100)"
    )
    torch_python: str = setting(
        "", "the Python that runs torch (default: this one if it has torch, else a .venv* one)"
    )
    torch_waits: tuple[str, ...] = setting(
        ("default", "passive"),
        "torch's runs by OpenMP's wait policy (OMP_WAIT_POLICY)",
        choices=("default", "passive"),
    )

    def __post_init__(self):
        super().__post_init__()
        check_int("--steps-per-round", self.steps_per_round)
        check_int("--batch", self.batch)
        if self.rounds is not None and (not isinstance(self.rounds, int) or self.rounds < 6):
            raise BadValue(f"--rounds must be >= 6 for a 95% interval, got {self.rounds}")
        if self.loss_steps is not None:
            check_int("--loss-steps", self.loss_steps, minimum=0)
        if not self.torch_waits or set(self.torch_waits) - set(TORCH_RUNS.values()):
            raise BadValue(
                f"--torch-waits: some of {list(TORCH_RUNS.values())}, got {self.torch_waits}"
            )
        pythons.check_python("--torch-python", self.torch_python)


@BENCHMARKS.register("train-step", TrainStepOptions)
def run(options: TrainStepOptions) -> Record:
    """Training-step throughput of jaxformer against torch.nn.Transformer."""
    rounds_n = options.rounds or (6 if options.quick else 10)
    loss_steps = options.loss_steps
    loss_steps = (100 if options.quick else 300) if loss_steps is None else loss_steps
    torch = pythons.torch_python(options.torch_python)
    if torch is None:
        say(pythons.no_torch_found() + "; timing without torch")
    times, xla, ready, window = time_programs(options, rounds_n, torch)
    result = figures(times, options.steps_per_round, options.batch)
    result |= {"xla": xla, "rounds": rounds_n, "interpreters": interpreters(torch, ready)}
    result["load"] = window
    result["machine"] = host.machine_info(None) | shared.conditions()
    if loss_steps:
        say(f"the bfloat16 loss check: {loss_steps} steps in each dtype")
        result["bf16_loss_check"] = loss_curves(loss_steps, options.batch)
    result["targets"] = verdicts(result)
    tables = [table(result), targets_table(result)]
    data = result | {"headline": headline(result)}
    record = capture(tables, data=data, summary=summary(result))
    if torch is not None:  # torch ran in another interpreter, perhaps: named in the provenance
        record.versions["torch"] = f"{torch['torch']} (Python {torch['python']})"
    return record


def time_programs(options: TrainStepOptions, n: int, torch: dict | None) -> tuple:
    """(seconds per call of each program over `n` interleaved rounds, XLA's figures of the
    jitted steps, torch's workers' ready messages, the load while timing); torch's workers
    start first, so they build while JAX compiles."""
    k = options.steps_per_round
    workers = torch_workers(torch, options.batch, options.torch_waits) if torch else {}
    ready, monitor = {}, load.Monitor()
    try:
        calls, xla = programs(random_batch(np.random.default_rng(0), options.batch), k)
        ready = rounds.ready_all(workers, 600) if workers else {}
        for name, worker in workers.items():
            if "error" in ready[name]:
                raise rounds.WorkerError(f"torch's worker {name}: {ready[name]['error']}")
            calls[name] = functools.partial(worker.timed, k)
        say(f"timing {sorted(calls)} in {n} rounds of {k} calls")
        mark = monitor.mark()
        times = stats.time_interleaved(calls, n)
        window = monitor.window(mark)
    finally:
        monitor.close()
        for worker in workers.values():
            worker.close()
    say(f"other processes kept {window['others_cores']:.2f} cores busy while timing")
    return times, xla, ready, window


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
    """({program: a call of k steps (k GEMMs)}, XLA's FLOPs and memory of each jitted step):
    jaxformer's steps in float32 and bfloat16 compute, and the GEMMs (`gemm_calls`)."""
    import jax.numpy as jnp

    device_batch = {name: jnp.asarray(v) for name, v in batch.items()}
    calls, xla = {}, {}
    for dtype in ("float32", "bfloat16"):
        calls[f"jax_{dtype}"], xla[dtype] = jax_program(dtype, device_batch, k)
    return calls | gemm_calls(k), xla


def gemm_calls(k: int) -> dict:
    """{gemm_jax, gemm_numpy}: calls of k [PEAK_N, PEAK_N] float32 products by JAX and by
    NumPy's BLAS; the GEMM peak is the faster's median (`one_peak`)."""
    import jax
    import jax.numpy as jnp

    a = np.random.default_rng(0).standard_normal((PEAK_N, PEAK_N)).astype(np.float32)
    a_jax, matmul = jnp.asarray(a), jax.jit(jnp.matmul)
    return {
        "gemm_jax": lambda: [matmul(a_jax, a_jax).block_until_ready() for _ in range(k)],
        "gemm_numpy": lambda: [a @ a for _ in range(k)],
    }


def one_peak(rates: dict[str, list[float]]) -> dict:
    """The GEMM peak from each GEMM program's FLOP/s per round: the median and 95% interval
    of the program with the highest median, named (`of`), with every program's."""
    each = {name: stats.median_ci(r) | {"samples": r} for name, r in rates.items()}
    best = max(each, key=lambda name: each[name]["median"])
    return each[best] | {"of": best, "each": each}


def torch_workers(torch: dict, batch: int, waits: tuple[str, ...]) -> dict[str, rounds.Worker]:
    """The worker processes of TORCH_RUNS whose wait policy is in `waits`, in the
    interpreter `torch` (pythons.describe), each serving torch's step (`torch_program`) at
    `batch`, started now (logs: temporary files). OpenMP reads its wait policy when the
    process starts, so each policy is a process."""
    import jax

    code = (
        "import sys; from jaxformer_lab.bench import train_step as t; t.serve_torch(*sys.argv[1:])"
    )
    command = [torch["path"], "-c", code, jax.default_backend(), str(batch)]
    workers = {}
    for name, policy in ((n, p) for n, p in TORCH_RUNS.items() if p in waits):
        env = pythons.worker_env(JAX_PLATFORMS="cpu")  # its JAX only builds the config
        env = {k: v for k, v in env.items() if k != "OMP_WAIT_POLICY"}
        env |= {"OMP_WAIT_POLICY": policy.upper()} if policy != "default" else {}
        log = tempfile.NamedTemporaryFile("w", prefix=f"{name}-", suffix=".log", delete=False)
        workers[name] = rounds.Worker(name, command, env, log)
    return workers


def serve_torch(backend: str, batch: str) -> None:
    """The torch worker's side: torch's step (`torch_program`) on the batch of size `batch`
    that the coordinator builds too, on CUDA where JAX's `backend` is a GPU."""

    def build() -> rounds.Program:
        import torch

        data = random_batch(np.random.default_rng(0), int(batch))
        step, model, device = torch_program(backend)
        info = dict(torch=torch.__version__, device=device, threads=torch.get_num_threads())
        info |= dict(python=sys.version.split()[0], executable=sys.executable)
        params = sum(p.numel() for p in model.parameters())

        def run(k: int) -> float:
            return [step(data) for _ in range(k)][-1]

        return rounds.Program(run, params, info)

    rounds.serve(build)


def interpreters(torch: dict | None, ready: dict) -> dict:
    """Which Python and packages ran each side: this process's, and torch's worker's
    (`torch`: pythons.describe; `ready`: its ready message)."""
    from importlib.metadata import version

    import jax

    mine = dict(path=sys.executable, python=sys.version.split()[0], jax=jax.__version__)
    mine |= dict(jaxlib=version("jaxlib"), numpy=np.__version__)
    said = {k: ready[k] for k in ("device", "threads") if k in ready}
    return {"jax": mine, "torch": None if torch is None else torch | said}


def jax_program(dtype: str, batch: dict, k: int):
    """(a call of k jitted steps that waits for the last, XLA's FLOPs and memory)."""
    step, info, _ = jax_steps(dtype, batch)
    return functools.partial(step, k), info


def jax_steps(dtype: str, batch: dict):
    """(steps(k): k jitted steps of jaxformer's step in `dtype` compute, waiting for the
    last, returning its loss; XLA's FLOPs and memory; the compiled step)."""
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

    def steps(k: int) -> float:
        for _ in range(k):
            box["state"], metrics = compiled(box["state"], batch)
        return float(jax.block_until_ready(metrics["loss"]))

    info = {"xla_flops": float(cost.get("flops", float("nan")))}
    info |= {"temp_bytes": int(mem.temp_size_in_bytes)}
    return steps, info | {"argument_bytes": int(mem.argument_size_in_bytes)}, compiled


def torch_program(backend: str):
    """(torch.nn.Transformer's step: batch -> loss, the model, its device), on CUDA where
    JAX's `backend` is a GPU."""
    device = host.torch_device(backend)
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

    return step, model, device


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
    speed against torch (the faster of TORCH_RUNS: the yardstick) from the paired rounds;
    the GEMM peak."""
    flops = analytic_train_flops(shared.seq2seq_config(VOCAB), size, LENGTH, LENGTH)
    per_step = {name: [t / k for t in ts] for name, ts in times.items()}
    peak = one_peak({g: [2 * PEAK_N**3 / t for t in per_step.pop(g)] for g in GEMMS})
    runs = {}
    torchs = [n for n in TORCH_RUNS if n in per_step]
    torch = min(torchs, key=lambda n: statistics.median(per_step[n]), default=None)
    for name, seconds in per_step.items():
        ci = stats.median_ci(seconds)
        share = [flops / t / rate for t, rate in zip(seconds, peak["samples"], strict=True)]
        runs[name] = dict(
            seconds=ci,
            tokens_per_s=size * LENGTH / ci["median"],
            share_of_peak=stats.median_ci(share),  # round by round: the peak of its round
            mfu=stats.median_ci(share)["median"],
            samples=seconds,
        )
        if torch:
            runs[name]["speed_vs_torch"] = stats.paired_ratio(per_step[torch], seconds)
    return dict(
        torch_yardstick=torch,
        config=dataclasses.asdict(shared.seq2seq_config(VOCAB)),
        batch=dict(B=size, S=LENGTH, T=LENGTH),
        analytic_flops_per_step=flops,
        gemm_peak_flops=peak,
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
    """A row per program: its ms / step, tokens/s, share of the GEMM peak and speed against
    torch, with their intervals."""
    rows = []
    for name, run in r["runs"].items():
        s, share = run["seconds"], run["share_of_peak"]
        title = TITLES[name]
        if name in TORCH_RUNS:
            t = r["interpreters"]["torch"]
            title += f" (torch {t['torch']}, Python {t['python']})"
        rows.append(
            [
                title,
                f"{1e3 * s['median']:.0f} [{1e3 * s['low']:.0f}, {1e3 * s['high']:.0f}]",
                f"{run['tokens_per_s']:,.0f}",
                f"{share['median']:.0%} [{share['low']:.0%}, {share['high']:.0%}]",
                _ratio(run.get("speed_vs_torch")),
            ]
        )
    peak, mine = r["gemm_peak_flops"], r["interpreters"]["jax"]
    gemms = {"gemm_jax": f"JAX {mine['jax']}'s", "gemm_numpy": f"NumPy {mine['numpy']}'s"}
    other = next(g for g in GEMMS if g != peak["of"])
    caption = (
        "d_model 256, 4 heads, 2+2 layers, d_ff 1024, dropout 0.1, shared vocabulary 1000, "
        f"batch {r['batch']['B']} x 64/64 tokens, Adam; {r['analytic_flops_per_step'] / 1e9:.1f} "
        f"GFLOP per step (XLA counts {r['xla']['float32']['xla_flops'] / 1e9:.1f}); jaxformer "
        f"on JAX {mine['jax']} (Python {mine['python']}). The float32 GEMM peak, measured in "
        f"the same rounds: {_gflops(peak)} GFLOP/s by {gemms[peak['of']]} [2048, 2048] "
        f"product ({gemms[other]}: {_gflops(peak['each'][other])}). Medians over "
        f"{r['rounds']} interleaved rounds with their 95% intervals; share of the peak and "
        "speed vs torch (the faster torch run's time over the run's) round by round:"
    )
    columns = ["run", "ms / step [95%]", "target tokens / s", "share of the GEMM peak [95%]"]
    columns.append("speed vs torch [95%]")
    notes = _loss_note(r) + [_load_note(r)]
    return Table(columns, rows, "lrrrr", caption=caption, notes=notes)


def _ratio(ci: dict | None) -> str:
    return "" if ci is None else f"{ci['median']:.2f}x [{ci['low']:.2f}, {ci['high']:.2f}]"


def _gflops(ci: dict) -> str:
    return f"{ci['median'] / 1e9:.0f} [{ci['low'] / 1e9:.0f}, {ci['high'] / 1e9:.0f}]"


def _load_note(r: dict) -> str:
    w = r["load"]
    return (
        f"While timing, other processes kept {w['others_cores']:.2f} of {w['cores']} cores "
        f"busy (mean; most in one second {w['others_cores_max']:.2f}; load average "
        f"{w['load_average']:.1f} at the end)."
    )


# The train step's speed targets: (run, figure, the least value that reaches it).
TARGETS = (
    ("jax_float32", "speed_vs_torch", 1.25),
    ("jax_float32", "share_of_peak", 0.65),
    ("jax_bfloat16", "speed_vs_torch", 1.0),
)


def verdicts(r: dict) -> list[dict]:
    """Each target against its figure's interval: "reached" where the interval lies at or
    above it, "not reached" where below it, else "undecided"; "not measured" without the
    figure (no torch)."""
    out = []
    for run, figure, target in TARGETS:
        ci = r["runs"].get(run, {}).get(figure)
        if ci is None:
            verdict = "not measured"
        elif ci["low"] >= target:
            verdict = "reached"
        else:
            verdict = "not reached" if ci["high"] < target else "undecided"
        out.append(dict(run=run, figure=figure, target=target, ci=ci, verdict=verdict))
    return out


def targets_table(r: dict) -> Table:
    """The targets, the figures' intervals, the verdicts."""
    rows = []
    for v in r["targets"]:
        share, ci = v["figure"] == "share_of_peak", v["ci"]
        text = "" if ci is None else _share(ci) if share else _ratio(ci)
        what = "share of the GEMM peak" if share else "speed vs torch eager float32 (the faster)"
        target = f"{v['target']:.0%}" if share else f"{v['target']:.2f}x"
        rows.append([f"{TITLES[v['run']]}: {what}", target, text, v["verdict"]])
    caption = "The targets (reached: the whole 95% interval at or above the target):"
    return Table(["figure", "target", "measured [95%]", "verdict"], rows, "lrrl", caption=caption)


def _share(ci: dict) -> str:
    return f"{ci['median']:.0%} [{ci['low']:.0%}, {ci['high']:.0%}]"


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


def summary(r: dict) -> str:
    """The finding in one sentence: the speeds against torch and the share of the peak,
    with their intervals and the targets' verdicts, and the load."""
    jax, runs, torch = r["interpreters"]["jax"], r["runs"], r["interpreters"]["torch"]
    v = {(t["run"], t["figure"]): t["verdict"] for t in r["targets"]}
    share = runs["jax_float32"]["share_of_peak"]
    text = f"On JAX {jax['jax']} (Python {jax['python']}) jaxformer's train step ran "
    if torch is not None:
        f32, bf16 = (runs[f"jax_{d}"]["speed_vs_torch"] for d in ("float32", "bfloat16"))
        text += (
            f"at {_ratio(f32)} torch {torch['torch']} eager's speed (Python {torch['python']}) "
            f"in float32 (target 1.25x: {v['jax_float32', 'speed_vs_torch']}) and at "
            f"{_ratio(bf16)} in bfloat16 compute (target 1.0x: "
            f"{v['jax_bfloat16', 'speed_vs_torch']}), "
        )
    text += (
        f"its float32 step at {_share(share)} of the GEMM peak (target 65%: "
        f"{v['jax_float32', 'share_of_peak']}); other processes kept "
        f"{r['load']['others_cores']:.1f} of {r['load']['cores']} cores busy."
    )
    return text


def headline(r: dict) -> dict:
    """The headline: each program's ms / step, its speed against torch, the GEMM peak."""
    line = {f"{n}_ms": round(1e3 * run["seconds"]["median"], 1) for n, run in r["runs"].items()}
    for name, run in r["runs"].items():
        if "speed_vs_torch" in run and name not in TORCH_RUNS:
            ci = run["speed_vs_torch"]
            line[f"{name}_vs_torch"] = [round(ci[k], 3) for k in ("median", "low", "high")]
    line["gemm_peak_gflops"] = round(r["gemm_peak_flops"]["median"] / 1e9, 1)
    line["jax_float32_share_of_peak"] = round(r["runs"]["jax_float32"]["mfu"], 3)
    line["targets"] = {f"{v['run']} {v['figure']}": v["verdict"] for v in r["targets"]}
    if "bf16_loss_check" in r:
        line["bf16_loss_rel_diff"] = round(r["bf16_loss_check"]["relative_difference"], 4)
    return line
