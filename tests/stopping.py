"""Stopping a command in a phase: start it, wait until its output shows the phase, send a
signal, and find the processes it started that outlived it. The command starts with the
stop signals as a terminal leaves them (a test run started in the background ignores
SIGINT, and a child would inherit that)."""

from __future__ import annotations

import os
import pathlib
import queue
import re
import subprocess
import sys
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = "JAXFORMER_STOP_TEST"  # in the environment of the command and all it starts
STOPS = ("SIGINT", "SIGTERM", "SIGHUP")
# `python -m jaxformer` with Ctrl-C's handler and the other stops' default action
BOOT = (
    "import runpy, signal\n"
    "for name in ('SIGTERM', 'SIGHUP'): signal.signal(getattr(signal, name), signal.SIG_DFL)\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "runpy.run_module('jaxformer', run_name='__main__', alter_sys=True)"
)


class Started:
    """`jaxformer ARGV` running, its stdout and stderr lines read as they come."""

    def __init__(self, argv: list[str], stdin: str | None = None, env: dict | None = None):
        self.marker = uuid.uuid4().hex
        path = os.pathsep.join([str(ROOT), str(ROOT / "lab")])
        env = dict(os.environ, PYTHONPATH=path, **{MARKER: self.marker}, **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BOOT, *argv],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=env.get("STOP_TEST_CWD"),
            start_new_session=True,  # a terminal's signals to the tests do not reach it
        )
        self.lines = {"out": [], "err": []}
        self._seen: queue.Queue = queue.Queue()
        for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            threading.Thread(target=self._read, args=(name, stream), daemon=True).start()
        if stdin is not None:
            threading.Thread(target=self._write, args=(stdin,), daemon=True).start()

    def _read(self, name, stream):
        for line in stream:
            self.lines[name].append(line)
            self._seen.put((name, line))
        self._seen.put((name, None))

    def _write(self, text):
        try:
            self.proc.stdin.write(text)
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def wait_for(self, stream: str, pattern: str, timeout: float = 240) -> str:
        """The first line of `stream` ("out", "err") matching `pattern`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                name, line = self._seen.get(timeout=1)
            except queue.Empty:
                continue
            if name == stream and line is not None and re.search(pattern, line):
                return line
            if line is None and name == stream:
                break
        self.proc.kill()
        raise AssertionError(f"no line {pattern!r} on std{stream}: {self.err()[-5:]}")

    def stop(self, signum: int, timeout: float = 30, group: bool = False) -> tuple[int, float]:
        """Send `signum` (to every process of the command's group with `group`, as a
        terminal sends Ctrl-C); the exit code and the seconds it took to exit."""
        sent = time.monotonic()
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        time.sleep(0.2)  # the readers' last lines
        return code, time.monotonic() - sent

    def err(self) -> list[str]:
        return [line.rstrip("\n") for line in self.lines["err"]]

    def survivors(self, wait: float = 3.0) -> list[str]:
        """The command lines of live processes carrying this command's marker (after up to
        `wait` seconds for them to go)."""
        deadline = time.monotonic() + wait
        while True:
            found = _marked(self.marker)
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def _marked(marker: str) -> list[str]:
    found = []
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            if f"{MARKER}={marker}".encode() not in (proc / "environ").read_bytes():
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            continue
    return found
