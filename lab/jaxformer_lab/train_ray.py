"""One training run over several hosts, launched on a Ray cluster (`jaxformer train ray`).

`launch` places `hosts` bundles of resources (one per node, STRICT_SPREAD, where the
cluster has that many nodes with room; else PACK, all on one node), asks the first
bundle's node for a free port (the coordinator), then starts one task per bundle, each
running `python -m jaxformer train <options> --coordinator ADDR --num-processes N
--process-id I` as a subprocess with the driver's XLA, JAX and jaxformer variables
(`ray_cluster.forwarded_env`), its output in the run folder's train.process<I>.log. A
stop (Ctrl-C, SIGTERM, SIGHUP) names its signal in the run folder and cancels every task
without force: each passes that signal on to its process, and the run saves its step
together. A process that fails has the others cancelled with SIGINT. Every node needs
the same Python environment, the run folder at the same path, and the coordinator's
port reachable from the others.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from jaxformer.checks import BadValue
from jaxformer.signals import signals_held
from jaxformer_lab import ray_cluster

LOG = "train.process{}.log"  # each process's output, in the run folder
OWN_OPTIONS = ("--coordinator", "--num-processes", "--process-id")  # set per process here
PLACEMENT_SECONDS = 60  # how long the cluster has to free the hosts' resources
FAILURE_GRACE_SECONDS = 60  # after a process failed, the others' time to stop before a kill
POLL_SECONDS = 0.2  # between two looks at the tasks (ray.wait would turn a SIGTERM into Ctrl-C)
WORKER_PYTHON = None  # the interpreter a task runs `jaxformer` with; None: the worker's own


def run_folder(train_args: list[str]) -> Path:
    """The --out of the training options, which must name it; refused: the options this
    command sets for each process."""
    for option in OWN_OPTIONS:
        if any(a == option or a.startswith(option + "=") for a in train_args):
            raise BadValue(
                f"{option} is set for each process by `jaxformer train ray`: leave it out"
            )
    for i, arg in enumerate(train_args):
        if arg.startswith("--out="):
            return Path(arg.removeprefix("--out="))
        if arg == "--out" and i + 1 < len(train_args):
            return Path(train_args[i + 1])
    raise BadValue("give the run folder after --: -- ... --out DIR (every node must see it)")


def strategy(nodes: list[dict], hosts: int, needs: dict[str, float], address: str) -> str:
    """STRICT_SPREAD where `hosts` nodes each hold one process's `needs`, else PACK where
    one node holds them all; else one line saying what the cluster lacks."""
    fits = [min(int(n.get(key, 0) // need) for key, need in needs.items()) for n in nodes]
    if hosts > 1 and sum(f >= 1 for f in fits) >= hosts:
        return "STRICT_SPREAD"
    if max(fits, default=0) >= hosts:
        return "PACK"
    asked = ", ".join(f"{need:g} {key}" for key, need in needs.items())
    raise BadValue(
        f"--hosts {hosts}: the Ray cluster at {address} has room for {sum(fits)} process(es) "
        f"of {asked} ({len(nodes)} node(s)); add nodes, or ask less with --ray-cpus/--ray-gpus/--ray-tpus"
    )


def place(ray, hosts: int, needs: dict[str, float], how: str):
    """A placement group of `hosts` bundles of `needs`, ready (else one line)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([dict(needs)] * hosts, strategy=how)
    if not ray.wait([group.ready()], timeout=PLACEMENT_SECONDS)[0]:
        remove_placement_group(group)
        raise BadValue(
            f"--hosts {hosts}: the Ray cluster did not free {hosts} x {needs} ({how}) within "
            f"{PLACEMENT_SECONDS} s; other work holds them"
        )
    return group


def launch(ray, group, hosts: int, needs: dict, train_args: list[str], out: Path):
    """Start process I of `hosts` in bundle I of `group`: the coordinator's address and
    the tasks' refs."""

    def in_bundle(i: int) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
        return ray_cluster.task_options(needs) | dict(scheduling_strategy=where)

    ray_cluster.clear_stop(out)  # a stop of an earlier launch
    coordinator = ray.get(ray.remote(free_address).options(**in_bundle(0)).remote())
    task, env, refs = ray.remote(max_retries=0)(run_process), ray_cluster.forwarded_env(), []
    for i in range(hosts):
        args = ["train", *train_args, "--coordinator", coordinator]
        args += ["--num-processes", str(hosts), "--process-id", str(i)]
        log = str(out / LOG.format(i))
        refs.append(task.options(**in_bundle(i)).remote(args, log, WORKER_PYTHON, env))
    return coordinator, refs


def wait(ray, refs: list, out: Path) -> list[tuple[int, int]]:
    """(process, exit code) of each task, in the order they ended; when one fails, the
    others are stopped (and killed after FAILURE_GRACE_SECONDS)."""
    ended, pending, failed_at = [], list(refs), None
    while pending:
        with signals_held():  # inside Ray's calls a SIGTERM would become a bare Ctrl-C
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
            for ref in done:
                i = refs.index(ref)
                ended.append((i, ray_cluster.outcome(ray, ref, out / LOG.format(i))))
        if failed_at is None and pending and any(code for _, code in ended):
            failed_at = time.monotonic()
            cancel(ray, pending)
        elif failed_at and time.monotonic() - failed_at > FAILURE_GRACE_SECONDS:
            cancel(ray, pending, force=True)
        time.sleep(0 if done else POLL_SECONDS)  # a stop raises here, in Python, whole
    return ended


def cancel(ray, refs: list, *, force: bool = False) -> None:
    for ref in refs:
        ray.cancel(ref, force=force)


def stop(ray, refs: list, out: Path, signum: int) -> None:
    """Cancel the tasks, each passing `signum` on to its process, and wait for them."""
    ray_cluster.ask_stop(out, signum)
    cancel(ray, refs)
    if refs:
        ray.wait(refs, num_returns=len(refs))
    ray_cluster.clear_stop(out)


def free_address() -> str:
    """On a worker: HOST:PORT, this node's address and a port free on it."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{ray.util.get_node_ip_address()}:{port}"


def run_process(args: list[str], log: str, python: str | None, env: dict[str, str]) -> int:
    """On a worker: `python -m jaxformer *args` with `env` over the worker's environment,
    output appended to `log`; a cancellation is passed on as the stop's signal (the run
    saves its step). Its exit code."""
    command, folder = [python or sys.executable, "-m", "jaxformer", *args], Path(log).parent
    try:
        proc = ray_cluster.start(command, Path(log), env)
    except KeyboardInterrupt:  # cancelled before it started
        return 128 + ray_cluster.stop_signal(folder)
    return ray_cluster.wait_stoppable(proc, folder)
