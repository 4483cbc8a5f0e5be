"""A sweep's jobs as Ray tasks (`jaxformer sweep SPEC --ray ADDRESS`).

`connect` joins a cluster ("auto", "host:port", or "local": a head on this machine for
this sweep); `Cluster.check` refuses, before any folder is made, a cluster where no node
has a run's resources, or several nodes writing to a local folder. `Cluster.launch`
submits one job's `jaxformer train` command as a task that runs it on a worker with the
driver's XLA, JAX and jaxformer variables (`ray_cluster.forwarded_env`), output appended
to the run's train.log; the `RayRun` it returns the runner polls, stops and waits on as
a local process. A stop names its signal beside the run and cancels the task (not
forced), which passes that signal on; the run saves its step. A run killed by a signal
is resumed by its task, up to RESUMES times; a task whose worker or node died is run
again by Ray (max_retries), from the run's last checkpoint. Every node needs the same
Python environment (jaxformer and jaxformer-lab) and the sweep's folder at the same path.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

from jaxformer.checks import BadValue
from jaxformer.signals import signals_held
from jaxformer_lab import ray_cluster
from jaxformer_lab.ray_cluster import check_storage

RESUMES = 2  # a run killed by a signal is resumed this many times by its task
TASK_RETRIES = 2  # a task whose worker or node died runs again (Ray's max_retries)
TASK_FILE = "ray_task.json"  # the node and process id of the run in flight
WORKER_PYTHON = None  # the interpreter a task runs `jaxformer` with; None: the worker's own


def connect(
    address: str, *, cpus: float = 1, gpus: float | None = None, tpus: float | None = None
) -> Cluster:
    """Join the Ray cluster at `address` ("local": start a head here, for this sweep);
    each run asks for what `ray_cluster.run_needs` gives."""
    ray = ray_cluster.join(address)
    return Cluster(ray, address, ray_cluster.run_needs(ray, cpus, gpus, tpus))


class Cluster:
    """A joined Ray cluster and what each run asks of it."""

    def __init__(self, ray, address: str, needs: dict[str, float]):
        self.ray, self.address, self.needs = ray, address, needs
        self.accelerators = needs.get("GPU", 0) + needs.get("TPU", 0)  # per run
        self._task = None

    def nodes(self) -> list[dict]:
        """The resources of each live node."""
        return ray_cluster.live_nodes(self.ray)

    def slots(self) -> int:
        """How many runs the cluster holds at once."""
        fits = [min(int(n.get(k, 0) // v) for k, v in self.needs.items()) for n in self.nodes()]
        return max(1, sum(fits))

    def check(self, out: Path, *, shared_storage: bool = False) -> None:
        """Refuse a cluster where no node has a run's resources, and a local `out` that
        the cluster's other nodes would not see."""
        nodes = self.nodes()
        for key, need in self.needs.items():
            most = max((n.get(key, 0) for n in nodes), default=0)
            if most < need:
                raise BadValue(
                    f"each run asks for {need:g} {key} and no node of the Ray cluster at "
                    f"{self.address} has them (the most a node has: {most:g}); pass "
                    f"--ray-{key.lower()}s, or add such a node"
                )
        check_storage(out, len(nodes), shared_storage)

    def launch(self, args: list[str], log: Path) -> RayRun:
        """Submit `jaxformer *args` as a task, its output appended to `log`."""
        if self._task is None:
            self._task = self.ray.remote(max_retries=TASK_RETRIES)(run_command)
        ray_cluster.clear_stop(log.parent)  # a stop of an earlier sweep
        options = ray_cluster.task_options(self.needs)
        env = ray_cluster.forwarded_env()
        ref = self._task.options(**options).remote(args, str(log), WORKER_PYTHON, env)
        return RayRun(self.ray, ref, log.parent)

    def close(self) -> None:
        self.ray.shutdown()


class RayRun:
    """A submitted task, as the runner sees a local process: poll, returncode,
    send_signal (a stop: the task is cancelled and passes `signum` on to the run in
    `folder`, which saves its step) and wait."""

    def __init__(self, ray, ref, folder: Path):
        self.ray, self.ref, self.folder, self.returncode = ray, ref, folder, None

    def poll(self) -> int | None:
        with signals_held():  # inside Ray's calls a SIGTERM would become a bare Ctrl-C
            if self.returncode is None and self.ray.wait([self.ref], timeout=0)[0]:
                self.returncode = self._result()
                ray_cluster.clear_stop(self.folder)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        ray_cluster.ask_stop(self.folder, signum)
        self.ray.cancel(self.ref, force=False)

    def wait(self) -> int:
        self.ray.wait([self.ref])
        return self.poll()

    def _result(self) -> int:
        return ray_cluster.outcome(self.ray, self.ref, self.folder / "train.log")


def run_command(args: list[str], log: str, python: str | None, env: dict[str, str]) -> int:
    """On a worker: run `python -m jaxformer *args` with `env` over the worker's
    environment, output appended to `log`; resume it
    (the command has --resume) when killed by a signal, up to RESUMES times; on a
    KeyboardInterrupt (ray.cancel) pass the stop's signal on (`ray_cluster.wait_stoppable`)
    and wait while it saves. Its exit code."""
    command, folder = [python or sys.executable, "-m", "jaxformer", *args], Path(log).parent
    try:
        for attempt in range(RESUMES + 1):
            code = ray_cluster.wait_stoppable(_start(command, Path(log), env), folder)
            if code >= 0 or attempt == RESUMES:
                return code
            name = signal.Signals(-code).name
            _note(log, f"the run was killed by {name}; resuming it ({attempt + 1} of {RESUMES})")
    except KeyboardInterrupt:  # a stop between two starts
        return 128 + ray_cluster.stop_signal(folder)


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """The run's process (`ray_cluster.start`), its host, Ray node and pid written next
    to its log."""
    import ray

    proc = ray_cluster.start(command, log, env)
    node = ray.get_runtime_context().get_node_id()
    task = {"node": socket.gethostname(), "ray_node": node, "pid": proc.pid}
    (log.parent / TASK_FILE).write_text(json.dumps(task))
    return proc


def _note(log: str, line: str) -> None:
    with open(log, "a") as out:
        out.write(f"jaxformer sweep: {line}\n")
