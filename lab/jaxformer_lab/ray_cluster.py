"""The Ray plumbing the lab's commands share (`jaxformer sweep --ray`, `jaxformer train ray`).

`join` connects to a cluster ("auto", "HOST:PORT", or "local": a head on this machine,
with token authentication unless RAY_AUTH_MODE says otherwise), after a quick probe of
the address, without Ray's progress lines, and turns Ray's failures into one-line input
errors (`jaxformer.checks`). `check_storage` refuses a folder on this machine's disk
when several nodes would write it. On a worker, `start` runs a command as a subprocess,
with the driver's `forwarded_env` and the stop signals a Ray worker blocks unblocked,
and `wait_stoppable` waits for it, passing a cancellation (KeyboardInterrupt,
`ray.cancel(force=False)`) on as the signal the driver's stop named beside the run
(`ask_stop`: a cancellation carries none; SIGINT where none is named), so that the run
saves its step and exits as a local run would.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from jaxformer.checks import BadValue, MissingPackage, Unreachable

# Storage every node can mount (/proc/mounts types); a local disk is none of them.
SHARED_FILESYSTEMS = ("nfs", "cifs", "smb3", "lustre", "gpfs", "ceph", "beegfs", "fuse.")
CONNECT_SECONDS = 5  # how long an address has to answer
STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
AUTH_MODE = "RAY_AUTH_MODE"  # Ray's token authentication: "token" or "disabled"
LOOPBACK = "127.0.0.1"  # the address of a head started here
STOP_FILE = "ray_stop"  # beside a run: the name of the signal its stop passes on
TASK_FAILED = 70  # a run whose Ray task raised (EX_SOFTWARE): failed, not interrupted
# The driver's variables that shape a run: XLA's and JAX's flags, and jaxformer's own.
FORWARDED = ("XLA_FLAGS", "XLA_PYTHON_CLIENT_", "LIBTPU_INIT_ARGS", "JAX_", "JAXFORMER_")


def import_ray(*, head_here: bool = False):
    """Ray; for a head started here, Ray's own default of token authentication chosen
    (unless RAY_AUTH_MODE says otherwise) before Ray first reads it, as it does on import,
    so that Ray has nothing to warn of."""
    if head_here and "ray" not in sys.modules:
        os.environ.setdefault(AUTH_MODE, "token")
    try:
        import ray
    except ImportError:
        raise MissingPackage(
            "--ray needs Ray: pip install 'jaxformer-lab[ray]' (here and on every node)"
        ) from None
    return ray


def join(address: str):
    """Ray, connected to the cluster at `address` ("local": a head started here)."""
    ray = import_ray(head_here=address == "local")
    if address not in ("auto", "local"):
        probe(address)
    held = signal.getsignal(signal.SIGTERM)  # ray.init's handler would exit, not stop the runs
    quiet = dict(log_to_driver=False, logging_level=logging.WARNING)  # no progress lines
    try:
        if address == "local":
            ray.init(address="local", include_dashboard=False, _node_ip_address=LOOPBACK, **quiet)
        else:
            ray.init(address=address, **quiet)
    except ConnectionError as e:
        raise Unreachable(f"--ray {address}: {one_line(e)}") from None
    except RuntimeError as e:
        if not str(e).startswith("Version mismatch"):
            raise
        raise BadValue(
            f"--ray {address}: the cluster runs another Ray or Python than this one "
            f"({one_line(e)}); install the cluster's versions here"
        ) from None
    finally:
        if held is not None:
            signal.signal(signal.SIGTERM, held)
    return ray


def probe(address: str) -> None:
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


def one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def live_nodes(ray) -> list[dict]:
    """The resources of each live node."""
    return [n["Resources"] for n in ray.nodes() if n["Alive"]]


def run_needs(ray, cpus: float, gpus: float | None, tpus: float | None) -> dict[str, float]:
    """What one run's process asks of the cluster: `cpus` CPUs; `gpus` GPUs (None: 1 where
    the cluster has GPUs); `tpus` TPU chips (None: a whole TPU host's where it has TPUs,
    since one JAX process drives every chip of its host)."""
    if gpus is None:
        gpus = 1 if ray.cluster_resources().get("GPU", 0) else 0
    if tpus is None:
        tpus = max((n.get("TPU", 0) for n in live_nodes(ray)), default=0)
    return {k: v for k, v in (("CPU", cpus), ("GPU", gpus), ("TPU", tpus)) if v}


def task_options(needs: dict[str, float]) -> dict:
    """`needs` as Ray task options (TPUs are a custom resource to Ray)."""
    options = dict(num_cpus=needs.get("CPU", 0), num_gpus=needs.get("GPU", 0))
    return options | ({"resources": {"TPU": needs["TPU"]}} if "TPU" in needs else {})


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


def forwarded_env(environ=os.environ) -> dict[str, str]:
    """The variables of `environ` (the driver's) that each run on a worker gets: FORWARDED."""
    return {key: value for key, value in environ.items() if key.startswith(FORWARDED)}


def ask_stop(folder: Path, signum: int) -> None:
    """Name, beside the run in `folder`, the signal a cancellation of its task passes on."""
    (Path(folder) / STOP_FILE).write_text(signal.Signals(signum).name)


def stop_signal(folder: Path) -> int:
    """The signal `ask_stop` named beside the run in `folder` (SIGINT where none)."""
    try:
        return signal.Signals[(Path(folder) / STOP_FILE).read_text().strip()]
    except (OSError, KeyError):
        return signal.SIGINT


def outcome(ray, ref, log: Path) -> int:
    """A finished task's exit code: its run's; 128 + the stop's signal when it was
    cancelled before it started; TASK_FAILED, with the error's line appended to `log`,
    when the task's own code raised; -SIGKILL when its worker or node died."""
    try:
        return ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return 128 + stop_signal(Path(log).parent)
    except ray.exceptions.RayTaskError as error:
        cause = error.cause if isinstance(error.cause, Exception) else error
        with open(log, "a") as out:
            out.write(f"the Ray task failed: {type(cause).__name__}: {one_line(cause)}\n")
        return TASK_FAILED
    except ray.exceptions.RayError:  # its worker or node died, retries spent
        return -signal.SIGKILL


def clear_stop(folder: Path) -> None:
    (Path(folder) / STOP_FILE).unlink(missing_ok=True)


def start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`command`, its output appended to `log`, with `env` over the worker's environment
    and the stop signals that a Ray worker blocks unblocked (a child inherits the mask)."""
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    try:
        with open(log, "a") as out:
            env = dict(os.environ, **env)
            return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def wait_stoppable(proc: subprocess.Popen, folder: Path) -> int:
    """`proc`'s exit code; a KeyboardInterrupt meanwhile (a cancelled task) is passed on as
    the signal named in `folder` (`stop_signal`), and the run is waited for while it saves
    (a run that the signal kills: 128 + its number)."""
    try:
        while (code := proc.poll()) is None:
            time.sleep(0.2)
        return code
    except KeyboardInterrupt:
        if proc.poll() is not None:
            return proc.returncode
        proc.send_signal(stop_signal(folder))
        code = proc.wait()
        return 128 - code if code < 0 else code
