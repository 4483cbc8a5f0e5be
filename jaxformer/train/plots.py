"""Plots of a run: loss curves and cross-attention maps (matplotlib, no display needed)."""

from __future__ import annotations

import json
import pathlib

import matplotlib
import numpy as np
from flax import nnx

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxformer.data.datasets import encode_pairs  # noqa: E402


def loss_curves(metrics_path: pathlib.Path, out_png: pathlib.Path) -> None:
    """Train and held-out loss against steps; held-out token accuracy and exact match."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(
        [r["step"] for r in train], [r["loss"] for r in train], label="train (label-smoothed)"
    )
    ax_loss.plot(
        [r["step"] for r in train], [r["nll"] for r in train], label="train NLL", alpha=0.7
    )
    if evals:
        ax_loss.plot(
            [r["step"] for r in evals], [r["eval_nll"] for r in evals], "o-", label="held-out NLL"
        )
    ax_loss.set(xlabel="step", ylabel="nats per token", yscale="log", title="loss")
    ax_loss.legend()
    if evals:
        steps = [r["step"] for r in evals]
        ax_acc.plot(steps, [r["eval_token_accuracy"] for r in evals], "o-", label="token accuracy")
        if "exact_match" in evals[0]:
            ax_acc.plot(steps, [r["exact_match"] for r in evals], "s-", label="exact match")
        ax_acc.set(xlabel="step", ylim=(0, 1.02), title="held-out accuracy")
        ax_acc.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


@nnx.jit
def _cross_weights(model, src, tgt_in):
    memory = model.encode(src)
    return model.decode(tgt_in, memory, return_cross_attention=True)[1]


def cross_attention(model, tokenizer, pair: tuple[str, str], out_png: pathlib.Path) -> None:
    """Encoder-decoder attention of every layer and head for one (source, target) pair,
    target tokens down the side, source tokens along the bottom."""
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
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
