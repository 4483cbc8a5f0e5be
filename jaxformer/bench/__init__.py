"""Benchmarks run as `jaxformer bench NAME` (`make bench-xla`):

xla_vs_eager   when compilation pays off, why, and how it compares with PyTorch: its
               options (LabOptions), the resumable run and report.json
plan           what a run measures (CPU or GPU, quick or full) and each part's time budget
measure        the parts: the host, each workload in every mode, first calls, scale, compiling
modes          the ways a workload runs (eager, jit, nnx, functional, torch, torch.compile)
workloads      attention, one layer, the forward pass, a train step (JAX and torch)
host           the machine read (processor, flags) and measured (roofs, dispatch, NNX overheads)
load           other processes' use of the cores: the run's load guard
fresh          first calls and memory in fresh processes, every compilation cache off
compile_costs  compile times against size (cache off, cold, warm); recompiling variable lengths
programs       what a program is made of (counted), and what one call launched (profiled)
eager_model    a fitted model of eager time (dispatches, unfused bytes, FLOPs)
validate       that model scored out of sample, with bootstrap intervals
stats          medians with confidence intervals, paired ratios, interleaved timing, break-even
report         report.md (report_why: its why; fmt: figures with intervals; plots: PNGs)
rounds         programs timed in rounds, each in a worker process of its own
gpt2_jax       a minimal pure-JAX GPT-2 training step (a peer for jaxformer's)
gpt2_torch     a nanoGPT-style PyTorch GPT-2 training step (imports torch)

experiments/gpt2_peers.py times jaxformer's GPT-2 step against the two peers.
"""
