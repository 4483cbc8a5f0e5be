"""Benchmarks, each run as `jaxformer bench NAME [options]` (`jaxformer bench --help` lists
them) and registered in BENCHMARKS (registry.py: a name, a frozen dataclass of options, a
run that returns a `jaxformer_lab.results.Record`):

lm-throughput  lm_throughput.py: GPT-2-small training throughput and MFU
gpt2-peers     peers.py: jaxformer's GPT-2 step against a pure-JAX (gpt2_jax) and a
               PyTorch (gpt2_torch) step, each in a worker process (rounds)
train-step     train_step.py: the encoder-decoder's step against torch.nn.Transformer
attention      attention.py: attention kernels' time, memory and agreement
decode         decode_speed.py: the KV cache against recomputing the prefix
profile        profile_step.py: one step by kind of operation (CPU) or by category from
               a trace and its HLO (hlo_profile)
compile-time   compile_time.py: compile time and memory against depth; the compile cache
copy-baseline  copy_baseline.py: copying the source as the translation, the floor to beat
parity         parity.py (parity_cases): converted torch modules and HF models
paper-params   paper_params.py: Table 3's parameter counts, the paper's against ours
batch-shapes   batch_shapes.py: how many shapes a translation run's batches take per pad multiple
seeds-vmapped  seeds_vmapped.py: k seeds as one vmapped step against k steps one after another
internals-overhead  internals_overhead.py: what --log-internals N costs a training step
make-train     make_train.py: how long `make train` takes, as a fresh process
speedrun-levers  speedrun_levers.py: the wyc-web speedrun's padding and candidate models' step time
sweep-jobs     sweep_jobs.py: one run on every core against N pinned runs at once (--jobs N)
xla-vs-eager   xla_vs_eager.py: the XLA-vs-eager lab: when compilation pays off, why, and
               how it compares with PyTorch (plan, measure, modes, workloads, host, load,
               fresh, compile_costs, programs, eager_model, validate, report, report_why,
               fmt, plots)

shared         what several share: the peak table, the LM FLOP count, the GPT-2 model
stats          the one timing harness: interleaved rounds, medians with intervals, paired
               ratios and savings, break-even call counts
"""

# Importing each benchmark's module registers it.
from jaxformer_lab.bench import (  # noqa: F401
    attention,
    batch_shapes,
    compile_time,
    copy_baseline,
    decode_speed,
    internals_overhead,
    lm_throughput,
    make_train,
    paper_params,
    parity,
    peers,
    profile_step,
    ray_sweep,
    seeds_vmapped,
    speedrun_levers,
    sweep_jobs,
    train_step,
    xla_vs_eager,
)
from jaxformer_lab.bench.registry import BENCHMARKS

__all__ = ["BENCHMARKS"]
