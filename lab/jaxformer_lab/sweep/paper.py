"""A sweep read against a paper (configs/sweeps/table3.yaml: Table 3): the spec's `paper`
block holds each variant's figure and finding in the paper, and the report adds a table:

    paper:
      figure: dev BLEU                    # what the paper's figure is
      equal_within: {bleu: 1.0}           # "equal" reproduces within ± this, per metric
      columns: {N: num_encoder_layers, h: num_heads}  # model fields shown, by heading
      rows:
        base: {figure: 25.8, params: 65}  # params: the paper's count, in millions
        A1: {figure: 24.9, finding: worse, why: one head is worse than eight}

A finding (better, worse or equal) "reproduces" when the sweep's verdict on the dev
metric has its direction (for "equal": no verdict and the 95% interval within ±
equal_within), "contradicts" when the verdict goes the other way (any way, for "equal"),
else "inconclusive" (docs/research.md, "The paper's Table 3 on a laptop")."""

from __future__ import annotations

import dataclasses

from jaxformer.checks import BadValue
from jaxformer_lab.sweep import stats

FINDINGS = ("better", "worse", "equal")
ROW_KEYS = ("figure", "params", "finding", "why")


@dataclasses.dataclass(frozen=True)
class Paper:
    """A spec's `paper` block, checked (`Paper.read`)."""

    figure: str
    equal_within: dict[str, float]
    columns: dict[str, str]
    rows: dict[str, dict]

    @classmethod
    def read(cls, block, where: str, model_fields: tuple[str, ...]) -> Paper:
        """The block of a spec; an unknown key or a malformed row is an error naming it."""
        if not isinstance(block, dict) or set(block) != {f.name for f in dataclasses.fields(cls)}:
            raise BadValue(
                f"{where}: paper must be a mapping of figure, equal_within, columns and rows, "
                f"got {block!r}"
            )
        for heading, field in block["columns"].items():
            if field not in model_fields:
                raise BadValue(f"{where}: paper column {heading!r}: {field!r} is not a model field")
        for metric in block["equal_within"]:
            if metric not in stats.METRICS:
                raise BadValue(
                    f"{where}: paper equal_within: {metric!r} is not one of {stats.METRICS}"
                )
        for name, row in block["rows"].items():
            _check_row(row, f"{where}: paper row {name!r}")
        return cls(**block)


def _check_row(row, where: str) -> None:
    if not isinstance(row, dict) or "figure" not in row or set(row) - set(ROW_KEYS):
        raise BadValue(f"{where} must be a mapping with figure and any of {ROW_KEYS}, got {row!r}")
    if "finding" in row and (row["finding"] not in FINDINGS or "why" not in row):
        raise BadValue(f"{where}: a finding is one of {FINDINGS}, with its why, got {row!r}")


def summary(paper: Paper, configs: dict, baseline: str) -> dict:
    """What the report's table needs of the paper and of each variant's model
    (`configs`: variant -> TransformerConfig), as plain data for results.json."""
    return {
        "figure": paper.figure,
        "equal_within": paper.equal_within,
        "columns": list(paper.columns),
        "baseline_figure": paper.rows.get(baseline, {}).get("figure"),
        "variants": {
            name: {
                "columns": [getattr(model, field) for field in paper.columns.values()],
                **paper.rows.get(name, {}),
            }
            for name, model in configs.items()
        },
    }


def verdict(finding: str | None, result: dict | None, within: float) -> str:
    """The sweep's bootstrap `result` of a variant against the paper's `finding`:
    reproduces, contradicts, inconclusive; "" where the paper states no finding."""
    if finding is None:
        return ""
    if result is None or result["seeds"] < 2:
        return "inconclusive"
    ours = result["verdict"]
    if finding == "equal":
        if ours in ("better", "worse"):
            return "contradicts"
        inside = -within < result["low"] and result["high"] < within
        return "reproduces" if inside else "inconclusive"
    if ours == finding:
        return "reproduces"
    return "contradicts" if ours in ("better", "worse") else "inconclusive"


def table(results: dict, metric: str, title: str) -> dict:
    """Each variant beside the paper's row: the paper's columns (our sizes), our
    parameters, the paper's figure and its change from the baseline's, our dev `metric`
    over the seeds and its difference from the baseline with the bootstrap's 95%
    interval, the Holm-adjusted p's, the paper's finding and the verdict against it."""
    paper, baseline = results["paper"], results["baseline"]
    scale = 100 if metric == "exact_match" else 1
    unit = " (%)" if scale == 100 else ""
    head = ["row", *paper["columns"], "params (M)", f"paper {paper['figure']}", "paper Δ"]
    head += [f"our dev {title}{unit}", "our Δ [95%]", "Holm p (t / bootstrap)"]
    head += ["paper's finding", "verdict", "seeds"]
    within = paper["equal_within"].get(metric, 0.0)  # none given: "equal" never reproduces
    rows = [
        _row(name, r, paper, metric, scale, within, judged=name != baseline)
        for name, r in results["variants"].items()
    ]
    caption = (
        f"Each variant beside the paper's row, read against {baseline}: our dev {title} is "
        "the mean ± half-width of the 95% t-interval over the seeds, our Δ the difference "
        "from the baseline with the crossed bootstrap's 95% interval, and the verdict the "
        "sweep's against the paper's finding: reproduces, contradicts or inconclusive "
        f'("equal" reproduces within ± {scale * within:g} point).'
    )
    return {
        "caption": caption,
        "columns": head,
        "rows": rows,
        "align": "l" * len(head),
        "notes": [],
    }


def _row(name: str, r: dict, paper: dict, metric: str, scale: int, within: float, judged: bool):
    row, figures = paper["variants"][name], r["figures"]
    boot = r.get("paired", {}).get("bootstrap", {}).get(metric)
    return [
        name,
        *row["columns"],
        f"{figures['params']['mean'] / 1e6:.2f}" if "params" in figures else "",
        row.get("figure", ""),
        _change(row.get("figure"), paper["baseline_figure"]),
        _mean(figures[metric], scale) if metric in figures else "",
        "" if boot is None else _interval(boot, scale),
        "" if boot is None else _holm(boot),
        f"{row['why']} ({row['finding']})" if "finding" in row else "",
        verdict(row.get("finding"), boot, within) if judged else "",
        sum(s == "done" for s in r["runs"].values()),
    ]


def _change(figure, base) -> str:
    return "" if figure is None or base is None else f"{figure - base:+.1f}"


def _holm(result: dict) -> str:
    """The verdict's two Holm-adjusted p's: the seed-paired t-test's and the bootstrap's."""
    t_p = stats.format_p(result["t_p_holm"])
    return f"{t_p} / {stats.format_p(result['p_holm'], result['p_holm_bound'])}"


def _mean(figure: dict, scale: float) -> str:
    ci = figure["ci95"]
    return f"{scale * figure['mean']:.2f}" + ("" if ci is None else f" ± {scale * ci:.2f}")


def _interval(result: dict, scale: float) -> str:
    d, low, high = (scale * result[k] for k in ("difference", "low", "high"))
    return f"{d:+.2f} [{low:+.2f}, {high:+.2f}]"
