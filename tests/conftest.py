"""Test set-up. XLA_FLAGS must be set before JAX is imported: 8 virtual CPU devices
let the parallelism tests run on one machine."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
