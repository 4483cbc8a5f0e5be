"""The resumable parts runner: finished parts are skipped, the rest run in order while
the next budget fits, a call stops at the first that does not, and the clock's alarm
stops a part that runs past the call's time."""

import time

import pytest

from jaxformer_lab.parts import Clock, alarm_at_deadline, run_parts


def test_finished_parts_are_skipped_and_the_rest_run_in_order():
    ran, said = [], []
    out = run_parts(
        ["a", "b", "c"],
        budgets={"a": 1, "b": 1, "c": 1},
        finished=lambda name: name == "b",
        run_one=lambda name, budget: ran.append((name, budget)),
        clock=Clock(None),
        say=said.append,
    )
    assert out == ["a", "c"] and ran == [("a", 1), ("c", 1)]
    assert said == ["[1/2] a (budget 1 s)", "[2/2] c (budget 1 s)"]


def test_a_call_stops_at_the_first_part_its_time_cannot_hold():
    ran, said = [], []
    out = run_parts(
        ["a", "big", "c"],
        budgets={"a": 1, "big": 600, "c": 1},
        finished=lambda name: False,
        run_one=lambda name, budget: ran.append(name),
        clock=Clock(60),
        say=said.append,
        budgets_on="a test machine",
    )
    assert out == ran == ["a"]  # "c" would fit, but the order is kept for the next call
    assert said[0] == "[1/3] a (budget 1 s on a test machine)"
    assert said[1].startswith("[2/3] big needs 600 s, this call has ")
    assert said[1].endswith(" s left: it and the 1 after it are left for the next call")


def test_a_stop_inside_a_part_names_it():
    clock = Clock(None)

    def fails(name, budget):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_parts(["a"], budgets={"a": 1}, finished=lambda n: False, run_one=fails, clock=clock)
    assert clock.part == "a"


def test_the_alarm_stops_a_part_that_outlives_the_call():
    class TimeUp(Exception):
        pass

    clock = Clock(0.2)
    t0 = time.perf_counter()
    with pytest.raises(TimeUp), alarm_at_deadline(clock, TimeUp):
        time.sleep(5)
    assert time.perf_counter() - t0 < 2 and clock.left() < 0
