"""Argument checks, each written once: a wrong type is a TypeError, a wrong value a
ValueError, and the message names the argument, what was given and what was expected.

Every input error the package raises is an `InputError`, of a kind that is also the
built-in exception Python code expects (`BadValue` is a ValueError, ...); the `jaxformer`
command reports it in one line with exit code 2. Input used in part (a torn metrics line)
is an `InputWarning`."""

from __future__ import annotations

import contextlib
import contextvars
import math
import types

import numpy as np


class InputError(Exception):
    """Input the caller got wrong: an argument, a config, a file, a missing package."""


class BadValue(InputError, ValueError):
    """A value out of range, an impossible combination, a malformed file."""


class BadType(InputError, TypeError):
    """An argument of the wrong type."""


class MissingFile(InputError, FileNotFoundError):
    """A file or folder that does not exist."""


class MissingPackage(InputError, ImportError):
    """An optional package that is not installed."""


class Unreachable(InputError, ConnectionError):
    """A coordinator (another process) that cannot be reached."""


class InputWarning(UserWarning):
    """Input the package could use only in part, and says what it left out."""


_FLAGS = contextvars.ContextVar("flags", default=types.MappingProxyType({}))  # name -> flag


@contextlib.contextmanager
def _flags_set(flags: dict[str, str]):
    token = _FLAGS.set(flags)
    try:
        yield
    finally:
        _FLAGS.reset(token)


def command_line(flags: dict[str, str]):
    """Inside, `as_given` names each argument of `flags` as the command's flag that gives
    it: {"batch_size": "--batch-size", "implementation": "--attention-impl", ...}."""
    return _flags_set(dict(flags))


def named_as_fields(names):
    """Inside, the arguments `names` (a file's fields: values a run file gave, not flags)
    are named as fields."""
    return _flags_set({k: v for k, v in _FLAGS.get().items() if k not in set(names)})


def as_given(name: str, *value) -> str:
    """The argument `name` (a config field or a keyword), with its value if one is given,
    as the caller gives it: on the command line its flag ("--steps", "--steps=0",
    "--resume", "--lr=none"), else the Python argument ("steps", "steps=0", "lr=None").
    The one way an error names an option."""
    flag = _FLAGS.get().get(name)
    if flag is None:
        return name if not value else f"{name}={value[0]!r}"
    if not value or value[0] is True:
        return flag
    if value[0] is False:
        return f"--no-{flag[2:]}"
    return f"{flag}={'none' if value[0] is None else value[0]}"


def is_int(x) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


INT32_MAX = 2**31 - 1  # steps, sizes and counts live in int32 arrays under jit


def check_int(name: str, value, minimum: int | None = 1, maximum: int = INT32_MAX) -> None:
    """An int (not a bool) in [minimum, maximum] (no lower bound with minimum=None)."""
    if not is_int(value):
        raise BadType(f"{as_given(name)} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise BadValue(f"{as_given(name)} must be >= {minimum}, got {value}")
    if value > maximum:
        raise BadValue(f"{as_given(name)} must be <= {maximum:,}, got {value:,}")


def check_number(name: str, value, interval: str) -> None:
    """A real number in `interval`, written as in mathematics: "[0, 1)", "(0, inf)"."""
    if not isinstance(value, int | float | np.integer | np.floating) or isinstance(value, bool):
        raise BadType(f"{as_given(name)} must be a number, got {value!r}")
    low, high = (float(x) for x in interval[1:-1].split(","))
    above = value > low if interval[0] == "(" else value >= low
    below = value < high if interval[-1] == ")" else value <= high
    if above and below and math.isfinite(value):
        return
    if math.isinf(high):
        bound = f"{'>' if interval[0] == '(' else '>='} {low:g}"
        raise BadValue(f"{as_given(name)} must be {bound}, got {value}")
    raise BadValue(f"{as_given(name)} must be in {interval}, got {value}")


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise BadType(f"{as_given(name)} must be a bool, got {value!r}")


def check_instance(name: str, value, cls: type | tuple[type, ...]) -> None:
    """isinstance(value, cls), else a TypeError naming the expected and the given type."""
    if not isinstance(value, cls):
        names = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise BadType(f"{as_given(name)} must be a {names}, got {type(value).__name__}")


def check_choice(name: str, value, allowed) -> None:
    """One of the names in `allowed` (a wrong type, such as a number, is a TypeError)."""
    if not isinstance(value, str):
        raise BadType(f"{as_given(name)} must be a string, one of {tuple(allowed)}, got {value!r}")
    if value not in allowed:
        raise BadValue(f"{as_given(name)} must be one of {tuple(allowed)}, got {value!r}")


def check_divisible(name: str, value: int, by_name: str, by: int) -> None:
    """value % by == 0, e.g. d_model by num_heads."""
    if by < 1 or value % by:
        raise BadValue(f"{as_given(name, value)} is not divisible by {as_given(by_name, by)}")


def check_even(name: str, value: int, user: str) -> None:
    """An even size, as `user` (e.g. "sinusoidal positions") needs."""
    if value % 2:
        raise BadValue(f"{user} need an even {as_given(name)}, got {value}")


# --- arrays (static shapes and dtypes; JAX, for its dtypes, is imported only here) ---------


def check_rank(name: str, x, rank: int, layout: str = "") -> None:
    ndim = np.ndim(x)
    if ndim != rank:
        want = f" {layout}" if layout else ""
        raise BadValue(
            f"{name} must have rank {rank}{want}, got shape {tuple(np.shape(x))} (rank {ndim})"
        )


def check_shape(name: str, x, shape: tuple[int, ...], layout: str) -> None:
    if tuple(np.shape(x)) != tuple(shape):
        raise BadValue(
            f"{name} must have shape {layout} = {tuple(shape)}, got {tuple(np.shape(x))}"
        )


def check_broadcastable(name: str, x, target: tuple[int, ...], layout: str) -> None:
    shape = tuple(np.shape(x))
    if len(shape) > len(target):
        raise BadValue(f"{name} of shape {shape} has more dimensions than {layout} = {target}")
    padded = (1,) * (len(target) - len(shape)) + shape
    if any(s not in (1, t) for s, t in zip(padded, target, strict=True)):
        raise BadValue(f"{name} of shape {shape} is not broadcastable to {layout} = {target}")


def check_float_array(name: str, x) -> None:
    import jax.numpy as jnp

    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise BadType(f"{name} must be a floating-point array, got dtype {jnp.result_type(x)}")


def check_int_array(name: str, x, what: str = "of token ids") -> None:
    import jax.numpy as jnp

    if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
        raise BadType(f"{name} must be an integer array {what}, got dtype {jnp.result_type(x)}")


def check_bool_array(name: str, x, what: str = "(True = attend)") -> None:
    import jax.numpy as jnp

    if jnp.result_type(x) != jnp.bool_:
        raise BadType(f"{name} must be a boolean array {what}, got dtype {jnp.result_type(x)}")
