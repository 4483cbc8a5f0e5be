"""The training loop: data, model, optimizer, jitted steps, evaluation, checkpoints,
metrics, plots and a readable end-of-run report.

Everything a run produces goes to `RunConfig.out`:
    metrics.jsonl    one JSON object per logged step and per evaluation
    summary.json     final metrics, timings, parameter count, the configs
    checkpoints/     orbax checkpoints (the last `keep` of them)
    tokenizer.json   the tokenizer, for `jaxformer generate`
    loss.png         train and held-out loss, held-out accuracy and exact match
    attention.png    cross-attention of a held-out example, per layer and head

`RunConfig.mesh` ("data=2,fsdp=2,tensor=2") or `RunConfig.pmap` spread the run over
devices (`jaxformer.parallel`). On several processes (after `parallel.initialize`) every
process runs this same loop: each builds the global batch (a pure function of seed and
index) and transfers only its own rows; checkpoints are written by all together (orbax);
only process 0 writes metrics, the summary, plots and prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import pathlib
import signal
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import decode
from jaxformer.config import TransformerConfig
from jaxformer.data import BPETokenizer, ByteTokenizer, TaskData, TextData, TsvData
from jaxformer.data.datasets import encode_pairs, read_text_lines
from jaxformer.models import DecoderLM, Transformer, count_params
from jaxformer.parallel.mesh import parse_mesh
from jaxformer.parallel.placement import host_copy, make_placement
from jaxformer.train import plots
from jaxformer.train.checkpoint import Checkpointer, abstract_train_state
from jaxformer.train.losses import LossSums
from jaxformer.train.optim import make_optimizer, make_schedule
from jaxformer.train.steps import create_train_state


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What to train on and how (the model itself is a TransformerConfig)."""

    task: str | None = "dates"  # a synthetic task, or None with data_tsv / data_text
    data_tsv: str | None = None
    data_text: str | None = None
    tokenizer: str = "byte"  # "byte" | "bpe" (trained on the data file)
    bpe_vocab_size: int = 8000
    seq_len: int = 128  # rows of packed text (language modelling)
    steps: int = 1500
    batch_size: int = 64
    accum_steps: int = 1
    schedule: str = "cosine"  # "paper" | "cosine" | "constant"
    lr: float | None = None  # peak lr (default 3e-3); a multiplier for "paper" (default 1)
    warmup_steps: int | None = None  # default: 10% of steps (cosine), 4000 (paper)
    optimizer: str = "adam"
    weight_decay: float = 0.0
    clip_norm: float | None = 1.0
    eval_every: int = 250
    log_every: int = 10
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    eval_examples: int = 1000
    seed: int = 0
    out: str = "runs/dates"
    mesh: str | None = None  # e.g. "data=2,fsdp=2,tensor=2" (jaxformer.parallel.make_mesh)
    pmap: bool = False  # data parallel with jax.pmap over the local devices

    def __post_init__(self):
        sources = [x for x in (self.task, self.data_tsv, self.data_text) if x]
        if len(sources) != 1:
            raise ValueError("give exactly one of task, data_tsv, data_text")
        for name in (
            "steps", "batch_size", "accum_steps", "eval_every", "log_every",
            "checkpoint_every", "keep_checkpoints", "eval_examples", "seq_len",
        ):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.batch_size % self.accum_steps:
            raise ValueError(
                f"batch_size={self.batch_size} must be divisible by accum_steps={self.accum_steps}"
            )
        if self.mesh is not None:
            parse_mesh(self.mesh)
            if self.pmap:
                raise ValueError("give a mesh or pmap, not both")
        if self.tokenizer not in ("byte", "bpe"):
            raise ValueError(f"tokenizer must be 'byte' or 'bpe', got {self.tokenizer!r}")
        if self.tokenizer == "bpe" and self.task:
            raise ValueError(
                "the BPE tokenizer is trained on a data file; use it with data_tsv or data_text"
            )

    @property
    def peak_lr(self) -> float | None:
        """The lr given to the schedule: as given, else 3e-3 (None = 1x for "paper")."""
        if self.lr is not None or self.schedule == "paper":
            return self.lr
        return 3e-3

    @property
    def warmup(self) -> int:
        """Warm-up steps: as given, else the paper's 4000 or a tenth of the run."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return 4000 if self.schedule == "paper" else max(1, self.steps // 10)

    def resume_settings(self) -> dict[str, Any]:
        """The settings a resumed run must share with the checkpoint to continue exactly.

        `steps` may grow on resume, except with the cosine schedule, whose shape depends
        on the total number of steps.
        """
        keep = (
            "task", "data_tsv", "data_text", "tokenizer", "bpe_vocab_size", "seq_len",
            "batch_size", "accum_steps", "schedule", "lr", "warmup_steps", "optimizer",
            "weight_decay", "clip_norm", "seed",
        )  # fmt: skip
        settings = {k: getattr(self, k) for k in keep}
        settings["cosine_total_steps"] = self.steps if self.schedule == "cosine" else None
        return settings


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def build_data(run: RunConfig, out: pathlib.Path):
    """The tokenizer (saved to `out`) and the dataset of a run."""
    if run.tokenizer == "bpe":
        path = run.data_tsv or run.data_text
        lines = [line for _, line in read_text_lines(path)]
        tokenizer = BPETokenizer.train(lines, run.bpe_vocab_size)
    else:
        tokenizer = ByteTokenizer()
    if run.task:
        data = TaskData(run.task, tokenizer, seed=run.seed, test_size=run.eval_examples)
    elif run.data_tsv:
        data = TsvData(
            run.data_tsv, tokenizer, max_len=run.seq_len, seed=run.seed, test_size=run.eval_examples
        )
    else:
        data = TextData(run.data_text, tokenizer, seq_len=run.seq_len, seed=run.seed)
    return tokenizer, data


def train(
    model_config: TransformerConfig,
    run: RunConfig,
    *,
    resume: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Train, evaluate and report; returns the summary (also written to summary.json).

    `model_config.vocab_size` is replaced by the tokenizer's. With `resume`, continue from
    the latest checkpoint in `run.out` if there is one. Raises TrainingDiverged on
    a NaN or infinite loss (the last good checkpoint stays intact) and re-raises
    KeyboardInterrupt after saving a checkpoint of the last completed step.
    """
    out = pathlib.Path(run.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, data = build_data(run, out)
    config = model_config.replace(vocab_size=tokenizer.vocab_size)
    if config.max_len < data.max_len:
        raise ValueError(
            f"the data needs sequences of {data.max_len} tokens but max_len={config.max_len}"
        )
    cls = DecoderLM if data.kind == "lm" else Transformer
    model = cls(config, rngs=nnx.Rngs(run.seed))
    schedule = make_schedule(
        run.schedule,
        lr=run.peak_lr,
        d_model=config.d_model,
        warmup_steps=run.warmup,
        total_steps=run.steps,
    )
    optimizer = make_optimizer(
        schedule, name=run.optimizer, weight_decay=run.weight_decay, clip_norm=run.clip_norm
    )
    graphdef, state = create_train_state(model, optimizer, run.seed)
    place = make_placement(
        parse_mesh(run.mesh) if run.mesh else ("pmap" if run.pmap else None),
        graphdef,
        optimizer,
        schedule,
        state,
        label_smoothing=config.label_smoothing,
        batch_size=run.batch_size,
        accum_steps=run.accum_steps,
    )
    state = place.put_state(state)
    params_count = count_params(model)
    main = jax.process_index() == 0
    del model

    meta = {
        "model_kind": cls.__name__,
        "model_config": config.to_dict(),
        "run": run.resume_settings(),
    }
    checkpointer = Checkpointer(out, keep=run.keep_checkpoints)
    metrics_path = out / "metrics.jsonl"
    if resume and checkpointer.latest_step() is not None:
        state, _ = checkpointer.restore(abstract_train_state(place.saved(state)), meta)
        state = place.put_state(state)
        if main:
            _truncate_metrics(metrics_path, _step(state))
            print(f"resumed from step {_step(state)} in {checkpointer.directory}")
    elif resume:
        if main:
            print(f"no checkpoint in {checkpointer.directory} yet: starting from step 0")
            _truncate_metrics(metrics_path, 0)
    elif checkpointer.latest_step() is not None:
        raise ValueError(
            f"{out} already holds checkpoints (latest step {checkpointer.latest_step()}); "
            "pass --resume to continue that run, or choose another --out"
        )
    elif main:
        metrics_path.write_text("")
    if main:
        tokenizer.save(out)
        (out / "config.json").write_text(
            json.dumps({"model": config.to_dict(), "run": dataclasses.asdict(run)}, indent=1)
        )
        if place.mesh is not None or run.pmap:
            print(f"training on {place.description}")

    def save(state):
        checkpointer.save(place.saved(state), meta | {"data_position": _step(state)})

    def log(record):
        if main:
            with metrics_path.open("a") as f:
                f.write(json.dumps(record) + "\n")

    start_step = _step(state)
    bar = _progress(progress and main, start_step, run.steps)
    t_start, tokens_done, last_eval = time.perf_counter(), 0, {}
    window_t, window_tokens = time.perf_counter(), 0
    try:
        for step in range(start_step, run.steps):
            batch = data.train_batch(step, run.batch_size)
            with _interrupt_after():
                state, m = place.train_step(state, batch)
            loss = float(m["loss"])
            if not math.isfinite(loss):
                raise TrainingDiverged(
                    f"the training loss became {loss} at step {step + 1}; the last good "
                    f"checkpoint (step {checkpointer.latest_step()}) is intact in {checkpointer.directory}"
                )
            n_tokens = int(m["tokens"])
            tokens_done += n_tokens
            window_tokens += n_tokens
            done = step + 1
            if done % run.log_every == 0 or done == run.steps:
                now = time.perf_counter()
                record = {"step": done, **{k: float(v) for k, v in m.items() if k != "tokens"}}
                record["tokens_per_second"] = window_tokens / max(now - window_t, 1e-9)
                window_t, window_tokens = now, 0
                log(record)
                bar.set_postfix(
                    loss=f"{record['loss']:.3f}",
                    lr=f"{record['lr']:.2e}",
                    tok_s=f"{record['tokens_per_second']:,.0f}",
                )
            if done % run.eval_every == 0 or done == run.steps:
                last_eval = evaluate(
                    place.eval_step, graphdef, place.params(state), data, tokenizer, run
                )
                log({"step": done, **last_eval})
                if main:
                    bar.write(_eval_line(done, last_eval))
            if done % run.checkpoint_every == 0 or done == run.steps:
                save(state)
            bar.update(1)
    except KeyboardInterrupt:
        bar.close()
        if _step(state) > (checkpointer.latest_step() or 0):
            save(state)
        if main:
            print(
                f"\ninterrupted: saved step {_step(state)} in {checkpointer.directory}; continue with --resume"
            )
        raise
    finally:
        bar.close()
    wall = time.perf_counter() - t_start

    summary = {
        "steps": _step(state),
        "wall_seconds": round(wall, 2),
        "train_tokens_per_second": round(tokens_done / max(wall, 1e-9), 1),
        "params": params_count,
        "exact_match": last_eval.get("exact_match"),
        "token_accuracy": last_eval.get("eval_token_accuracy"),
        "eval_loss": last_eval.get("eval_loss"),
        "eval_perplexity": last_eval.get("eval_perplexity"),
        "device": str(jax.devices()[0].device_kind),
        "layout": place.description,
        "model_kind": cls.__name__,
        "model_config": config.to_dict(),
        "run": dataclasses.asdict(run),
    }
    params = host_copy(place.params(state))  # all processes take part; then only process 0
    checkpointer.close()
    if not main:
        return summary
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    model = nnx.merge(graphdef, params)
    plots.loss_curves(metrics_path, out / "loss.png")
    examples = []
    if data.kind == "seq2seq":
        plots.cross_attention(model, tokenizer, data.test_pairs[0], out / "attention.png")
        examples = _examples(model, tokenizer, data, n=8, batch_size=run.batch_size)
    _report(summary, examples, out)
    return summary


def evaluate(eval_step, graphdef, params, data, tokenizer, run: RunConfig) -> dict[str, float]:
    """Held-out loss, NLL, perplexity and token accuracy; exact match by greedy decoding."""
    sums = None
    for batch in data.eval_batches(run.batch_size):
        s = eval_step(params, batch)
        sums = s if sums is None else LossSums(*(a + b for a, b in zip(sums, s, strict=True)))
    m = {f"eval_{k}": float(v) for k, v in sums.means().items() if k != "tokens"}
    if data.kind == "seq2seq":
        model = nnx.merge(graphdef, params)
        predictions = predict(
            model, tokenizer, data, [src for src, _ in data.test_pairs], run.batch_size
        )
        m["exact_match"] = float(
            np.mean([p == t for p, (_, t) in zip(predictions, data.test_pairs, strict=True)])
        )
    return m


def predict(model, tokenizer, data, sources: list[str], batch_size: int) -> list[str]:
    """Greedy translations of `sources` (padded to fixed batches: one compilation)."""
    out = []
    for i in range(0, len(sources), batch_size):
        chunk = sources[i : i + batch_size]
        pairs = [(s, "") for s in chunk] + [None] * (batch_size - len(chunk))
        batch = encode_pairs(pairs, tokenizer, data.src_len, data.tgt_len)
        tokens = decode.greedy(
            model,
            jnp.asarray(batch["src"]),
            jnp.asarray(batch["src_valid"]),
            max_new_tokens=data.tgt_len,
        )
        out += [tokenizer.decode(row) for row in np.asarray(tokens)[: len(chunk)]]
    return out


def _examples(model, tokenizer, data, n: int, batch_size: int) -> list[tuple[str, str, str, bool]]:
    pairs = data.test_pairs[:n]
    preds = predict(model, tokenizer, data, [s for s, _ in pairs], batch_size)
    return [(s, p, t, p == t) for p, (s, t) in zip(preds, pairs, strict=True)]


def _report(summary: dict, examples: list, out: pathlib.Path) -> None:
    if examples:
        w = max(len(s) for s, *_ in examples)
        print(f"\n{'input':<{w}}  {'prediction':<12} {'target':<12} correct")
        for src, pred, tgt, ok in examples:
            print(f"{src:<{w}}  {pred:<12} {tgt:<12} {'yes' if ok else 'NO'}")
    em = summary["exact_match"]
    print(
        f"\n{summary['steps']} steps in {summary['wall_seconds']:.0f} s "
        f"({summary['train_tokens_per_second']:,.0f} target tokens/s), {summary['params']:,} parameters"
    )
    if em is not None:
        print(f"held-out exact match {em:.1%}, token accuracy {summary['token_accuracy']:.1%}")
    else:
        print(f"held-out perplexity {summary['eval_perplexity']:.3f}")
    print(
        f"results in {out}/: summary.json metrics.jsonl loss.png"
        + (" attention.png" if examples else "")
    )


def _eval_line(step: int, m: dict) -> str:
    text = f"step {step}: eval loss {m['eval_loss']:.4f}, token accuracy {m['eval_token_accuracy']:.2%}"
    if "exact_match" in m:
        text += f", exact match {m['exact_match']:.2%}"
    return text


@contextlib.contextmanager
def _interrupt_after():
    """Hold Ctrl-C until the block ends. The jitted step donates the old state, so an
    interrupt raised inside it (e.g. while its outputs are unpacked) would leave no state
    to save."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


def _step(state) -> int:
    """Updates applied so far (pmap keeps one copy of the counter per device)."""
    return int(np.ravel(state.step)[0])


def _truncate_metrics(path: pathlib.Path, step: int) -> None:
    """Drop records logged after the checkpoint we resume from (they will be redone)."""
    if not path.exists():
        return
    keep = [
        line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step
    ]
    path.write_text("".join(line + "\n" for line in keep))


def _progress(enabled: bool, start: int, total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, unit="step", dynamic_ncols=True)
