"""Resumable parts within a time budget: the one runner behind `gpu-report` and the
XLA-vs-eager lab.

A call runs, in their order, the parts not yet finished, each with its budget, while the
next one's budget fits in the time the call has left; at the first that does not fit it
stops, so that later calls keep the parts' order. Each part is recorded by its caller as
it ends (`run_one`), so a stopped call loses only the part in flight, and the next call
skips what is finished. The sweep is not one of these: its runs go to several slots or
Ray tasks at once, and each run resumes from its own folder.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence


class Clock:
    """The seconds a call has left (None: no limit) and the part in flight (None: none)."""

    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else time.perf_counter() + seconds
        self.part: str | None = None

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.perf_counter()


class alarm_at_deadline:
    """Raise `make_stop()` in the main thread when `clock` runs out, in the middle of a
    part (only the main thread takes signals; elsewhere this does nothing)."""

    def __init__(self, clock: Clock, make_stop: Callable[[], BaseException]):
        self.clock, self.make_stop, self.saved = clock, make_stop, None

    def __enter__(self) -> Clock:
        if self.clock.deadline is None or threading.current_thread() is not threading.main_thread():
            return self.clock
        self.saved = signal.signal(signal.SIGALRM, self._raise)
        signal.setitimer(signal.ITIMER_REAL, max(self.clock.left(), 0.01))
        return self.clock

    def _raise(self, *_):
        raise self.make_stop()

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.saved)


def run_parts(
    names: Sequence[str],
    *,
    budgets: Mapping[str, float],
    finished: Callable[[str], bool],
    run_one: Callable[[str, float], object],
    clock: Clock,
    say: Callable[[str], None] = print,
    budgets_on: str = "",
) -> list[str]:
    """Run each part of `names` that is not `finished`, in order, as `run_one(name,
    budget)`, while its budget fits in `clock`'s time left; returns the parts run.
    `budgets_on` names the machine the budgets were set for, in the progress lines."""
    todo = [name for name in names if not finished(name)]
    ran = []
    for i, name in enumerate(todo, 1):
        budget, left = budgets[name], clock.left()
        if left is not None and budget > left:
            after = len(todo) - i
            rest = f" and the {after} after it are" if after else " is"
            say(
                f"[{i}/{len(todo)}] {name} needs {budget:.0f} s, this call has {max(left, 0):.0f} s "
                f"left: it{rest} left for the next call"
            )
            break
        clock.part = name  # before the line that says so: a stop from here names it
        on = f" on {budgets_on}" if budgets_on else ""
        say(f"[{i}/{len(todo)}] {name} (budget {budget:.0f} s{on})")
        run_one(name, budget)
        clock.part = None  # a stop from here on names no part
        ran.append(name)
    return ran
