"""How the lab's long commands stop (`jaxformer bench NAME`, `jaxformer gpu-report`): Ctrl-C
(SIGINT), SIGTERM and SIGHUP raise in the command, every process it started (and theirs) is
killed and reaped, and it says in one line what stopped it and the command that reruns it,
then exits 130, 143 or 129. Processes its children left behind are adopted (Linux's child
subreaper), so none outlives the command. `jaxformer sweep` forwards its stops instead
(its runs save their step).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import signal
import sys
import time
from collections.abc import Callable

from jaxformer.signals import Terminated, repeats_dropped, stop_signals_raise

PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def stoppable(where: str, job: Callable[[], int], rerun: str) -> int:
    """job()'s exit code; stopped by a signal, the code of that signal, after one line on
    stderr: `where` (the command), the signal and `rerun` (what to run to continue)."""
    _adopt_orphans()
    try:
        with stop_signals_raise():
            return job()
    except KeyboardInterrupt as stop:
        with repeats_dropped():
            end_descendants()
        name = signal.Signals(getattr(stop, "signum", signal.SIGINT)).name
        print(f"{where}: stopped by {name}; {rerun}", file=sys.stderr, flush=True)
        return 128 + stop.signum if isinstance(stop, Terminated) else 130
    finally:
        end_descendants()


def end_descendants(grace: float = 2.0) -> None:
    """SIGKILL every process below this one, then reap those that are its children (for
    `grace` seconds at most)."""
    pids = descendants()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.02)
        pids.discard(pid)


def descendants(root: int | None = None) -> set[int]:
    """The ids of the live processes below `root` (default: this one), read from /proc
    (empty where there is none)."""
    parents = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":  # a zombie is dead: only its reaping is left
                parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {os.getpid() if root is None else root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _adopt_orphans() -> None:
    """Make this process the reaper of its descendants whose parent dies (Linux), so that
    `descendants` still finds them; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
