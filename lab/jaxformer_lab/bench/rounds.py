"""Programs timed in rounds, each in a worker process of its own.

JAX and torch in one process fight over an accelerator's memory (JAX takes 75% of it when
it starts), and compiling one program after another costs the sum of their compile times.
So each program runs in its own worker, possibly of another interpreter (`pythons`): the
coordinator starts them all at once (they build and compile in parallel), then asks each
in turn for a round of k steps (`stats.time_interleaved` times the round trip, or, with
`Worker.timed`, takes the steps' seconds by the worker's clock, `stats.Elapsed`).

The worker's side is `serve(build)`, one program or several by name (which also answer
named questions, `Program.asks`); the coordinator's is `Worker` and `ready_all`. Requests
are JSON lines on the worker's stdin; messages are JSON lines, marked with MARK, on its
original stdout; anything it prints once serving goes to its stderr (the coordinator's
log file for it), and unmarked lines printed before (while importing) are copied there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import IO, NamedTuple

from jaxformer_lab.bench.stats import Elapsed
from jaxformer_lab.cores import on_cores

MARK = "@rounds "  # starts every message line


class Program(NamedTuple):
    """A training step ready to run: run(k) takes k steps, waits for the device and returns
    the last step's loss; params is its parameter count; info, what it is (JSON values);
    peak_bytes(), the most device memory it has held (None where the device does not say);
    asks, questions the worker answers by name (each a call returning JSON values)."""

    run: Callable[[int], float]
    params: int
    info: dict
    peak_bytes: Callable[[], int | None] = lambda: None
    asks: Mapping[str, Callable[[], object]] = {}


class WorkerError(RuntimeError):
    """A worker that failed or exited; the message names its log."""


def serve(build: Callable[[], Program | dict[str, Program]]) -> None:
    """The worker's side: build the program (or programs, by name), take each's first step
    (compiling), send {ready, setup_s, ready_at} with, for one program, {first_step_s,
    initial_loss, params, peak_bytes, **info}, for several the same under programs[name];
    then answer each request: {steps: k, program} takes k steps and sends {loss, seconds},
    {ask: name, program} sends {answer}. On an error, send {error} and raise it."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints (libraries' included) go to the log, not the channel

    def send(**message) -> None:
        channel.write(MARK + json.dumps(message) + "\n")

    try:
        t0 = time.perf_counter()
        built = build()
        programs = {"": built} if isinstance(built, Program) else built
        setup = dict(setup_s=time.perf_counter() - t0)
        firsts = {name: _first(program) for name, program in programs.items()}
        said = firsts[""] if isinstance(built, Program) else {"programs": firsts}
        send(ready=True, **setup, **said, ready_at=time.time())
        for line in sys.stdin:
            request = json.loads(line)
            program = programs[request.get("program", "")]
            if "ask" in request:
                send(answer=program.asks[request["ask"]]())
                continue
            started = time.perf_counter()
            loss = program.run(request["steps"])
            send(loss=loss, seconds=time.perf_counter() - started)
    except Exception as error:
        send(error=f"{type(error).__name__}: {error}"[-2000:])
        traceback.print_exc()
        raise


def _first(program: Program) -> dict:
    """A program's first step (compiling) and what it says of itself."""
    t0 = time.perf_counter()
    loss = program.run(1)
    first = dict(first_step_s=time.perf_counter() - t0, initial_loss=loss)
    return first | dict(params=program.params, peak_bytes=program.peak_bytes()) | program.info


class Worker:
    """The coordinator's handle on one worker process, started at once; `log` takes its
    stderr (and is closed with it); `cores`: the only CPU cores it runs on (Linux)."""

    def __init__(
        self, name: str, command: list[str], env: dict, log: IO[str], cores: set[int] | None = None
    ):
        self.name, self.log = name, log
        self.started = time.time()  # the worker's clock too: ready_at is its time.time()
        with on_cores(cores):
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
            )

    def ready(self) -> dict:
        """The worker's ready message, with ready_s: seconds from its start to its ready
        message (imports, building and the first step)."""
        message = self._receive()
        ready_at = message.pop("ready_at")
        return message | {"ready_s": ready_at - self.started}

    def kill(self) -> None:
        """Stop the worker now (a pending `ready` or `run` then raises WorkerError)."""
        self.process.kill()

    def run(self, steps: int, program: str = "") -> float:
        """Take `steps` steps of `program` in the worker; the last loss."""
        return self._request(steps=steps, program=program)["loss"]

    def timed(self, steps: int, program: str = "") -> Elapsed:
        """Take `steps` steps of `program`; their seconds by the worker's clock."""
        return Elapsed(self._request(steps=steps, program=program)["seconds"])

    def ask(self, question: str, program: str = ""):
        """The answer of `program`'s ask named `question`."""
        return self._request(ask=question, program=program)["answer"]

    def _request(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._receive()

    def close(self) -> None:
        """End the worker (its stdin closes), wait for it, close its log."""
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()

    def _receive(self) -> dict:
        """The next message; unmarked lines go to the log."""
        line = self.process.stdout.readline()
        while line and not line.startswith(MARK):
            self.log.write(line)
            line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise WorkerError(f"worker {self.name} exited ({code}); see {self.log.name}")
        message = json.loads(line.removeprefix(MARK))
        if "error" in message:
            raise WorkerError(f"worker {self.name}: {message['error']} (see {self.log.name})")
        return message


def ready_all(workers: dict[str, Worker], timeout_s: float) -> dict[str, dict]:
    """Each worker's ready message, waited for together, or {error} for one that failed
    or was not ready within timeout_s (it is killed, so the others need not wait)."""
    with ThreadPoolExecutor(len(workers)) as pool:
        futures = {name: pool.submit(w.ready) for name, w in workers.items()}
        wait(futures.values(), timeout=timeout_s)
        late = [name for name, f in futures.items() if not f.done()]
        for name in late:
            workers[name].kill()
        messages = {}
        for name, future in futures.items():
            try:
                messages[name] = future.result()
            except WorkerError as error:
                slow = f"not ready within {timeout_s:.0f} s (stopped)"
                messages[name] = {"error": slow if name in late else str(error)}
    return messages
