"""Which attention heads matter: ablate each head of a trained run in turn and measure the
held-out loss and exact match.

    python experiments/head_ablation.py RUN_FOLDER [--examples 256] [--out results] [--note TEXT]

RUN_FOLDER is a `jaxformer train` run on a task (e.g. `make train`'s runs/dates-*). For
every attention sub-layer (encoder self-attention, decoder self-attention and
cross-attention, per layer) and every head, the head's output is zeroed at its site
(`<stack>/<i>/<sub-layer>/heads`, see jaxformer.capture) and the held-out examples are
scored again: the mean NLL per target token (teacher forcing) and the exact match of
greedy decoding, which runs the ablated model at every step (a full forward pass per
step, no cache: interventions apply to the whole pass). Writes results/head_ablation.json
(a docs results file: copy it to docs/results/, where docs/looking-inside.md renders it;
--note says how RUN_FOLDER was trained), head_ablation.png (heatmaps of the change per
layer x head) and
head_ablation_maps.png (the cross-attention of the heads whose loss matters most);
prints a JSON line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from jaxformer import capture  # noqa: E402
from jaxformer.checkpoints import restore_model  # noqa: E402
from jaxformer.data import TaskData, encode_pairs  # noqa: E402
from jaxformer.files import read_json  # noqa: E402
from jaxformer.functional import sites  # noqa: E402
from jaxformer.functional.losses import cross_entropy  # noqa: E402

SUBLAYERS = (
    ("encoder", "self_attention"),
    ("decoder", "self_attention"),
    ("decoder", "cross_attention"),
)


def scorer(model, batch, bos_id: int):
    """score(interventions) -> (mean NLL per target token, exact match), one compiled
    program per set of interventions."""
    graphdef, state = nnx.split(model)
    B, L = batch["tgt_in"].shape

    def score(state, batch, interventions):
        with sites.recording((), interventions) as rec:
            model = nnx.merge(graphdef, state)
            logits = model(batch["src"], batch["tgt_in"], batch["src_valid"], batch["tgt_valid"])
            nll = cross_entropy(logits, batch["tgt_out"], batch["tgt_valid"]).means()["nll"]

            def step(t, buf):  # greedy: the whole target re-read at every step
                out = model(batch["src"], buf, batch["src_valid"])
                token = jnp.argmax(out[:, t], axis=-1).astype(buf.dtype)
                return buf.at[:, t + 1].set(token)

            start = jnp.zeros((B, L + 1), jnp.int32).at[:, 0].set(bos_id)
            predicted = jax.lax.fori_loop(0, L, step, start)[:, 1:]
        rec.check()
        right = (predicted == batch["tgt_out"]) | ~batch["tgt_valid"]
        return nll, jnp.mean(jnp.all(right, axis=1))

    def run(interventions):
        f = jax.jit(lambda state, batch: score(state, batch, interventions))
        nll, exact = f(state, batch)
        return float(nll), float(exact)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a jaxformer train run folder (trained on a task)")
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--out", default="results")
    parser.add_argument("--note", default="", help="how the run was trained, for the results")
    args = parser.parse_args()
    model, tokenizer = restore_model(args.run)
    run_config = read_json(pathlib.Path(args.run) / "config.json")["run"]
    data = TaskData(run_config["task"], tokenizer, seed=run_config["seed"], dev_size=args.examples)
    batch = {
        k: jnp.asarray(v)
        for k, v in encode_pairs(data.dev_pairs, tokenizer, data.src_len, data.tgt_len).items()
    }
    score = scorer(model, batch, tokenizer.bos_id)
    base_nll, base_exact = score({})
    H = model.config.num_heads
    rows = []
    for stack, sub in SUBLAYERS:
        layers = (
            model.config.num_encoder_layers
            if stack == "encoder"
            else model.config.num_decoder_layers
        )
        for i in range(layers):
            for h in range(H):
                site = f"{stack}/{i}/{sub}"
                nll, exact = score({f"{site}/heads": capture.ablate_heads([h])})
                d_nll, d_exact = nll - base_nll, exact - base_exact
                rows.append(
                    dict(site=site, head=h, nll=nll, exact=exact, d_nll=d_nll, d_exact=d_exact)
                )
                print(
                    f"{site} head {h}: NLL {nll:.4f} ({d_nll:+.4f}), "
                    f"exact match {exact:.1%} ({d_exact:+.1%})"
                )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = docs_result(rows, base_nll, base_exact, args, len(data.dev_pairs))
    (out / "head_ablation.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_heatmaps(rows, model.config, out / "head_ablation.png")
    plot_maps(
        model,
        batch,
        tokenizer,
        data,
        sorted(rows, key=lambda r: -r["d_nll"])[:2],
        out / "head_ablation_maps.png",
    )
    print(json.dumps(summary["tables"][0]["caption"]))


def docs_result(rows, base_nll, base_exact, args, examples: int) -> dict:
    """The docs' results file: every head's NLL and exact match with it zeroed."""
    cells = [
        [r["site"], str(r["head"]), f"{r['nll']:.4f}", f"{r['d_nll']:+.4f}"]
        + [f"{r['exact']:.1%}", f"{r['d_exact']:+.1%}"]
        for r in rows
    ]
    caption = (
        f"Each head zeroed in turn, {examples} held-out examples; without ablation NLL "
        f"{base_nll:.4f} per target token (teacher-forced) and exact match {base_exact:.1%} "
        "(greedy):"
    )
    return {
        "command": f"python experiments/head_ablation.py RUN --examples {args.examples}",
        "device": "CPU (the results do not depend on the device beyond float rounding)",
        "versions": {"jax": jax.__version__},
        "date": datetime.date.today().isoformat(),
        "source": f"RUN: {args.note}" if args.note else f"RUN: {args.run}",
        "tables": [
            {
                "caption": caption,
                "columns": ["sub-layer", "head", "NLL", "change", "exact match", "change"],
                "align": "lrrrrr",
                "rows": cells,
            }
        ],
    }


def plot_heatmaps(rows, config, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 5.5), squeeze=False)
    for col, (stack, sub) in enumerate(SUBLAYERS):
        mine = [r for r in rows if r["site"].startswith(stack) and r["site"].endswith(sub)]
        layers = 1 + max(int(r["site"].split("/")[1]) for r in mine)
        for row, (key, label, cmap) in enumerate(
            (("d_nll", "NLL change", "Reds"), ("d_exact", "exact-match change", "Blues_r"))
        ):
            grid = np.zeros((layers, config.num_heads))
            for r in mine:
                grid[int(r["site"].split("/")[1]), r["head"]] = r[key]
            ax = axes[row, col]
            image = ax.imshow(grid, cmap=cmap, aspect="auto")
            for (i, h), v in np.ndenumerate(grid):
                ax.text(
                    h,
                    i,
                    f"{v:+.2f}" if key == "d_nll" else f"{v:+.0%}",
                    ha="center",
                    va="center",
                    fontsize=8,
                )
            ax.set_xticks(range(config.num_heads))
            ax.set_yticks(range(layers))
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_title(f"{stack} {sub.replace('_', '-')}: {label}", fontsize=9)
            fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle("Ablating one attention head at a time (held-out examples)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_maps(model, batch, tokenizer, data, top, path) -> None:
    """The attention weights of the most important heads on the first held-out example."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one = {k: v[:1] for k, v in batch.items()}
    names = [f"{r['site']}/weights" for r in top]
    _, values = capture.run(
        model, one["src"], one["tgt_in"], one["src_valid"], one["tgt_valid"], capture=names
    )
    src_len, tgt_len = int(one["src_valid"].sum()), int(one["tgt_valid"].sum())
    fig, axes = plt.subplots(1, len(top), figsize=(5 * len(top), 4), squeeze=False)
    for ax, r, name in zip(axes[0], top, names, strict=True):
        w = np.asarray(values[name][0, r["head"]])
        keys = one["src"][0] if "cross" in name or name.startswith("encoder") else one["tgt_in"][0]
        queries = one["src"][0] if name.startswith("encoder") else one["tgt_in"][0]
        nq = src_len if name.startswith("encoder") else tgt_len
        nk = src_len if "cross" in name or name.startswith("encoder") else tgt_len
        ax.imshow(w[:nq, :nk], cmap="viridis")
        ax.set_xticks(range(nk), tokenizer.token_strings(np.asarray(keys[:nk])), fontsize=7)
        ax.set_yticks(range(nq), tokenizer.token_strings(np.asarray(queries[:nq])), fontsize=7)
        ax.set_title(
            f"{r['site']} head {r['head']} (NLL {r['d_nll']:+.2f} when ablated)", fontsize=9
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
