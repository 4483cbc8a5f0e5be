"""A run's orbax checkpoints of its TrainState (`Checkpointer`: checkpoints/<step>/, and
averaged/, the mean parameters of the last ones) and `restore_model`, a trained run's
model back, for decoding as for training. A damaged checkpoint is one line naming its
folder, never orbax's traceback."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from jaxformer.checks import BadValue, MissingFile, as_given, check_int
from jaxformer.config import TransformerConfig
from jaxformer.data.tokenizers import Tokenizer, load_tokenizer
from jaxformer.models import MODEL_KINDS
from jaxformer.nn import add_lora

CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"  # the parameters averaged over the last checkpoints, if the run did


class Checkpointer:
    """Saves and restores a TrainState plus JSON metadata in `run_dir/checkpoints`."""

    def __init__(self, run_dir: str | pathlib.Path, *, keep: int = 3):
        check_int("keep", keep)
        self.directory = pathlib.Path(run_dir).resolve() / CHECKPOINTS
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=True,
                cleanup_tmp_directories=True,
                enable_async_checkpointing=False,
            ),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, state: Any, meta: dict[str, Any]) -> None:
        """Write the checkpoint of `state.step` and wait until it is complete on disk."""
        step = int(state.step)
        params, train = _on_disk(state)
        self.manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                train=ocp.args.StandardSave(train),
                meta=ocp.args.JsonSave(meta),
            ),
            force=True,
        )
        self.manager.wait_until_finished()

    def restore(self, abstract: Any, expected_meta: dict[str, Any]) -> tuple[Any, dict]:
        """The latest checkpoint as a TrainState shaped as `abstract` (one of
        ShapeDtypeStructs), after checking it belongs to the same model and run settings as
        `expected_meta` (a mismatch is an error naming the fields)."""
        step = self.latest_step()
        if step is None:
            raise MissingFile(f"no checkpoint to resume from in {self.directory}")
        meta = self.read_meta(step)
        check_compatible(meta, expected_meta, self.directory)
        params, train = _on_disk(abstract)
        args = ocp.args.Composite(
            params=ocp.args.StandardRestore(params), train=ocp.args.StandardRestore(train)
        )
        restored = self._restore(step, args)
        params, train = _from_disk(restored.params), _from_disk(restored.train)
        return abstract.replace(params=params, **train), meta

    def average_params(self, abstract_params, count: int) -> tuple[Any, list[int]]:
        """The mean parameters of the last `count` checkpoints (summed in float32, cast
        back to each parameter's dtype, laid out as `abstract_params`) and their steps."""
        steps = sorted(self.manager.all_steps())[-count:]
        if len(steps) < count:
            raise BadValue(
                f"average_checkpoints={count} but {self.directory} holds {len(steps)} "
                f"checkpoint(s) (steps {steps})"
            )
        args = ocp.args.Composite(params=ocp.args.StandardRestore(_as_variables(abstract_params)))
        total = params = None
        for step in steps:
            params = _from_disk(self._restore(step, args).params)
            total = _add_float32(total, params)
        return _mean(total, params, count), steps

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        step = self.latest_step() if step is None else step
        if step is None:
            raise MissingFile(f"no checkpoint in {self.directory}")
        where = self.directory / str(step)
        try:
            with _reads_awaited():
                meta = self.manager.restore(
                    step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
                ).meta
        except Exception as e:  # orbax raises various errors for damaged folders
            raise BadValue(f"checkpoint {where} cannot be read: {e}") from None
        if not isinstance(meta, dict) or meta.get("model_kind") not in MODEL_KINDS:
            raise BadValue(
                f"checkpoint {where}: its meta names no model kind of {list(MODEL_KINDS)}"
            )
        return meta

    def _restore(self, step: int, args):
        """manager.restore, with a damaged checkpoint reported by `_read`."""
        where = self.directory / str(step)
        advice = "delete that folder to resume from an earlier checkpoint"
        return _read(where, advice, lambda: self.manager.restore(step, args=args))

    def close(self) -> None:
        self.manager.close()


def _read(where: pathlib.Path, advice: str, read: Callable[[], Any]) -> Any:
    """read(), with a damaged (e.g. truncated) checkpoint reported in one line naming its
    folder `where`, with `advice`, instead of orbax's or TensorStore's traceback."""
    try:
        with _reads_awaited():
            return read()
    except Exception as e:
        cause = str(e.__cause__ or e).strip().splitlines()[0][:300]
        raise BadValue(
            f"checkpoint {where} cannot be read ({cause}); it may be truncated or damaged: "
            + advice
        ) from None


@contextlib.contextmanager
def _reads_awaited():
    """Orbax runs a restore in a new event loop that it closes as soon as the restore
    returns or raises: after one array's read fails, the other reads are left unfinished,
    and each prints a traceback when TensorStore completes it or Python collects it (after
    the error line, up to exit). Meanwhile, a new event loop awaits its unfinished tasks
    (those reads) before closing. They are not cancelled: cancelling a TensorStore read
    whose result is arriving can deadlock."""
    new_event_loop = asyncio.new_event_loop

    def awaiting_loop():
        loop = new_event_loop()
        close = loop.close

        def await_then_close():
            if not loop.is_closed() and (left := asyncio.all_tasks(loop)):
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            close()

        with contextlib.suppress(AttributeError):  # a loop of C code (uvloop) stays as it is
            loop.close = await_then_close
        return loop

    asyncio.new_event_loop = awaiting_loop
    try:
        yield
    finally:
        asyncio.new_event_loop = new_event_loop


@jax.jit
def _add_float32(total, params):
    """total + params, summed in float32 (total None: params alone)."""
    params = jax.tree.map(lambda p: p.astype(jnp.float32), params)
    return params if total is None else jax.tree.map(jnp.add, total, params)


@functools.partial(jax.jit, static_argnums=2)
def _mean(total, like, count: int):
    """total / count in the dtypes of `like`."""
    return jax.tree.map(lambda t, p: (t / count).astype(p.dtype), total, like)


def check_compatible(saved: dict, expected: dict, where) -> None:
    """Raise if a checkpoint's model or run settings differ from this run's."""
    problems = []
    if saved.get("model_kind") != expected.get("model_kind"):
        problems.append(
            f"model {saved.get('model_kind')} (checkpoint) vs {expected.get('model_kind')} (now)"
        )
    for section in ("model_config", "run"):
        old, new = saved.get(section, {}), expected.get(section, {})
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                problems.append(
                    f"{as_given(key, old.get(key))} (checkpoint) vs {new.get(key)!r} (now)"
                )
    if problems:
        raise BadValue(
            f"the checkpoint in {where} was written for a different configuration: "
            + "; ".join(problems)
        )


def _as_variables(params):
    """Parameters (plain arrays) as checkpoints hold them: each under the key "value", as
    nnx Variables are written (so folders written before the state was plain resume)."""
    return jax.tree.map(lambda x: {"value": x}, params)


def _on_disk(state: Any) -> tuple[Any, dict]:
    """(params, the rest) of a TrainState as a checkpoint holds them: the parameters and
    every optimizer-state entry shaped like them (Adam's moments) `_as_variables`."""
    structure = jax.tree.structure(state.params)

    def as_variables(tree):
        return _as_variables(tree) if jax.tree.structure(tree) == structure else tree

    opt_state = jax.tree.map(
        as_variables, state.opt_state, is_leaf=lambda t: jax.tree.structure(t) == structure
    )
    return _as_variables(state.params), dict(step=state.step, opt_state=opt_state, rng=state.rng)


def _from_disk(tree):
    """`tree` with each {"value": x} of `_as_variables` as x."""
    is_variable = lambda t: isinstance(t, dict) and list(t) == ["value"]  # noqa: E731
    return jax.tree.map(lambda t: t["value"] if is_variable(t) else t, tree, is_leaf=is_variable)


def save_averaged(run_dir: str | pathlib.Path, params) -> None:
    """Write averaged parameters to run_dir/averaged, replacing any there (every process
    calls this)."""
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(pathlib.Path(run_dir).resolve() / AVERAGED, _as_variables(params), force=True)
    checkpointer.wait_until_finished()
    checkpointer.close()


def restore_model(run_dir: str | pathlib.Path) -> tuple[nnx.Module, Tokenizer]:
    """The trained model and tokenizer of a run folder (its averaged parameters if the
    run averaged checkpoints, else the latest checkpoint's), or those of a Hugging Face
    model folder (see `interop.hf.load`). The parameters go to this process's first
    device, whatever mesh the run trained on; `decode.generate(model, tokenizer, texts)`
    decodes with them. A missing folder is a FileNotFoundError, a damaged checkpoint or
    tokenizer a ValueError naming it."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise MissingFile(f"{run_dir}: no such run folder")
    if not (run_dir / CHECKPOINTS).is_dir():
        from jaxformer.interop import hf  # a model folder: only then the converter

        if hf.is_model_folder(run_dir):
            return hf.load(run_dir)
        raise MissingFile(
            f"{run_dir}: neither a `jaxformer train --out` folder (no {CHECKPOINTS}/) nor a "
            "Hugging Face model folder (config.json and safetensors weights)"
        )
    tokenizer = load_tokenizer(run_dir)
    checkpointer = Checkpointer(run_dir)
    meta = checkpointer.read_meta()
    config = TransformerConfig.from_dict(meta["model_config"])
    cls = MODEL_KINDS[meta["model_kind"]]
    run = meta.get("run", {})  # a LoRA run's adapters, rebuilt to restore them
    lora = dict(alpha=run.get("lora_alpha"), targets=run.get("lora_targets"))
    adapted = lambda m: add_lora(m, run["lora_rank"], **lora) if run.get("lora_rank") else m  # noqa: E731
    abstract = nnx.eval_shape(lambda: adapted(cls(config, rngs=nnx.Rngs(0))))
    graphdef, abstract_params = nnx.split(abstract)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract_params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract_params
    )
    if (run_dir / AVERAGED).is_dir():
        averaged = (run_dir / AVERAGED).resolve()
        advice = "delete that folder to use the latest checkpoint"
        with ocp.StandardCheckpointer() as reader:
            params = _read(averaged, advice, lambda: reader.restore(averaged, abstract_params))
    else:
        params = checkpointer._restore(
            checkpointer.latest_step(),
            ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params)),
        ).params
    checkpointer.close()
    return nnx.merge(graphdef, params), tokenizer


def abstract_train_state(state: Any) -> Any:
    """Shapes, dtypes and shardings of `state`, as the restore target: a state laid out
    over a mesh is restored with the same layout, each process reading only its pieces."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
