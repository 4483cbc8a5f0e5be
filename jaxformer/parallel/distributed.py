"""Several processes (hosts) as one JAX program: `jax.distributed.initialize`, checked.

Every process runs the same command with its own `process_id`; process 0 also runs the
coordinator service at `coordinator` (HOST:PORT, reachable from every process). Call
`initialize` before anything else touches JAX devices."""

from __future__ import annotations

import socket
import sys
import time

import jax

from jaxformer.checks import BadValue, Unreachable, as_given


def initialize(
    coordinator: str,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: int = 120,
) -> None:
    """Join the group of `num_processes` processes as `process_id`.

    `coordinator="auto"` lets JAX read everything from the cluster (TPU pod slices, SLURM,
    Open MPI). Arguments out of range are a ValueError. Processes other than 0 wait up to
    `timeout_s` for the coordinator's port (else ConnectionError), then all wait up to
    `timeout_s` for every process to join."""
    if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or timeout_s < 1:
        raise BadValue(
            f"{as_given('timeout_s')} must be a positive int (seconds), got {timeout_s!r}"
        )
    if coordinator == "auto":
        if num_processes is not None or process_id is not None:
            raise BadValue(
                f"{as_given('coordinator', 'auto')} reads the process count and id from the "
                f"cluster; do not also give {as_given('num_processes')} or {as_given('process_id')}"
            )
        kwargs = {}
    else:
        _check_address(coordinator)
        for name, value in (("num_processes", num_processes), ("process_id", process_id)):
            if value is None:
                raise BadValue(
                    f"a coordinator HOST:PORT needs {as_given(name)} too (or use 'auto')"
                )
            if not isinstance(value, int) or isinstance(value, bool):
                raise BadValue(f"{as_given(name)} must be an int with a coordinator, got {value!r}")
        if num_processes < 1:
            raise BadValue(f"{as_given('num_processes')} must be >= 1, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise BadValue(
                f"{as_given('process_id')} must be in [0, {num_processes - 1}] for "
                f"{as_given('num_processes', num_processes)}, got {process_id}"
            )
        kwargs = dict(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
        )
        if process_id == 0:
            print(
                f"process 0: coordinator at {coordinator}, waiting up to {timeout_s} s for "
                f"{num_processes} processes to join",
                file=sys.stderr,
            )
        else:
            _wait_for_port(coordinator, process_id, num_processes, timeout_s)
    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU across processes
    try:
        jax.distributed.initialize(**kwargs, initialization_timeout=timeout_s)
    except RuntimeError as e:  # jaxlib's XlaRuntimeError, where the client raises
        if not any(code in str(e) for code in ("DEADLINE_EXCEEDED", "UNAVAILABLE")):
            raise
        where = f"process {process_id} of {num_processes}" if kwargs else "this process"
        raise Unreachable(
            f"{where} could not join the coordinator at {coordinator} within {timeout_s} s: "
            "check that process 0 runs with the same --coordinator and --num-processes, "
            "that HOST:PORT is reachable from here and the port is open "
            f"({str(e).splitlines()[0]})"
        ) from None


def is_main_process() -> bool:
    """True on process 0, the one that writes logs, metrics and plots."""
    return jax.process_index() == 0


def _wait_for_port(coordinator: str, process_id: int, num_processes: int, timeout_s: int) -> None:
    """Return once the coordinator's port accepts a connection; raise after `timeout_s`."""
    host, _, port = coordinator.rpartition(":")
    host = host.strip("[]")
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, int(port)), timeout=max(min(left, 5.0), 0.1)):
                return
        except OSError as e:
            if left <= 0:
                raise Unreachable(
                    f"process {process_id} of {num_processes} could not reach the coordinator "
                    f"at {coordinator} within {timeout_s} s ({e}); start process 0 with the "
                    "same --coordinator, check HOST:PORT is reachable from here, or raise "
                    "--coordinator-timeout"
                ) from None
            time.sleep(min(1.0, max(left, 0.0)))


def _check_address(coordinator) -> None:
    host, sep, port = str(coordinator).rpartition(":")
    if not (isinstance(coordinator, str) and sep and host and port.isdigit()):
        raise BadValue(
            f"{as_given('coordinator')} must be HOST:PORT (or 'auto'), got {coordinator!r}"
        )
    if not 0 < int(port) < 65536:
        raise BadValue(f"coordinator port must be in [1, 65535], got {port}")
