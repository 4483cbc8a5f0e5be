"""Benchmarks run as `jaxformer bench NAME` (`make bench-xla`):

xla_vs_eager   when compilation pays off, why, and how it compares with PyTorch
stats          medians with confidence intervals, interleaved timing, break-even
programs       what a program is made of: jaxpr equations, HLO ops, fusions, memory
"""
