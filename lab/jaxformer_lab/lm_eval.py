"""EleutherAI's lm-evaluation-harness over a `DecoderLM` (the lab's `eval` extra):
`JaxformerLM`, lm-eval's model "jaxformer" (made when first used); `evaluate`, which
`jaxformer eval` runs; and `during_training`, a training hook that logs the scores. lm-eval is imported with HF_DATASETS_OFFLINE and
HF_HUB_OFFLINE set (unless set): tasks are local YAML files (`include_path`) over JSONL.

Loglikelihoods batch `batch_size` rows right-padded to a power-of-two width (one compiled
program per width); `generate_until` is `decode.greedy` on the KV cache, cut at the stop
sequences. Tokenization, windows and empty contexts are lm-eval's own (`TemplateLM`), so
scores match its Hugging Face backend on an imported checkpoint."""

from __future__ import annotations

import functools
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.checks import BadValue, MissingFile, MissingPackage, check_instance, check_int
from jaxformer.decode import greedy
from jaxformer.models import DecoderLM


def _lm_eval():
    """lm-eval, imported at first use with Hugging Face's libraries offline."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before lm_eval imports datasets
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import lm_eval
        import lm_eval.models  # its own names ("hf", ...), which a first registration would hide
    except ImportError as e:
        raise MissingPackage(
            f"the LM evaluation harness needs lm-eval ({e}): pip install -e 'lab[eval]'"
        ) from e
    return lm_eval


@functools.cache
def model_class() -> type:
    """`JaxformerLM`: lm-eval's `TemplateLM` with `Methods`, registered as "jaxformer"."""
    _lm_eval()
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model

    cls = type("JaxformerLM", (Methods, TemplateLM), {"__doc__": Methods.__doc__})
    return register_model("jaxformer")(cls)


def __getattr__(name: str):
    if name == "JaxformerLM":  # the class, made (lm-eval imported) at first use
        return model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Methods:
    """A `DecoderLM` and its tokenizer as an lm-eval model: the methods of `JaxformerLM`."""

    def __init__(
        self,
        model: DecoderLM,
        tokenizer,
        *,
        batch_size: int | str = 8,
        max_gen_toks: int | str = 256,
        device: str | None = None,  # lm-eval passes these; JAX places arrays itself
        max_batch_size: int | None = None,
    ):
        super().__init__()
        check_instance("model", model, DecoderLM)
        self.batch_size = _positive("batch_size", batch_size)
        self.max_gen_toks = _positive("max_gen_toks", max_gen_toks)
        self.model, self.tokenizer, self.max_length = model, tokenizer, model.config.max_len
        self._graphdef, self._state = nnx.split(model)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:  # an empty context's, as lm-eval's HF backend's
        return self.tokenizer.bos_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kw) -> list[int]:
        return self.tokenizer.encode(string)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kw):
        """(log-probability of the continuation, whether it is the greedy one) of each
        (key, context tokens, continuation tokens), the row cut to the model's max_len."""
        rows = []
        for _, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1) :]
            if not continuation or len(whole) < 2:
                raise BadValue("a loglikelihood request needs a context and a continuation")
            rows.append((whole[:-1], whole[1:], len(continuation)))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            chunk += chunk[:1] * (self.batch_size - len(chunk))  # one shape a width
            width = _bucket(len(rows[chunk[0]][0]), self.max_length)
            tokens, targets = np.full((2, len(chunk), width), self.tokenizer.pad_id, np.int32)
            scored = np.zeros((len(chunk), width), bool)
            for r, i in enumerate(chunk):
                inputs, targets_i, n = rows[i]
                tokens[r, : len(inputs)], targets[r, : len(inputs)] = inputs, targets_i
                scored[r, len(inputs) - n : len(inputs)] = True
            ll, is_greedy = _score(self._graphdef, self._state, tokens, targets, scored)
            for r, i in enumerate(chunk):
                out[i] = (float(ll[r]), bool(is_greedy[r]))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-probability: lm-eval's disjoint windows of max_len tokens."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        windows, owners = [], []
        for i, (text,) in enumerate(r.args for r in requests):
            tokens = self.tok_encode(text)
            found = get_rolling_token_windows(tokens, self.prefix_token_id, self.max_length, 1)
            windows += [(None, *make_disjoint_window(w)) for w in found]
            owners += [i] * (len(windows) - len(owners))
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owners, self._loglikelihood_tokens(windows), strict=True):
            totals[i] += ll
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations on the KV cache, each cut before its first stop sequence
        (`until`) and after `max_gen_toks` tokens; the context keeps its last tokens."""
        asks = [
            _generation(context, kwargs, self.max_gen_toks)
            for context, kwargs in (r.args for r in requests)
        ]
        out = []
        for start in range(0, len(asks), self.batch_size):
            chunk = asks[start : start + self.batch_size]
            n = min(max(a[2] for a in chunk), self.max_length - 1)
            prompts = [self.tok_encode(a[0])[-(self.max_length - n + 1) :] for a in chunk]
            prompts = [p or [self.prefix_token_id] for p in prompts]
            prompts += prompts[:1] * (self.batch_size - len(chunk))  # one shape a width
            lengths = np.array([len(p) for p in prompts])
            width = min(_bucket(int(lengths.max()), self.max_length), self.max_length - n + 1)
            src = np.full((self.batch_size, width), self.tokenizer.pad_id, np.int32)
            for r, p in enumerate(prompts):
                src[r, : len(p)] = p
            valid = np.arange(width) < lengths[:, None]
            tok = self.tokenizer
            ids = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
            tokens = np.asarray(greedy(self.model, src, valid, max_new_tokens=n, **ids))
            for (_, until, limit), row in zip(chunk, tokens, strict=False):
                text = tok.decode(row[:limit].tolist())
                out.append(functools.reduce(lambda t, s: t.split(s)[0] if s else t, until, text))
        return out


def _positive(name: str, value) -> int:
    """An int option, given as such or as text (lm-eval's model_args)."""
    if not str(value).isdigit() or int(value) < 1:
        raise BadValue(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _bucket(n: int, max_len: int) -> int:
    """The padded width of rows of up to n tokens: a power of two >= 16, <= max_len."""
    return min(max(16, 1 << (n - 1).bit_length()), max(max_len, n))


def _generation(context: str, kwargs: dict, default_tokens: int) -> tuple[str, list[str], int]:
    """(context, stop sequences, most new tokens) of a generate_until request."""
    kwargs = dict(kwargs or {})
    if kwargs.get("do_sample") or kwargs.get("temperature", 0) > 0:
        raise BadValue("jaxformer's lm-eval model decodes greedily; set do_sample: false")
    until = kwargs.get("until") or []
    limit = _positive("max_gen_toks", kwargs.get("max_gen_toks", default_tokens))
    return context, [until] if isinstance(until, str) else list(until), limit


@functools.partial(jax.jit, static_argnums=0)
def _score(graphdef, state, tokens, targets, scored):
    """Per row: the sum of the `scored` targets' log-probs [B], and whether each is the argmax."""
    logits = nnx.merge(graphdef, state)(tokens)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    hits = jnp.argmax(logits, axis=-1) == targets
    return jnp.sum(jnp.where(scored, picked, 0.0), axis=1), jnp.all(hits | ~scored, axis=1)


def evaluate(
    model: DecoderLM,
    tokenizer,
    tasks: list[str],
    *,
    include_path: str | pathlib.Path | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    bootstrap_iters: int = 100_000,
) -> dict:
    """lm-eval's results (`simple_evaluate`: "results", "samples", ...) of `model` on
    `tasks`: the YAML tasks under `include_path`, else lm-eval's own (cached data only)."""
    harness = _lm_eval()
    from lm_eval.tasks import TaskManager

    if include_path is not None and not pathlib.Path(include_path).is_dir():
        raise MissingFile(f"{include_path}: no such folder of task YAML files")
    if limit is not None:
        check_int("limit", limit)
    lm = model_class()(model, tokenizer, batch_size=batch_size)
    where = None if include_path is None else str(include_path)
    manager = TaskManager(include_path=where, include_defaults=where is None)
    if not tasks or (unknown := [t for t in tasks if t not in manager.all_tasks]):
        where = f" in {include_path}" if include_path else "; give their folder (--include-path)"
        raise BadValue(f"no task {unknown or tasks}{where}")
    return harness.simple_evaluate(
        model=lm,
        tasks=[_local(manager, name) for name in tasks],
        task_manager=manager,
        limit=limit,
        bootstrap_iters=bootstrap_iters,
    )


def _local(manager, name: str) -> str | dict:
    """A YAML task's config with its relative data_files read from the YAML's folder (not
    the working directory, as lm-eval would); any other task by name."""
    from lm_eval.tasks.manager import load_yaml  # lm-eval's own YAML reader (with !function)

    path = manager.task_index[name].yaml_path
    config = load_yaml(path, resolve_func=True) if path else {}
    files = config.get("dataset_kwargs", {}).get("data_files") if "task" in config else None
    if not files:
        return name

    def resolved(f):
        if isinstance(f, dict):
            return {k: resolved(v) for k, v in f.items()}
        return [*map(resolved, f)] if isinstance(f, list) else str(pathlib.Path(path).parent / f)

    return config | {"dataset_kwargs": config["dataset_kwargs"] | {"data_files": resolved(files)}}


def scores(results: dict) -> dict[str, float]:
    """The numeric scores, flat: {"TASK/METRIC": value} (standard errors left out)."""
    return {
        f"{task}/{name.split(',')[0]}": float(value)
        for task, metrics in results["results"].items()
        for name, value in metrics.items()
        if isinstance(value, int | float) and "_stderr" not in name
    }


def table(results: dict) -> str:
    """lm-eval's Markdown table of `evaluate`'s scores."""
    _lm_eval()
    from lm_eval.utils import make_table

    return make_table(results)


def run(args) -> int:
    """`jaxformer eval`: the table, the results JSON."""
    from jaxformer.checkpoints import restore_model

    _lm_eval()  # first: Hugging Face's libraries stay offline
    model, tokenizer = restore_model(args.checkpoint)
    tasks = [t for t in args.tasks.split(",") if t]
    options = dict(include_path=args.include_path, limit=args.limit, batch_size=args.batch_size)
    results = evaluate(model, tokenizer, tasks, **options)
    out = pathlib.Path(args.output or pathlib.Path(args.checkpoint) / "eval.json")
    out.write_text(json.dumps(results, indent=1, default=str))
    print(table(results) + f"\nresults and per-example scores: {out}")
    return 0


def during_training(tasks: list[str], include_path: str | None, every: int, limit: int = 64):
    """A `train` hook that scores the run's model on `tasks` after every `every` steps and
    at the end, logging {"step", "lm_eval/TASK/METRIC": value} to metrics.jsonl."""
    from jaxformer.train.loop import Hook

    _lm_eval()  # a missing lm-eval is one line before the run starts

    def score(context) -> None:
        options = dict(include_path=include_path, limit=limit, bootstrap_iters=0)
        results = evaluate(context.model(), context.setup.tokenizer, tasks, **options)
        logged = {f"lm_eval/{name}": value for name, value in scores(results).items()}
        context.folder.log({"step": context.step, **logged})
        context.say(f"step {context.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in logged.items()))

    return Hook(every, score, name="lm-eval tasks", at_end=True)
