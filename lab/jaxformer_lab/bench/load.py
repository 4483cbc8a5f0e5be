"""How busy the machine is while the lab runs, apart from the lab itself.

The load average counts the lab's own threads and cannot say who else ran. Instead, on the
cores this process may use (its affinity), the kernel's busy time (/proc/stat: user, nice,
system, irq, softirq, steal) is compared with the CPU time of this process and of its
descendants (/proc/PID/stat; reaped children through cutime/cstime): what is left is other
processes' work, in cores. `probe` measures it before the run (the guard); a `Monitor`
samples it every second in a background thread, and `Monitor.window` sums it over a part.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import statistics
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system [idle iowait] irq softirq steal


def _cores_busy_ticks() -> int:
    """Busy ticks of the cores in this process's affinity, from /proc/stat."""
    mine = {f"cpu{c}" for c in os.sched_getaffinity(0)}
    total = 0
    for line in pathlib.Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name in mine:
            total += sum(int(fields[i]) for i in _BUSY_FIELDS)
    return total


def _stat(pid: str) -> list[str] | None:
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone between the listing and the read
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from the state on (field 3)


def _own_ticks() -> int:
    """CPU ticks of this process and of its live descendants, each with the children it
    reaped (a sweep's runs, reaped by the sweep: else their time would leave the count
    as each ends and come back as other processes' work)."""
    me = str(os.getpid())
    parents, ticks = {}, {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(entry.name)) is not None:
            parents[entry.name] = fields[1]  # ppid
            ticks[entry.name] = sum(map(int, fields[11:15]))  # utime stime cutime cstime
    own = _stat(me)
    total = sum(map(int, own[11:15])) if own else 0
    for pid in parents:
        p = parents[pid]
        while p in parents and p != me:
            p = parents[p]
        if p == me and pid != me:
            total += ticks[pid]
    return total


def snapshot() -> tuple[float, int, int]:
    """(seconds, busy ticks of our cores, ticks of this process tree)."""
    return time.perf_counter(), _cores_busy_ticks(), _own_ticks()


def others_cores(a: tuple, b: tuple) -> float:
    """Cores other processes kept busy between two snapshots (>= 0)."""
    seconds = b[0] - a[0]
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / TICK / seconds) if seconds > 0 else 0.0


def probe(seconds: float) -> dict:
    """Other processes' use of our cores over `seconds`, and the 1-minute load average."""
    a = snapshot()
    time.sleep(seconds)
    return {"others_cores": others_cores(a, snapshot()), "window_s": seconds} | _loadavg()


def _loadavg() -> dict:
    return {"load_average": os.getloadavg()[0], "cores": len(os.sched_getaffinity(0))}


class Monitor:
    """Samples every `interval_s` in a background thread; `window(start)` summarises the
    samples since `start` (a `mark()`)."""

    def __init__(self, interval_s: float = 1.0):
        self.samples: list[tuple[float, int, int]] = [snapshot()]
        self._stop = threading.Event()
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.samples.append(snapshot())

    def mark(self) -> int:
        self.samples.append(snapshot())
        return len(self.samples) - 1

    def window(self, start: int) -> dict:
        """Others' cores over the samples since `start`: their mean (ticks over the whole
        window), median and largest one-interval value, and the load average now."""
        self.samples.append(snapshot())
        s = self.samples[start:]
        steps = [others_cores(a, b) for a, b in zip(s, s[1:], strict=False)]
        return {
            "others_cores": others_cores(s[0], s[-1]),
            "others_cores_median": statistics.median(steps) if steps else 0.0,
            "others_cores_max": max(steps, default=0.0),
            "window_s": s[-1][0] - s[0][0],
        } | _loadavg()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def load_averages(every: float = 5.0):
    """The 1-minute load average, sampled as the block starts and every `every` s while it
    runs: the list it fills (for a whole command, whose own processes count in it)."""
    loads, done = [os.getloadavg()[0]], threading.Event()

    def sample():
        while not done.wait(every):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield loads
    finally:
        done.set()
        sampler.join()


def verdict(load: dict, max_cores: float) -> bool:
    """Whether a window was quiet: other processes used at most `max_cores` on average."""
    return load["others_cores"] <= max_cores
