"""`jaxformer bench parity`: how closely modules converted from PyTorch and models
converted from Hugging Face transformers reproduce them, float32 on a CPU (needs the
`torch` extra, and transformers for the hf part).

torch: each module kind (MultiheadAttention to nn.Transformer), configuration and input
set, the torch module (eval mode, SDPA's math backend) against its `from_torch`
conversion: the max absolute difference of the outputs and of the gradients of
sum(output * g) with respect to every input, also over torch's largest value.

hf: each transformers model built from a config with random weights (no download),
converted with `jaxformer.interop.hf.from_hf`: the max absolute logit difference on a
padded batch, and whether 20 greedy tokens equal `generate`'s.

--quick: fewer and smaller cases. The cases in full: docs/interop.md, "Parity with
PyTorch" and "Parity with Hugging Face"."""

from __future__ import annotations

import dataclasses

from jaxformer_lab.bench import parity_cases as cases
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

PARTS = ("torch", "hf")


@dataclasses.dataclass(frozen=True)
class ParityOptions(Options):
    quick: bool = setting(
        False, "each module kind once, one model of each kind (a CPU in a minute)"
    )
    parts: tuple[str, ...] = setting(PARTS, "torch modules, Hugging Face models", choices=PARTS)


@BENCHMARKS.register("parity", ParityOptions)
def run(options: ParityOptions) -> Record:
    """Converted PyTorch modules and Hugging Face models against the originals."""
    tables, data = [], {}
    if "torch" in options.parts:
        data["torch"] = torch_rows(options.quick)
        tables.append(torch_table(data["torch"]))
    if "hf" in options.parts:
        data["hf"] = hf_rows(options.quick)
        tables.append(hf_table(data["hf"]))
    return capture(tables, data=data | {"headline": headline(data)})


def torch_rows(quick: bool) -> list[dict]:
    """Every module kind x small configuration x input set, then the paper's rows; quick:
    each kind once, on the padded inputs, the configurations taken in turn."""
    small = list(cases.SMALL.items())
    if quick:
        runs = [
            (kind, *small[i % len(small)], "padding+causal", (2, 2))
            for i, kind in enumerate(cases.KINDS)
        ]
        return [torch_row(*run) for run in runs]
    runs = [
        (kind, name, c, inp, (2, 2))
        for kind in cases.KINDS
        for name, c in small
        for inp in cases.INPUTS
    ]
    return [torch_row(*run) for run in runs + cases.paper_runs()]


def torch_row(kind: str, name: str, c: dict, inp: str, layers: tuple[int, int]) -> dict:
    row = dict(module=kind, config=name, inputs=inp)
    row |= cases.torch_case(kind, c, cases.INPUTS[inp], layers)
    say(f"{kind} {name} {inp}: output {row['output_max_abs']:.1e}")
    return row


def hf_rows(quick: bool) -> list[dict]:
    """The small models and the large ones; quick: the first small one of each kind."""
    runs = cases.HF_SMALL | cases.HF_LARGE
    if quick:
        firsts = {}
        for name, (kind, _) in cases.HF_SMALL.items():
            firsts.setdefault(kind, name)
        runs = {name: cases.HF_SMALL[name] for name in firsts.values()}
    rows = []
    for name, (kind, settings) in runs.items():
        rows.append(dict(config=name) | cases.hf_case(kind, settings))
        say(f"{name}: max |diff| {rows[-1]['logits_max_abs_diff']:.1e}")
    return rows


def torch_table(rows: list[dict]) -> Table:
    """A row per torch case: the largest absolute and relative differences, outputs and grads."""
    cells = [
        [r["module"], r["config"], r["inputs"]]
        + [
            f"{r[k]:.1e}"
            for k in ("output_max_abs", "grad_max_abs", "output_max_rel", "grad_max_rel")
        ]
        + [f"{r['output_scale']:.2f}", f"{r['grad_scale']:.2f}"]
        for r in rows
    ]
    columns = ["module", "configuration", "inputs", "output", "input grad"]
    columns += ["output, relative", "input grad, relative", "max abs output", "max abs grad"]
    caption = (
        "Max absolute difference between torch and the module converted by `from_torch`: "
        "outputs, and gradients of sum(output * g) with respect to every input; relative: "
        "over the largest absolute value of the same array in torch (float32, CPU):"
    )
    return Table(columns, cells, "lllrrrrrr", caption=caption)


def hf_table(rows: list[dict]) -> Table:
    """A row per Hugging Face model: its largest logit difference and whether greedy agrees."""
    cells = [
        [r["config"], f"{r['parameters']:,}", f"{r['logits_max_abs_diff']:.1e}"]
        + [f"{r['logits_max_abs']:.2f}", "equal" if r["greedy_20_equal"] else "different"]
        for r in rows
    ]
    columns = ["configuration", "parameters", "max abs logit diff", "max abs logit"]
    caption = (
        "float32 on CPU; a padded batch (3 rows, source 9 and target 7 tokens), 20 greedy "
        "tokens with no early stop:"
    )
    columns += ["greedy 20 tokens = `generate`"]
    return Table(columns, cells, "lrrrl", caption=caption)


def headline(data: dict) -> dict:
    """The headline: the largest differences of each part."""
    line = {}
    if "torch" in data:
        for key in ("output_max_abs", "grad_max_abs", "output_max_rel", "grad_max_rel"):
            line[f"torch_{key}"] = max(r[key] for r in data["torch"])
    if "hf" in data:
        line["hf_logits_max_abs_diff"] = max(r["logits_max_abs_diff"] for r in data["hf"])
        line["hf_all_greedy_equal"] = all(r["greedy_20_equal"] for r in data["hf"])
    return line
