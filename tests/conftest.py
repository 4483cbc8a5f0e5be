"""Test set-up. XLA_FLAGS must be set before JAX is imported: 8 virtual CPU devices
let the parallelism tests run on one machine."""

import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs are shared by the test workers and the subprocesses the tests start
# (the same train step compiles once, not once per run).
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).parent.parent / ".pytest_cache" / "jax")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "default",
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("default")

assert jax.device_count() == 8 or "xla_force_host_platform_device_count" not in os.environ.get(
    "XLA_FLAGS", ""
), "conftest must run before JAX is imported elsewhere"
