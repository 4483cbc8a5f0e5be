"""A sweep's jobs as Ray tasks (`jaxformer sweep SPEC --ray ADDRESS`).

`connect` joins a cluster ("auto", "host:port", or "local": a head on this machine for
this sweep); `Cluster.check` refuses, before any folder is made, a cluster where no node
has a run's resources, or several nodes writing to a local folder. `Cluster.launch`
submits the runner's `jaxformer train` command of one job as a task that runs it as a
subprocess on a worker, its output appended to the run's train.log, and returns a `RayRun`,
which the runner polls, stops and waits on as it does a local process. A stop cancels the
task (ray.cancel, force=False): its KeyboardInterrupt reaches the run as SIGINT, and the
run saves its step. A run killed by a signal (a stop aside) is resumed by its task, up to
RESUMES times; a task whose worker or node died is run again by Ray (max_retries), and
resumes from the run's last checkpoint. Every node needs the same Python environment
(jaxformer and jaxformer-lab installed) and the sweep's folder at the same path.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from jaxformer.checks import BadValue, MissingPackage, Unreachable

RESUMES = 2  # a run killed by a signal is resumed this many times by its task
TASK_RETRIES = 2  # a task whose worker or node died runs again (Ray's max_retries)
TASK_FILE = "ray_task.json"  # the node and process id of the run in flight
WORKER_PYTHON = None  # the interpreter a task runs `jaxformer` with; None: the worker's own
# Storage every node can mount (/proc/mounts types); a local disk is none of them.
SHARED_FILESYSTEMS = ("nfs", "cifs", "smb3", "lustre", "gpfs", "ceph", "beegfs", "fuse.")
CONNECT_SECONDS = 5  # how long an address has to answer


def import_ray():
    try:
        import ray
    except ImportError:
        raise MissingPackage(
            "--ray needs Ray: pip install 'jaxformer-lab[ray]' (here and on every node)"
        ) from None
    return ray


def connect(address: str, *, cpus: float = 1, gpus: float | None = None) -> Cluster:
    """Join the Ray cluster at `address` ("local": start a head here, for this sweep);
    each run asks for `cpus` CPUs and `gpus` GPUs (None: 1 on a cluster with GPUs)."""
    ray = import_ray()
    if address not in ("auto", "local"):
        _probe(address)
    held = signal.getsignal(signal.SIGTERM)  # ray.init's handler would exit, not stop the runs
    try:
        if address == "local":
            ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1")
        else:
            ray.init(address=address, log_to_driver=False)
    except ConnectionError as e:
        raise Unreachable(f"--ray {address}: {_line(e)}") from None
    except RuntimeError as e:
        if not str(e).startswith("Version mismatch"):
            raise
        raise BadValue(
            f"--ray {address}: the cluster runs another Ray or Python than this one "
            f"({_line(e)}); install the cluster's versions here"
        ) from None
    finally:
        if held is not None:
            signal.signal(signal.SIGTERM, held)
    if gpus is None:
        gpus = 1 if ray.cluster_resources().get("GPU", 0) else 0
    return Cluster(ray, address, cpus, gpus)


def _probe(address: str) -> None:
    """One line, at once, for an address nobody listens on (ray.init retries for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise BadValue(f"--ray {address}: give auto, local or HOST:PORT (the head's address)")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as e:
        raise Unreachable(
            f"--ray {address}: no Ray cluster answers there ({e.strerror or e}); start one "
            "with `ray start --head`, or pass --ray local"
        ) from None


def _line(error: Exception) -> str:
    return " ".join(str(error).split())


class Cluster:
    """A joined Ray cluster and what each run asks of it."""

    def __init__(self, ray, address: str, cpus: float, gpus: float):
        self.ray, self.address, self.cpus, self.gpus = ray, address, cpus, gpus
        self._task = None

    def nodes(self) -> list[dict]:
        """The resources of each live node."""
        return [n["Resources"] for n in self.ray.nodes() if n["Alive"]]

    def needs(self) -> dict[str, float]:
        return {k: v for k, v in (("CPU", self.cpus), ("GPU", self.gpus)) if v}

    def slots(self) -> int:
        """How many runs the cluster holds at once."""
        fits = [min(int(n.get(k, 0) // v) for k, v in self.needs().items()) for n in self.nodes()]
        return max(1, sum(fits))

    def check(self, out: Path, *, shared_storage: bool = False) -> None:
        """Refuse a cluster where no node has a run's resources, and a local `out` that
        the cluster's other nodes would not see."""
        nodes = self.nodes()
        for key, need in self.needs().items():
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
        options = dict(num_cpus=self.cpus, num_gpus=self.gpus)
        return RayRun(self.ray, self._task.options(**options).remote(args, str(log), WORKER_PYTHON))

    def close(self) -> None:
        self.ray.shutdown()


def check_storage(out: Path, nodes: int, shared: bool, mounts: str = "/proc/mounts") -> None:
    """With several nodes, `out` must be on a network filesystem, or `shared` said."""
    kind = mount_type(out, mounts)
    if nodes > 1 and not shared and not (kind or "").startswith(SHARED_FILESYSTEMS):
        raise BadValue(
            f"the Ray cluster has {nodes} nodes and {out} is on this machine's disk "
            f"({kind or 'unknown'}), which they would not see: choose an --out on storage "
            "every node mounts (NFS, Lustre, a bucket through gcsfuse), or pass "
            "--shared-storage if it is shared"
        )


def mount_type(path: Path, mounts: str = "/proc/mounts") -> str | None:
    """The filesystem type of the mount holding `path` (None where unknown)."""
    try:
        table = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    path, depth, kind = Path(os.path.abspath(path)), -1, None
    for line in table:  # the deepest mount holding it; of equal ones, the last mounted
        fields = line.split()
        point = Path(fields[1].replace("\\040", " ")) if len(fields) > 2 else None
        if point and (point == path or point in path.parents) and len(point.parts) >= depth:
            depth, kind = len(point.parts), fields[2]
    return kind


class RayRun:
    """A submitted task, as the runner sees a local process: poll, returncode,
    send_signal (a stop: the task is cancelled, the run saves its step) and wait."""

    def __init__(self, ray, ref):
        self.ray, self.ref, self.returncode = ray, ref, None

    def poll(self) -> int | None:
        if self.returncode is None and self.ray.wait([self.ref], timeout=0)[0]:
            self.returncode = self._result()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        self.ray.cancel(self.ref, force=False)

    def wait(self) -> int:
        self.ray.wait([self.ref])
        return self.poll()

    def _result(self) -> int:
        try:
            return self.ray.get(self.ref)
        except self.ray.exceptions.TaskCancelledError:  # cancelled before it started
            return 128 + signal.SIGINT
        except self.ray.exceptions.RayError:  # its worker or node died, retries spent
            return -signal.SIGKILL


def run_command(args: list[str], log: str, python: str | None) -> int:
    """On a worker: run `python -m jaxformer *args`, output appended to `log`; resume it
    (the command has --resume) when killed by a signal, up to RESUMES times; on a
    KeyboardInterrupt (ray.cancel) pass SIGINT on and wait while it saves. Its exit code."""
    command = [python or sys.executable, "-m", "jaxformer", *args]
    proc = None
    try:
        for attempt in range(RESUMES + 1):
            proc = _start(command, Path(log))
            while (code := proc.poll()) is None:
                time.sleep(0.2)
            if code >= 0 or attempt == RESUMES:
                return code
            name = signal.Signals(-code).name
            _note(log, f"the run was killed by {name}; resuming it ({attempt + 1} of {RESUMES})")
    except KeyboardInterrupt:  # a stop: the run saves its step
        if proc is None or proc.poll() is not None:
            return 128 + signal.SIGINT
        proc.send_signal(signal.SIGINT)
        return proc.wait()


def _start(command: list[str], log: Path) -> subprocess.Popen:
    """The run's process, with the stop signals that a Ray worker blocks unblocked (a
    child inherits the mask); its node and pid written next to its log."""
    stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    try:
        with open(log, "a") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    task = {"node": socket.gethostname(), "pid": proc.pid}
    (log.parent / TASK_FILE).write_text(json.dumps(task))
    return proc


def _note(log: str, line: str) -> None:
    with open(log, "a") as out:
        out.write(f"jaxformer sweep: {line}\n")
