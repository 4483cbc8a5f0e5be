"""What a run shows a person: progress while it trains, a line per evaluation, at the end
a table of held-out examples with the totals; the predictions files (predictions.tsv,
test_predictions.tsv) and the plots (loss.png, attention.png, and internals.png with
--log-internals). matplotlib is imported only when a plot is drawn."""

from __future__ import annotations

import pathlib
import re
import shlex
import sys
from typing import Any

import numpy as np
from flax import nnx

from jaxformer.checks import MissingPackage, as_given
from jaxformer.data.datasets import encode_pairs
from jaxformer.files import command_line, read_metrics, write_whole


class Progress:
    """A tqdm bar on a terminal; elsewhere (a log file, CI) a plain line every tenth of
    the run, so that logs hold no carriage returns."""

    def __init__(self, enabled: bool, start: int, total: int):
        self.enabled, self.total, self.every = enabled, total, max(1, total // 10)
        self.next_line = (start // self.every + 1) * self.every
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)

    def show(self, record: dict[str, float]) -> None:
        """The latest logged metrics."""
        loss, lr, speed = record["loss"], record["lr"], record["tokens_per_second"]
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:,.0f}")
        elif self.enabled and record["step"] >= self.next_line:
            self.next_line += self.every
            print(
                f"step {record['step']}/{self.total}: loss {loss:.4f}, lr {lr:.2e}, "
                f"{speed:,.0f} tokens/s",
                flush=True,
            )

    def write(self, line: str) -> None:
        """A line of results (above the bar), when enabled."""
        if self.bar is not None:
            self.bar.write(line)
        elif self.enabled:
            print(line, flush=True)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def eval_line(step: int, m: dict[str, float], averaged_steps: list[int] | None = None) -> str:
    """One evaluation's results; `averaged_steps`: of the mean of those checkpoints."""
    what = f"step {step}" if averaged_steps is None else _averaged(averaged_steps)
    return f"{what}: " + _held_out(m["eval_nll"], m["eval_perplexity"], m["eval_token_accuracy"], m)


def print_summary(summary: dict[str, Any], examples: list[tuple[str, str, str]], out) -> None:
    """The held-out examples (input, prediction, target) as a table, then the totals."""
    if examples:
        rows = [("input", "prediction", "target", "correct")]
        rows += [(s, p, t, "yes" if p == t else "NO") for s, p, t in examples]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        print()
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths + [0], strict=True)))
    print(f"\n{_steps_line(summary)}, {summary['params']:,} parameters")
    if summary.get("averaged_eval"):
        final = summary["final_eval"]
        keys = ("eval_nll", "eval_perplexity", "eval_token_accuracy")
        print("last checkpoint: " + _held_out(*(final[k] for k in keys), final))
        print(eval_line(summary["steps"], summary["averaged_eval"], summary["averaged_steps"]))
    else:
        keys = ("eval_nll", "eval_perplexity", "token_accuracy")
        print(_held_out(*(summary[k] for k in keys), summary))
    if summary.get("test_pairs"):
        scores = ", ".join(_scores(summary, "test_"))
        print(f"test ({summary['test_pairs']:,} pairs, final model): {scores}")
    plots = " ".join(p.name for p in sorted(pathlib.Path(out).glob("*.png")))
    print(f"results in {out}/: summary.json metrics.jsonl {plots}")
    text = shlex.quote(examples[0][0]) if examples else "TEXT"
    print(f"next: jaxformer generate --checkpoint {shlex.quote(str(out))} --input {text}")


def continue_command() -> str:
    """How a stopped run continues: on the command line, this command with --resume (the
    exact command to type); in Python, the argument resume=True."""
    resume = as_given("resume", True)
    if not resume.startswith("--"):
        return resume
    command = command_line()
    return command if resume in shlex.split(command) else f"{command} {resume}"


def _steps_line(summary: dict[str, Any]) -> str:
    """The steps and their time; a resumed run's share of them, and its speed."""
    steps, run = summary["steps"], summary["steps_run"]
    head = f"{steps} steps in {summary['wall_seconds']:.0f} s"
    if run == 0:
        return f"{head} in all (the run was already complete: no steps in this process)"
    where = f" in all, steps {steps - run + 1}-{steps} in this process" if run < steps else ""
    return f"{head}{where} ({summary['train_tokens_per_second']:,.0f} target tokens/s)"


def _held_out(nll: float, perplexity: float, accuracy: float, scores: dict) -> str:
    """The losses, then whichever of exact match, BLEU and chrF `scores` holds."""
    losses = f"held-out NLL {nll:.4f} (perplexity {perplexity:.3f}), token accuracy {accuracy:.2%}"
    return ", ".join([losses, *_scores(scores)])


def _scores(scores: dict, prefix: str = "") -> list[str]:
    """Whichever of exact match, BLEU and chrF `scores` holds under names with `prefix`."""
    shown = []
    if scores.get(prefix + "exact_match") is not None:
        shown.append(f"exact match {scores[prefix + 'exact_match']:.2%}")
    for key, name in (("bleu", "BLEU"), ("chrf", "chrF")):
        if scores.get(prefix + key) is not None:
            shown.append(f"{name} {scores[prefix + key]:.2f}")
    return shown


def _averaged(steps: list[int]) -> str:
    return f"mean of the checkpoints of steps {', '.join(map(str, steps))}"


def write_predictions(
    pairs: list[tuple[str, str]], predictions: list[str], path: pathlib.Path
) -> None:
    """source<TAB>reference<TAB>prediction, one line per test pair; a tab or line break
    inside a field becomes a space (which changes neither BLEU's 13a tokens nor chrF)."""
    rows = [(s, t, p) for (s, t), p in zip(pairs, predictions, strict=True)]
    text = "".join("\t".join(re.sub(r"[\t\r\n]", " ", f) for f in row) + "\n" for row in rows)
    write_whole(path, text)


def loss_curves(metrics_path: pathlib.Path, out_png: pathlib.Path) -> None:
    """Train and held-out loss against steps; held-out token accuracy and exact match; and
    BLEU and chrF in a third panel when the evaluations have them (the mean of the last
    checkpoints as a star, the final model's test score as a triangle). NLL and token
    accuracy are teacher-forced on every held-out example; exact match, BLEU and chrF are
    of decoded pairs, a series per protocol (`_plot_evals`)."""
    plt = _pyplot()
    records = read_metrics(metrics_path)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r and "averaged_steps" not in r]
    averaged = [r for r in records if "averaged_steps" in r]
    tested = [r for r in records if "test_pairs" in r]
    scored = bool(evals) and "bleu" in evals[0]
    fig, axes = plt.subplots(1, 3 if scored else 2, figsize=(16 if scored else 11, 5))
    ax_loss, ax_acc = axes[:2]
    steps = [r["step"] for r in train]
    ax_loss.plot(steps, [r["loss"] for r in train], label="train (label-smoothed)")
    ax_loss.plot(steps, [r["nll"] for r in train], label="train NLL", alpha=0.7)
    if evals:
        _plot_teacher_forced(ax_loss, ax_acc, evals)
        if "exact_match" in evals[0]:
            _plot_evals(ax_acc, evals, "exact_match", "exact match", "s-")
        ax_acc.set(xlabel="step", ylim=(0, 1.02), title="held-out accuracy")
        _legend_below(ax_acc)
    if scored:
        for key, name in (("bleu", "BLEU"), ("chrf", "chrF")):
            color = _plot_evals(axes[2], evals, key, name, "o-")
            for r in averaged:
                label = f"{name}, mean of {len(r['averaged_steps'])} checkpoints"
                axes[2].plot([r["step"]], [r[key]], "*", ms=12, color=color, label=label)
            for r in tested:
                label = f"test {name}, final model"
                axes[2].plot([r["step"]], [r["test_" + key]], "^", ms=9, color=color, label=label)
        axes[2].set(xlabel="step", ylabel="0-100", title="held-out BLEU and chrF (sacrebleu)")
        _legend_below(axes[2])
    ax_loss.set(xlabel="step", ylabel="nats per token", yscale="log", title="loss")
    _legend_below(ax_loss)
    _save(fig, out_png)


def _plot_teacher_forced(ax_loss, ax_acc, evals: list[dict]) -> None:
    """The held-out NLL and token accuracy: one series each, as every evaluation computes
    them teacher-forced on all held-out pairs (the number the final evaluation records)."""
    pairs = max(r.get("eval_pairs") or 0 for r in evals)
    forced = f" (teacher-forced, all {pairs:,} held-out pairs)" if pairs else " (teacher-forced)"
    steps = [r["step"] for r in evals]
    ax_loss.plot(steps, [r["eval_nll"] for r in evals], "o-", label="held-out NLL" + forced)
    accuracy = [r["eval_token_accuracy"] for r in evals]
    ax_acc.plot(steps, accuracy, "o-", label="token accuracy" + forced)


def _plot_evals(ax, evals: list[dict], key: str, label: str, style: str) -> str:
    """One metric of decoded pairs in one colour, a series per protocol (how many pairs,
    which decoding: the first eval_sample pairs greedily during training, all of them
    with the run's beam at the end), later protocols hollow; returns the colour."""
    protocols: dict[tuple, list[dict]] = {}
    for r in evals:
        protocols.setdefault((r.get("eval_pairs"), r.get("eval_beam")), []).append(r)
    color = None
    for (pairs, beam), group in protocols.items():
        decoding = "greedy" if beam == 1 else f"beam {beam}"
        what = "" if pairs is None else f" ({pairs:,} pairs, {decoding})"
        (line,) = ax.plot(
            [r["step"] for r in group],
            [r[key] for r in group],
            style,
            color=color,
            fillstyle="full" if color is None else "none",
            label=label + what,
        )
        color = line.get_color()
    return color


def internals_record(step: int, internals: dict) -> dict[str, float]:
    """A metrics.jsonl record of the train step's internals: flat `internals/<key>` keys."""
    return {"step": step, **{f"internals/{k}": float(v) for k, v in internals.items()}}


def internals(metrics_path: pathlib.Path, out_png: pathlib.Path) -> None:
    """The internals records over steps: gradient, parameter and update norm per module,
    attention entropy per head (a heatmap), activation RMS per layer, the global norms."""
    plt = _pyplot()
    records = [r for r in read_metrics(metrics_path) if "internals/grad_norm" in r]
    steps = [r["step"] for r in records]
    series = {
        k.removeprefix("internals/"): [r.get(k, np.nan) for r in records] for k in records[-1]
    }
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    modules = [k.removeprefix("grad_norm/") for k in series if k.startswith("grad_norm/")]
    colours = plt.get_cmap("tab20")(np.arange(len(modules)) % 20)
    for ax, kind in zip(axes[0], ("grad_norm", "param_norm", "update_norm"), strict=True):
        for module, colour in zip(modules, colours, strict=True):
            ax.plot(steps, series[f"{kind}/{module}"], color=colour, label=module, lw=1)
        ax.set(xlabel="step", yscale="log", title=kind.replace("_", " ") + " per module")
    axes[0, 2].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _entropy_map(fig, axes[1, 0], steps, series)
    ax = axes[1, 1]
    for key in (k for k in series if k.startswith("activation_rms/")):
        ax.plot(steps, series[key], label=key.removeprefix("activation_rms/"), marker=".")
    ax.set(xlabel="step", title="residual stream RMS after each layer")
    if ax.lines:
        ax.legend(fontsize=7)
    else:
        ax.set_title("no activation sites (scan_layers or remat)")
    ax = axes[1, 2]
    for kind in ("grad_norm", "update_norm", "param_norm"):
        ax.plot(steps, series[kind], label=kind.replace("_", " "), marker=".")
    ax.set(xlabel="step", yscale="log", title="global norms")
    ax.legend(fontsize=7)
    _save(fig, out_png)


def _entropy_map(fig, ax, steps: list[int], series: dict[str, list[float]]) -> None:
    """Attention entropy (nats) per head: a row per (layer, attention, head), a column per step."""
    keys = [k for k in series if k.startswith("attention_entropy/")]
    if not keys:
        ax.set_title("no attention weights (scan/remat, or not the xla kernel)")
        return
    image = ax.imshow(
        np.array([series[k] for k in keys]), aspect="auto", cmap="viridis", interpolation="nearest"
    )
    short = {
        "encoder": "enc",
        "decoder": "dec",
        "self_attention": "self",
        "cross_attention": "cross",
    }
    labels = [" ".join(short.get(p, p) for p in k.split("/")[1:]) for k in keys]
    ax.set_yticks(range(len(keys)), labels, fontsize=max(4, min(7, 300 // len(keys))))
    ticks = np.linspace(0, len(steps) - 1, min(len(steps), 6)).astype(int)
    ax.set_xticks(ticks, [steps[i] for i in ticks])
    ax.set(xlabel="step", title="attention entropy per head (nats)")
    fig.colorbar(image, ax=ax)


@nnx.jit
def _cross_weights(model, src, tgt_in):
    return model.cross_attention_weights(src, tgt_in)


def cross_attention(model, tokenizer, pair: tuple[str, str], out_png: pathlib.Path) -> None:
    """Encoder-decoder attention of every layer and head for one (source, target) pair,
    target tokens down the side, source tokens along the bottom."""
    plt = _pyplot()
    src, tgt = pair
    batch = encode_pairs(
        [pair], tokenizer, len(tokenizer.encode(src)) + 1, len(tokenizer.encode(tgt)) + 1
    )
    weights = np.asarray(_cross_weights(model, batch["src"], batch["tgt_in"])[:, 0])  # [L, H, T, S]
    L, H, T, S = weights.shape
    src_labels = tokenizer.token_strings(batch["src"][0])
    tgt_labels = tokenizer.token_strings(batch["tgt_out"][0])
    fig, axes = plt.subplots(L, H, figsize=(2.2 + 0.28 * S * H, 0.8 + 0.3 * T * L), squeeze=False)
    for layer in range(L):
        for head in range(H):
            ax = axes[layer, head]
            ax.imshow(weights[layer, head], cmap="viridis", vmin=0, vmax=1, aspect="auto")
            ax.set_xticks(range(S), src_labels, fontsize=7)
            ax.set_yticks(range(T), tgt_labels, fontsize=7)
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
    fig.suptitle(f"cross-attention: {src!r} -> {tgt!r}", fontsize=10)
    _save(fig, out_png)


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend_below(ax) -> None:
    """The axes' legend under it, so that it hides no curve."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=7)


def _save(fig, out_png: pathlib.Path) -> None:
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    _pyplot().close(fig)


def tensorboard_writer():
    """tensorboardX's SummaryWriter, or an error saying how to install it."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise MissingPackage(
            "tensorboard=True writes event files with tensorboardX: pip install 'jaxformer[tensorboard]'"
        ) from None
    return SummaryWriter
