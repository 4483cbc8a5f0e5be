"""Parameter counts of the rows of Table 3 of Vaswani et al. (2017), the paper's against
jaxformer's (`jaxformer bench paper-params`).

Each row (`TransformerConfig.table3`) is built with `nnx.eval_shape`, so no memory is
allocated. The paper's counts are data: the `params` of configs/sweeps/table3.yaml's
paper rows. The paper shares one source/target vocabulary ("about 37000 tokens" for
EN-DE) without giving its size; the default here, 41,000, is where our base model has
the paper's 65M. A row's change from the base model does not depend on the vocabulary
when the row keeps d_model = 512, so the table compares those changes too. A count is
linear in the vocabulary V (one shared matrix of V x d_model), which gives the V at
which a count rounds to the paper's.
"""

from __future__ import annotations

import functools
import pathlib
from dataclasses import dataclass

from flax import nnx

from jaxformer.checks import BadValue
from jaxformer.config import TABLE3_ROWS, TransformerConfig, load_config_file
from jaxformer.models import Transformer, count_params
from jaxformer_lab.bench.registry import BENCHMARKS, Options, setting
from jaxformer_lab.results import Record, Table, capture

SPEC = pathlib.Path(__file__).resolve().parents[3] / "configs/sweeps/table3.yaml"


@dataclass(frozen=True)
class PaperParamsOptions(Options):
    vocab: int = setting(41000, "the shared source/target vocabulary assumed")
    rows: tuple[str, ...] = setting((), "the rows counted (default: every row)")

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.vocab, bool) or not isinstance(self.vocab, int) or self.vocab < 1:
            raise BadValue(f"--vocab must be an int >= 1, got {self.vocab!r}")
        unknown = [row for row in self.rows if row not in TABLE3_ROWS]
        if unknown:
            raise BadValue(f"--rows: {unknown} are not rows of Table 3 ({list(TABLE3_ROWS)})")


@BENCHMARKS.register("paper-params", PaperParamsOptions)
def run(options: PaperParamsOptions) -> Record:
    """Table 3's parameter counts, the paper's against jaxformer's rows."""
    paper = paper_millions()
    chosen = [row for row in TABLE3_ROWS if row in (options.rows or TABLE3_ROWS)]
    ours = {row: count(row, options.vocab) for row in {"base", *chosen}}
    rows = []
    for row in chosen:
        changes = TABLE3_ROWS[row]
        ours_delta = (ours[row] - ours["base"]) / 1e6
        cells = [row, ", ".join(f"{k}={v}" for k, v in changes.items()) or "—"]
        cells += [f"{ours[row] / 1e6:.2f}", f"{ours_delta:+.2f}"]
        if row in paper:
            paper_delta = paper[row] - paper["base"]
            cells += [str(paper[row]), f"{paper_delta:+d}", f"{ours_delta - paper_delta:+.2f}"]
        rows.append(cells + [""] * (7 - len(cells)))
    base, big = vocab_interval("base", paper), vocab_interval("big", paper, delta=True)
    table = Table(
        caption=f"Table 3's rows, a shared vocabulary of {options.vocab:,} tokens assumed:",
        columns=["row", "changes from base", "ours (M)", "ours: row - base", "paper (M)"]
        + ["paper: row - base", "mismatch (M)"],
        align="llrrrrr",
        rows=rows,
        notes=[
            f"Our base model rounds to the paper's {paper['base']}M for V in "
            f"[{base[0]:,.0f}, {base[1]:,.0f}]; our big-minus-base difference rounds to the "
            f"paper's {paper['big'] - paper['base']}M only for V in [{big[0]:,.0f}, "
            f"{big[1]:,.0f}]. " + _verdict(base, big)
        ],
    )
    mismatch = {r[0]: float(r[6]) for r in rows if r[6]}
    big_mismatch = mismatch.pop("big", None)
    headline = {
        "base_M": round(ours["base"] / 1e6, 2),
        "max_abs_mismatch_M_without_big": max(map(abs, mismatch.values()), default=None),
        "big_mismatch_M": big_mismatch,
        "vocab_base": [round(v) for v in base],
        "vocab_big_minus_base": [round(v) for v in big],
    }
    source = "every row of Table 3 built with nnx.eval_shape; the paper's counts from "
    source += f"configs/sweeps/{SPEC.name}"
    return capture([table], source=source, data={"headline": headline})


def paper_millions() -> dict[str, int]:
    """The paper's "params x 10^6" column (the rows it leaves blank have none)."""
    rows = load_config_file(str(SPEC))["paper"]["rows"]
    return {row: fields["params"] for row, fields in rows.items() if "params" in fields}


@functools.cache
def count(row: str, vocab_size: int) -> int:
    """The parameters of Table 3's `row` with a shared vocabulary of `vocab_size`."""
    config = TransformerConfig.table3(row, vocab_size)
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    return count_params(abstract)


def vocab_interval(row: str, paper: dict[str, int], *, delta: bool = False) -> list[float]:
    """The vocabulary sizes V at which our count of `row` (or, with `delta`, its change from
    base) rounds to the paper's: count(V) = count(0) + V * d_model."""
    fixed = count(row, 1) - TransformerConfig.table3(row, 1).d_model
    width = TransformerConfig.table3(row, 1).d_model
    target = paper[row]
    if delta:
        fixed -= count("base", 1) - TransformerConfig.table3("base", 1).d_model
        width -= TransformerConfig.table3("base", 1).d_model
        target -= paper["base"]
    return [(millions * 1e6 - fixed) / width for millions in (target - 0.5, target + 0.5)]


def _verdict(base: list[float], big: list[float]) -> str:
    if big[1] < base[0] or base[1] < big[0]:
        return "No one shared vocabulary reproduces both of the paper's counts."
    return "One shared vocabulary reproduces both of the paper's counts."
