"""CPU cores for runs at once: this process's cores in equal shares (`shares`), and
processes started on one share only (`on_cores`), as `jaxformer sweep --jobs N` starts its
runs on a CPU and `jaxformer bench sweep-jobs` its workers."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def shares(n: int) -> list[set[int]] | None:
    """This process's CPU cores in `n` disjoint shares of (as near as may be) equal size,
    one for each of `n` runs at once; None where a process cannot be pinned to cores (not
    Linux) or there are fewer than `n`."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < n:
        return None
    return [set(cores[i * len(cores) // n : (i + 1) * len(cores) // n]) for i in range(n)]


@contextlib.contextmanager
def on_cores(cores: set[int] | None) -> Iterator[None]:
    """Processes started inside run on `cores` only (None: on this thread's): the calling
    thread is pinned to them meanwhile, and a child inherits its starting thread's cores
    (no code runs in the child before it starts, as a preexec_fn would, which is unsafe
    beside JAX's threads)."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
