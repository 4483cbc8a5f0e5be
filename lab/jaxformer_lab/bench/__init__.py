"""Benchmarks, each run as `jaxformer bench NAME [options]` (`jaxformer bench --help` lists
them) and registered in BENCHMARKS (registry.py: a name, a frozen dataclass of options, a
run that returns a `jaxformer_lab.results.Record`).

Each benchmark lives in the module named after it (lm-throughput: lm_throughput.py), except
gpt2-peers (peers.py; its peers run in worker processes, rounds.py, as do jax-versions' lines
and train-step's torch, in interpreters pythons.py finds), decode (decode_speed.py), profile
(profile_step.py, hlo_profile.py) and parity (parity.py, parity_cases.py); xla-vs-eager is
the XLA-vs-eager lab (xla_vs_eager.py and the modules its docstring names). What several share: shared (the peak table, the LM
FLOP count, the GPT-2 model) and stats (the one timing harness: interleaved rounds,
medians with intervals, paired ratios and savings, break-even call counts).

docs/architecture.md's layout lists every module; docs/performance.md says what each
benchmark measures and how.
"""

# Importing each benchmark's module registers it.
from jaxformer_lab.bench import (  # noqa: F401
    attention,
    batch_shapes,
    compile_time,
    copy_baseline,
    decode_speed,
    first_hour,
    internals_overhead,
    jax_versions,
    lm_throughput,
    make_train,
    optimizer_step,
    paper_params,
    parity,
    peers,
    profile_step,
    ray_sweep,
    seeds_vmapped,
    shard_loader,
    speedrun_levers,
    sweep_jobs,
    tracker_overhead,
    train_step,
    xla_vs_eager,
)
from jaxformer_lab.bench.registry import BENCHMARKS

__all__ = ["BENCHMARKS"]
