"""Recompute, with jaxformer, the worked numerical examples that popular explanations of
the Transformer give, and print the correct numbers beside the ones those texts state.

    python experiments/worked_examples.py [--out results]

Writes results/worked_examples.{json,md}; the last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax.numpy as jnp
import numpy as np

from jaxformer import functional as F
from jaxformer_lab.markdown import table


def _attend(q, k, v):
    """Single-head attention of row vectors q [T, D], k [S, D], v [S, Dv] via the library."""
    add_heads = lambda x: jnp.asarray(x, jnp.float32)[None, :, None, :]  # noqa: E731
    q, k, v = add_heads(q), add_heads(k), add_heads(v)
    out, w = F.scaled_dot_product_attention(q, k, v), F.attention_weights(q, k)
    return np.asarray(out[0, :, 0]), np.asarray(w[0, 0])


def examples() -> list[dict]:
    """Each example: what was computed, the value a text states, and the correct value."""
    rows = []

    # A one-query example: Q = [3, 4], K = [[1, 2], [2, 3]], V = [[7, 8], [9, 10]], d_k = 2.
    q, k, v = (
        np.array([[3.0, 4.0]]),
        np.array([[1.0, 2.0], [2.0, 3.0]]),
        np.array([[7.0, 8.0], [9.0, 10.0]]),
    )
    out, w = _attend(q, k, v)
    rows += [
        dict(
            example="one query, d_k=2",
            quantity="Q K^T",
            stated=[11, 18],
            correct=(q @ k.T)[0].tolist(),
        ),
        dict(
            example="one query, d_k=2",
            quantity="softmax weights",
            stated=[0.2, 0.8],
            correct=w[0].tolist(),
        ),
        dict(
            example="one query, d_k=2",
            quantity="output",
            stated=[8.6, 9.6],
            correct=out[0].tolist(),
        ),
    ]

    # Three tokens, d_k = 2.
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    k = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    v = np.array([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])
    out, w = _attend(q, k, v)
    rows += [
        dict(
            example="three tokens, d_k=2",
            quantity="scores Q K^T",
            stated=[[1, 1, 0], [1, 0, 1], [2, 1, 1]],
            correct=(q @ k.T).tolist(),
        ),
        dict(
            example="three tokens, d_k=2",
            quantity="weights of token 1 (dot-product section)",
            stated=[0.42, 0.42, 0.16],
            correct=w[0].tolist(),
        ),
        dict(
            example="three tokens, d_k=2",
            quantity="output of token 1 (dot-product section)",
            stated=[5.3, 4.2],
            correct=out[0].tolist(),
        ),
        dict(
            example="three tokens, d_k=2",
            quantity="weights of token 1 (self-attention section)",
            stated=[0.4, 0.4, 0.2],
            correct=w[0].tolist(),
        ),
        dict(
            example="three tokens, d_k=2",
            quantity="output of token 1 (self-attention section)",
            stated=[5, 4],
            correct=out[0].tolist(),
        ),
        dict(
            example="three tokens, d_k=2",
            quantity="outputs of tokens 2 and 3 (not stated)",
            stated=None,
            correct=out[1:].tolist(),
        ),
    ]

    # Sinusoidal positions, d_model = 4.
    pe = np.asarray(F.sinusoidal_positions(2, 4), np.float64)
    word = np.array([0.5, 0.2, 0.3, 0.1])
    rows += [
        dict(
            example="positions, d_model=4",
            quantity="PE(pos=0)",
            stated=[0, 1, 0, 1],
            correct=pe[0].tolist(),
        ),
        dict(
            example="positions, d_model=4",
            quantity="PE(pos=1)",
            stated=[0.841, 0.540, 0.0001, 1.0000],
            correct=pe[1].tolist(),
        ),
        dict(
            example="positions, d_model=4",
            quantity="angle of PE(1, 2) = 1 / 10000^(2/4)",
            stated=0.0001,
            correct=1 / 10000 ** (2 / 4),
        ),
        dict(
            example="positions, d_model=4",
            quantity="a position's encoding added to [0.5, 0.2, 0.3, 0.1]",
            stated="PE [0.0, 1.0, 0.841, 0.540] (mixes positions 0 and 1)",
            correct={"pos 0": (word + pe[0]).tolist(), "pos 1": (word + pe[1]).tolist()},
        ),
    ]
    return rows


def _fmt(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, dict):
        return "; ".join(f"{k}: {_fmt(v)}" for k, v in x.items())
    if isinstance(x, str):
        return x
    text = np.array2string(
        np.asarray(x, np.float64),
        precision=5,
        suppress_small=True,
        separator=", ",
        max_line_width=10**6,
    )
    return " ".join(text.split())


def _agrees(stated, correct) -> bool | None:
    if stated is None or isinstance(stated, str) or isinstance(correct, dict):
        return None if stated is None else False
    stated, correct = np.asarray(stated, np.float64), np.asarray(correct, np.float64)
    # A stated value agrees when it is the correct one rounded to the digits it shows.
    return stated.shape == correct.shape and bool(np.all(np.abs(stated - correct) <= 0.006))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="results", help="folder for the JSON and markdown results")
    args = parser.parse_args()
    rows = examples()
    for r in rows:
        r["agrees"] = _agrees(r["stated"], r["correct"])
    marks = {True: "yes", False: "**no**", None: "—"}
    cells = [
        [r["example"], r["quantity"], _fmt(r["stated"]), _fmt(r["correct"]), marks[r["agrees"]]]
        for r in rows
    ]
    columns = ["example", "quantity", "stated in the text", "correct (jaxformer)", "agrees"]
    text = "\n".join(table(columns, cells, "lllll"))
    print(text)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "worked_examples.md").write_text(text + "\n")
    (out / "worked_examples.json").write_text(json.dumps(rows, indent=1))
    wrong = [f"{r['example']}: {r['quantity']}" for r in rows if r["agrees"] is False]
    print(json.dumps({"examples": len(rows), "stated_values_wrong": len(wrong), "wrong": wrong}))


if __name__ == "__main__":
    main()
