"""Rewrite the results tables of the docs pages from the committed result files.

Every measured table of the docs lives in a JSON file under docs/results/ (its device,
versions, date and command beside the numbers), and a page shows it between
`<!-- results:NAME:start -->` and `<!-- results:NAME:end -->`, NAME being the file's stem.
This script renders each such section from its file; `tests/test_docs.py` checks that the
committed pages equal what the committed files render to.

With `--results DIR` it first turns the benchmarks' own output there
(throughput.json and attention_bench.json, written by `make bench`) into
docs/results/cpu_train_step.json and cpu_attention.json. Run by `make bench`.

    python experiments/update_docs.py [--results results] [--docs docs]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re

from jaxformer import results as results_lib
from jaxformer.bench.report import docs_tables

# A report of the XLA-vs-eager lab, docs/results/xla_vs_eager/DIR/report.json, rendered by
# the lab's own renderer (jaxformer.bench.report.docs_tables).
LAB_SECTION = re.compile(
    r"(<!-- lab:(?P<dir>[\w.-]+):start -->\n).*?(<!-- lab:(?P=dir):end -->)", re.S
)


def render_page(text: str, results: pathlib.Path) -> str:
    """The page with each results section rendered from results/NAME.json
    (`jaxformer.results`) and each lab section from its report."""

    def lab_section(match: re.Match) -> str:
        path = lab_report(results, match["dir"])
        if not path.exists():
            raise SystemExit(f"a page shows lab:{match['dir']}, but {path} does not exist")
        body = re.sub(r"^#", "##", docs_tables(path), flags=re.M)  # under the page's heading
        body = re.sub(r"\]\((\w+\.png)\)", rf"](xla_vs_eager/{match['dir']}/\1)", body)
        return match.group(1) + body + match.group(3)

    return LAB_SECTION.sub(lab_section, results_lib.render_page(text, results))


def lab_report(results: pathlib.Path, name: str) -> pathlib.Path:
    """The committed report.json of the XLA-vs-eager lab's run `name`."""
    return results / "xla_vs_eager" / name / "report.json"


def pages(docs: pathlib.Path) -> list[pathlib.Path]:
    return sorted(docs.rglob("*.md"))


# --- make bench's own output -> result files -------------------------------------------


def _machine(m: dict) -> str:
    alloc = pathlib.Path(m["ld_preload"]).name if m.get("ld_preload") else "the system malloc"
    load = m.get("load_average")
    load_text = f", load average {load[0]:.1f} during the run" if load else ""
    return f"{m['processor']}, {m['cpu_count']} CPU cores, {m['backend']} backend, allocator {alloc}{load_text}"


def _result(command: str, machine: dict, tables: list[dict]) -> dict:
    versions = {k: machine[k] for k in ("jax", "torch") if machine.get(k)}
    return {
        "command": command,
        "device": _machine(machine),
        "versions": versions,
        "date": datetime.date.today().isoformat(),
        "source": "`make bench` (experiments/update_docs.py --results)",
        "tables": tables,
    }


def train_step_result(r: dict) -> dict:
    """results/throughput.json -> the train step table."""
    runs, machine = r["runs"], r["machine"]
    torch_ms = runs["torch_float32"]["ms_per_step"]
    names = {
        "jax_float32": "jaxformer, float32",
        "jax_bfloat16": "jaxformer, bfloat16 compute",
        "torch_float32": f"torch.nn.Transformer {machine.get('torch', '')} eager, float32",
    }
    rows = [
        [
            label,
            f"{runs[key]['ms_per_step']:.0f}",
            f"{runs[key]['tokens_per_s']:,.0f}",
            f"{100 * runs[key]['mfu']:.0f}%",
            f"{torch_ms / runs[key]['ms_per_step']:.2f}x",
        ]
        for key, label in names.items()
    ]
    caption = (
        "d_model 256, 4 heads, 2+2 layers, d_ff 1024, dropout 0.1, shared vocabulary 1000, "
        f"batch 32 x 64/64 tokens, Adam; {r['analytic_flops_per_step'] / 1e9:.1f} GFLOP per step "
        f"(XLA counts {r['xla']['float32']['xla_flops'] / 1e9:.1f}); float32 GEMM peak measured "
        f"in the same run {r['gemm_peak_gflops_median']:.0f} GFLOP/s (median; best "
        f"{r['gemm_peak_gflops_best']:.0f}). Each line is the median over alternating rounds."
    )
    notes = []
    check = r.get("bf16_loss_check")
    if check:
        notes.append(
            f"bfloat16 vs float32 on `dates` after {check['steps']} steps (same init and "
            f"batches): mean loss of the last {check['mean_of_last_steps']} steps "
            f"{check['final_loss_bfloat16']:.4f} vs {check['final_loss_float32']:.4f} "
            f"({100 * check['relative_difference']:.2f}% apart)."
        )
    columns = ["run", "ms / step", "target tokens / s", "MFU", "speed vs torch"]
    t = {"caption": caption, "columns": columns, "align": "lrrrr", "rows": rows, "notes": notes}
    return _result("python experiments/throughput.py --quick", machine, [t])


def attention_result(r: dict, machine: dict) -> dict:
    """results/attention_bench.json -> the attention table."""
    rows = []
    for row in r["rows"]:
        mib = row["temp_bytes"] / 2**20
        rows.append(
            [
                row["T"],
                row["implementation"],
                f"{row['ms']:.1f}" if row["ran"] else "not run",
                f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB",
                f"{row['max_abs_diff_vs_xla']:.1e}" if "max_abs_diff_vs_xla" in row else "",
            ]
        )
    ratio = r["headline"].get("chunked_over_xla_time_2048")
    caption = (
        "Causal self-attention forward + backward, batch 1, 8 heads, head dim 64, float32; "
        "temporaries from XLA's `memory_analysis()` of the compiled program "
        '("not run": compiled only).'
    )
    columns = ["T", "implementation", "ms", "temporaries", "max abs diff vs xla"]
    notes = [f"Chunked / plain time at T=2048: {ratio:.2f}."] if ratio is not None else []
    t = {"caption": caption, "columns": columns, "align": "rlrrr", "rows": rows, "notes": notes}
    return _result("python experiments/attention_bench.py --quick", machine, [t])


def import_bench(results: pathlib.Path, docs: pathlib.Path) -> None:
    tp_path, attn_path = results / "throughput.json", results / "attention_bench.json"
    if not tp_path.exists() and not attn_path.exists():
        raise SystemExit(f"no results in {results}/: run `make bench` first")
    machine = None
    if tp_path.exists():
        tp = json.loads(tp_path.read_text())
        machine = tp["machine"]
        _write(docs / "results" / "cpu_train_step.json", train_step_result(tp))
    if attn_path.exists():
        attn = json.loads(attn_path.read_text())
        _write(
            docs / "results" / "cpu_attention.json",
            attention_result(attn, machine or attn["machine"]),
        )


def _write(path: pathlib.Path, result: dict) -> None:
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", help="import make bench's output from this folder first")
    parser.add_argument("--docs", default="docs")
    args = parser.parse_args(argv)
    docs = pathlib.Path(args.docs)
    if args.results:
        import_bench(pathlib.Path(args.results), docs)
    for page in pages(docs):
        text = page.read_text()
        new = render_page(text, docs / "results")
        if new != text:
            page.write_text(new)
            print(f"updated {page}")


if __name__ == "__main__":
    main()
