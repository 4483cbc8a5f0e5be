"""Test set-up. XLA_FLAGS must be set before JAX is imported: 8 virtual CPU devices
let the parallelism tests run on one machine. jax_numpy_rank_promotion="raise" makes an
implicit broadcast between arrays of different ranks an error, in every test and in the
CLI processes the tests start (it is set in the environment); the documentation's examples,
user code, run with JAX's default (tests/lab/test_docs.py). On a GPU the tests that need several devices
(marker `devices(n)`) are skipped, and XLA is asked for deterministic reductions: the
bit-exact resume and determinism tests compare runs to the bit, and GPU scatter-adds
(the embedding gradient) otherwise sum in a varying order. In that mode "auto" attention
does not pick cuDNN (see `functional.choose_implementation`)."""

import importlib.util
import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # make test-gpu: "cuda,cpu" (host callbacks)
_gpu = "cuda" in os.environ["JAX_PLATFORMS"] or "gpu" in os.environ["JAX_PLATFORMS"]
# On a CPU, LLVM optimises the compiled programs less (level 0): the suite's tiny programs
# run about as fast, and a fresh clone's suite, mostly cold compiling, takes less time.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8"
    + (" --xla_gpu_deterministic_ops=true" if _gpu else " --xla_backend_optimization_level=0"),
)
# Compiled programs are shared by the test workers and the subprocesses the tests start
# (the same train step compiles once, not once per run).
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).parent.parent / ".pytest_cache" / "jax")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from jaxformer.data import registry  # noqa: E402

if jax.default_backend() == "gpu":
    # GPU float32 matrix products may run in TF32 (10-bit mantissa); the tests compare
    # float32 results at 1e-5, so they ask for full float32 products.
    jax.config.update("jax_default_matmul_precision", "highest")
    os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"  # and in the CLI subprocesses

settings.register_profile(
    "default",
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("default")

forced = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
assert jax.default_backend() != "cpu" or jax.device_count() == 8 or not forced, (
    "conftest must run before JAX is imported elsewhere"
)


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked `devices(n)` where fewer than n devices are present."""
    for item in items:
        marker = item.get_closest_marker("devices")
        if marker and jax.device_count() < marker.args[0]:
            reason = f"needs {marker.args[0]} devices, {jax.device_count()} present"
            item.add_marker(pytest.mark.skip(reason=reason))


# The lab's tests (tests/lab) need the lab installed (`pip install -e lab`); the library's
# suite runs without it (`make test-library`).
collect_ignore = [] if importlib.util.find_spec("jaxformer_lab") else ["lab"]


def _names_only(name: str):
    raise NotImplementedError(f"dataset {name!r} is a name the tests validate, with no data")


# A dataset family of the tests' own, so the library's config tests need no corpus.
registry.register(
    "tests",
    registry.Family(about="the tests' toy-*", prefix="toy-", check=len, load=_names_only),
)
