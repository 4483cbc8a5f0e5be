"""How a run is stopped from outside: Ctrl-C (SIGINT), SIGTERM (`kill`, `timeout`, `docker
stop`, a cluster scheduler's preemption) and SIGHUP (a closed terminal). While `train`
runs, SIGTERM and SIGHUP raise `Terminated`; during a step all three wait until it has
given back its donated state, so the loop can save it. Callers' own handlers are kept."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading


class Terminated(KeyboardInterrupt):
    """Training was asked to stop by signal `signum` (SIGTERM or SIGHUP); raised, as
    Ctrl-C raises KeyboardInterrupt, once the step in flight is done and saved."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# What stops a run besides Ctrl-C (SIGINT): `kill`'s or a scheduler's SIGTERM, a closed
# terminal's SIGHUP (POSIX only).
TERMINATING = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def stop_signals_raise():
    """While the block runs (in the main thread): SIGTERM and SIGHUP raise Terminated, as
    Ctrl-C raises KeyboardInterrupt; a signal with a handler of the caller's, or ignored,
    is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [s for s in TERMINATING if signal.getsignal(s) is signal.SIG_DFL]
    for signum in ours:
        signal.signal(signum, _raise_terminated)
    try:
        with stops_kept():
            yield
    finally:
        for signum in ours:
            signal.signal(signum, signal.SIG_DFL)


def _raise_terminated(signum, frame):
    raise Terminated(signum)


@contextlib.contextmanager
def stops_kept():
    """While the block runs: a stop whose exception Python can only print and drop (its
    handler ran inside a garbage collector's callback, as JAX's, or a __del__) is sent
    again, so that it still stops the job rather than being lost."""
    before = sys.unraisablehook
    if getattr(before, "sends_stops_again", False):  # an outer block's
        yield
        return

    def hook(unraisable):
        stop = unraisable.exc_value
        if not isinstance(stop, KeyboardInterrupt):
            return before(unraisable)
        signum = getattr(stop, "signum", signal.SIGINT)
        # from another thread, once the callback that dropped it has returned
        threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()

    hook.sends_stops_again = True
    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = before


@contextlib.contextmanager
def signals_held():
    """Hold the stop signals that raise (Ctrl-C's, and `stop_signals_raise`'s) until the
    block ends, then raise for the first that came. The compiled step donates the old
    state, so an error raised inside it (e.g. while its outputs are unpacked) would leave
    no state to save."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raising = (signal.default_int_handler, _raise_terminated)
    held = {s: h for s in (signal.SIGINT, *TERMINATING) if (h := signal.getsignal(s)) in raising}
    caught = []
    for signum in held:
        signal.signal(signum, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
    if caught:
        raise KeyboardInterrupt if caught[0] == signal.SIGINT else Terminated(caught[0])


@contextlib.contextmanager
def repeats_dropped():
    """While a stop is handled (the last step saved, a sweep's runs waited for), a stop
    signal that comes again is held, then dropped, so that the stop in hand is raised
    whole: Ctrl-C reaches a sweep's runs twice, from the terminal and from the sweep."""
    with contextlib.suppress(KeyboardInterrupt), signals_held():
        yield
