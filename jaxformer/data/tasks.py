"""Synthetic sequence-to-sequence tasks, generated deterministically from a seed.

    copy      "hello"                    -> "hello"
    reverse   "hello"                    -> "olleh"
    sort      "hello"                    -> "ehllo"
    addition  "4817+93"                  -> "4910"
    dates     "Saturday, 3 March 2001"   -> "2001-03-03"  (and 14 other written formats)

An example is in the test split when a hash of its *key* falls in the test tenth (for
`dates` the date itself, so a test date is never trained on in any format)."""

from __future__ import annotations

import dataclasses
import datetime
import random
import zlib
from collections.abc import Callable

from jaxformer.checks import BadValue

TASKS = ("dates", "copy", "reverse", "sort", "addition")
SPLITS = ("train", "test")
_TEST_BUCKETS = 10  # one key in ten is held out

FIRST_DATE = datetime.date(1950, 1, 1)
LAST_DATE = datetime.date(2049, 12, 31)

MONTHS = (
    "January February March April May June July August September October November December"
).split()
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _yy(d: datetime.date) -> str:
    return f"{d.year % 100:02d}"


# Each format writes a date one way; the field order is part of the format.
DATE_FORMATS: dict[str, Callable[[datetime.date], str]] = {
    "weekday, D Month YYYY": lambda d: (
        f"{WEEKDAYS[d.weekday()]}, {d.day} {MONTHS[d.month - 1]} {d.year}"
    ),
    "D Month YYYY": lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    "Month D, YYYY": lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    "Month Dth, YYYY": lambda d: f"{MONTHS[d.month - 1]} {_ordinal(d.day)}, {d.year}",
    "Dth of Month YYYY": lambda d: f"{_ordinal(d.day)} of {MONTHS[d.month - 1]} {d.year}",
    "the Dth of Month, YYYY": lambda d: f"the {_ordinal(d.day)} of {MONTHS[d.month - 1]}, {d.year}",
    "D MONTH YYYY": lambda d: f"{d.day} {MONTHS[d.month - 1].upper()} {d.year}",
    "Mon D, YYYY": lambda d: f"{MONTHS[d.month - 1][:3]} {d.day}, {d.year}",
    "Wkd D Mon YYYY": lambda d: (
        f"{WEEKDAYS[d.weekday()][:3]} {d.day} {MONTHS[d.month - 1][:3]} {d.year}"
    ),
    "D Mon YY": lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {_yy(d)}",
    "DD/MM/YY": lambda d: f"{d.day:02d}/{d.month:02d}/{_yy(d)}",
    "M/D/YYYY": lambda d: f"{d.month}/{d.day}/{d.year}",
    "DD.MM.YYYY": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
    "YYYYMMDD": lambda d: f"{d.year}{d.month:02d}{d.day:02d}",
    "YYYY-MM-DD": lambda d: d.isoformat(),
}


@dataclasses.dataclass(frozen=True)
class Task:
    """A task: `sample(rng)` draws (source, target, key); strings are ASCII."""

    name: str
    sample: Callable[[random.Random], tuple[str, str, str]]
    max_source_chars: int
    max_target_chars: int


def _random_string(rng: random.Random, alphabet: str, max_len: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, max_len)))


def _date_sample(rng: random.Random) -> tuple[str, str, str]:
    span = (LAST_DATE - FIRST_DATE).days
    d = FIRST_DATE + datetime.timedelta(days=rng.randint(0, span))
    fmt = rng.choice(list(DATE_FORMATS.values()))
    return fmt(d), d.isoformat(), d.isoformat()


def _string_task(name: str, transform: Callable[[str], str], max_len: int = 24) -> Task:
    alphabet = "abcdefghijklmnopqrstuvwxyz"

    def sample(rng):
        s = _random_string(rng, alphabet, max_len)
        return s, transform(s), s

    return Task(name, sample, max_len, max_len)


def _addition_sample(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(0, 99999), rng.randint(0, 99999)
    src = f"{a}+{b}"
    return src, str(a + b), src


_TASKS = {
    "dates": Task("dates", _date_sample, max_source_chars=29, max_target_chars=10),
    "copy": _string_task("copy", lambda s: s),
    "reverse": _string_task("reverse", lambda s: s[::-1]),
    "sort": _string_task("sort", lambda s: "".join(sorted(s))),
    "addition": Task("addition", _addition_sample, max_source_chars=11, max_target_chars=6),
}


def get_task(name: str) -> Task:
    if name not in _TASKS:
        raise BadValue(f"unknown task {name!r}; tasks are {list(TASKS)}")
    return _TASKS[name]


def split_of(key: str) -> str:
    """The split an example with this key belongs to."""
    return "test" if zlib.crc32(key.encode()) % _TEST_BUCKETS == 0 else "train"


def draw(task: Task, rng: random.Random, split: str) -> tuple[str, str]:
    """One example of `split`, by rejection sampling."""
    if split not in SPLITS:
        raise BadValue(f"split must be one of {SPLITS}, got {split!r}")
    while True:
        src, tgt, key = task.sample(rng)
        if split_of(key) == split:
            return src, tgt


def train_examples(task: Task, seed: int, index: int, n: int) -> list[tuple[str, str]]:
    """The n training examples of batch `index`: a pure function of (seed, index), so a
    resumed run sees exactly the batches it would have seen."""
    rng = random.Random(f"{task.name}:{seed}:train:{index}")
    return [draw(task, rng, "train") for _ in range(n)]


def dev_examples(task: Task, seed: int, n: int) -> list[tuple[str, str]]:
    """n distinct examples of the held-out ("test") split with distinct sources, the same
    for a given seed: a task's dev pairs (a task has no test set apart from them)."""
    rng = random.Random(f"{task.name}:{seed}:test")
    seen: dict[str, str] = {}
    for _ in range(200 * n):
        src, tgt = draw(task, rng, "test")
        seen.setdefault(src, tgt)
        if len(seen) == n:
            return list(seen.items())
    raise BadValue(f"task {task.name!r} has fewer than {n} distinct held-out examples")
