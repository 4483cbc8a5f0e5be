"""A run's pictures, drawn from its files: loss.png (train and held-out loss and scores
against steps, from metrics.jsonl), internals.png (--log-internals) and attention.png (a
translation model's cross-attention on one pair). matplotlib is imported only when a plot
is drawn; the lab redraws a committed record's plots with these too."""

from __future__ import annotations

import pathlib

import numpy as np
from flax import nnx

from jaxformer.data.datasets import encode_pairs
from jaxformer.files import read_metrics


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
        steps, values = [r["step"] for r in group], [r[key] for r in group]
        fill = "full" if color is None else "none"
        (line,) = ax.plot(steps, values, style, color=color, fillstyle=fill, label=label + what)
        color = line.get_color()
    return color


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
