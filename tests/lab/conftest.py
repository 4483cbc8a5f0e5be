"""Fixtures of the lab's tests: `head`, a Ray head on this machine for a test module."""

import os
import subprocess
import sys

import pytest

HEAD = """
import sys, ray
ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@pytest.fixture(scope="module")
def head():
    """A Ray head on this machine, 2 CPUs, owned by a process of ours; its address. (It
    and the drivers of the tests leave Ray's token authentication off.)"""
    mode = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = dict(os.environ, XLA_FLAGS="", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen(
        [sys.executable, "-c", HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    address = proc.stdout.readline().decode().strip()
    try:
        assert address, "the Ray head did not start"
        yield address
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        os.environ.pop("RAY_AUTH_MODE")
        if mode is not None:
            os.environ["RAY_AUTH_MODE"] = mode
