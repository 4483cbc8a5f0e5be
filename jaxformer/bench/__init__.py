"""Benchmarks run as `jaxformer bench NAME` (`make bench-xla`):

xla_vs_eager   when compilation pays off, why, and how it compares with PyTorch
stats          medians with confidence intervals, paired ratios, interleaved timing, break-even
programs       what a program is made of: eager dispatches, HLO ops, fusions, cost, memory
eager_model    a fitted model of eager time (dispatches, unfused bytes, FLOPs)
report         report.md and its plots; docs_tables renders a committed report.json
rounds         programs timed in rounds, each in a worker process of its own
gpt2_jax       a minimal pure-JAX GPT-2 training step (a peer for jaxformer's)
gpt2_torch     a nanoGPT-style PyTorch GPT-2 training step (imports torch)

experiments/gpt2_peers.py times jaxformer's GPT-2 step against the two peers.
"""
