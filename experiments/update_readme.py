"""Rewrite the README's Performance tables from the latest benchmark results.

Reads results/{throughput,attention_bench}.json (written by the two benchmarks) and replaces the text between `<!-- bench:start -->` and `<!-- bench:end -->`
in README.md. Run by `make bench` after the benchmarks.

    python experiments/update_readme.py [--results results] [--readme README.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib

START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def machine_line(m: dict) -> str:
    alloc = pathlib.Path(m["ld_preload"]).name if m.get("ld_preload") else "the system malloc"
    load = m.get("load_average")
    load_text = f", load average {load[0]:.1f} during the run" if load else ""
    return (
        f"{m['processor']}, {m['cpu_count']} CPU cores, {m['backend']} backend, jax {m['jax']}, "
        f"allocator {alloc}{load_text}"
    )


def throughput_table(r: dict) -> list[str]:
    runs = r["runs"]
    torch_ms = runs["torch_float32"]["ms_per_step"]
    names = {
        "jax_float32": "jaxformer, float32",
        "jax_bfloat16": "jaxformer, bfloat16 compute",
        "torch_float32": f"torch.nn.Transformer {r['machine'].get('torch', '')} eager, float32",
    }
    lines = [
        "**Train step** (`python experiments/throughput.py --quick`): d_model 256, 4 heads, "
        "2+2 layers, d_ff 1024, dropout 0.1, shared vocabulary 1000, batch 32 x 64/64 tokens, "
        f"Adam; {r['analytic_flops_per_step'] / 1e9:.1f} GFLOP per step (XLA counts "
        f"{r['xla']['float32']['xla_flops'] / 1e9:.1f}); float32 GEMM peak measured in the same "
        f"run {r['gemm_peak_gflops_median']:.0f} GFLOP/s (median; best "
        f"{r['gemm_peak_gflops_best']:.0f}). Each line is the median over alternating rounds.",
        "",
        "| run | ms / step | target tokens / s | MFU | speed vs torch |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in names.items():
        e = runs[key]
        lines.append(
            f"| {label} | {e['ms_per_step']:.0f} | {e['tokens_per_s']:,.0f} | "
            f"{100 * e['mfu']:.0f}% | {torch_ms / e['ms_per_step']:.2f}x |"
        )
    check = r.get("bf16_loss_check")
    if check:
        lines += [
            "",
            f"bfloat16 vs float32 on `dates` after {check['steps']} steps (same init and "
            f"batches): mean loss of the last {check['mean_of_last_steps']} steps "
            f"{check['final_loss_bfloat16']:.4f} vs "
            f"{check['final_loss_float32']:.4f} ({100 * check['relative_difference']:.2f}% apart).",
        ]
    return lines


def attention_table(r: dict) -> list[str]:
    h = r["headline"]
    lines = [
        "**Attention** (`python experiments/attention_bench.py --quick`): causal self-attention "
        "forward + backward, batch 1, 8 heads, head dim 64, float32; temporaries from XLA's "
        '`memory_analysis()` of the compiled program ("not run": compiled only).',
        "",
        "| T | implementation | ms | temporaries | max abs diff vs xla |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in r["rows"]:
        ms = f"{row['ms']:.1f}" if row["ran"] else "not run"
        mib = row["temp_bytes"] / 2**20
        mem = f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"
        diff = f"{row['max_abs_diff_vs_xla']:.1e}" if "max_abs_diff_vs_xla" in row else ""
        lines.append(f"| {row['T']} | {row['implementation']} | {ms} | {mem} | {diff} |")
    if h.get("chunked_over_xla_time_2048") is not None:
        lines += ["", f"Chunked / plain time at T=2048: {h['chunked_over_xla_time_2048']:.2f}."]
    return lines


def render(results: pathlib.Path) -> str:
    parts = []
    tp_path = results / "throughput.json"
    tp = json.loads(tp_path.read_text()) if tp_path.exists() else None
    machine = tp["machine"] if tp else None
    for name, table in (
        ("throughput.json", throughput_table),
        ("attention_bench.json", attention_table),
    ):
        path = results / name
        if path.exists():
            data = json.loads(path.read_text())
            machine = machine or data.get("machine")
            parts += table(data) + [""]
    if not parts:
        raise SystemExit(f"no results in {results}/: run `make bench` first")
    date = datetime.date.today().isoformat()
    head = [f"Measured {date} by `make bench` on: {machine_line(machine)}.", ""]
    load, cores = (machine.get("load_average") or [0.0])[0], machine.get("cpu_count") or 1
    if load > 0.75 * cores:
        head += [
            f"**The machine was busy** (load average {load:.1f} on {cores} cores): other "
            "processes took CPU time, torch's OpenMP threads suffer from that far more than "
            "XLA's, and the GEMM peak was measured low, so these ratios and MFU figures are "
            "not representative. Re-run `make bench` on an idle machine.",
            "",
        ]
    return "\n".join(head + parts).rstrip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--readme", default="README.md")
    args = parser.parse_args(argv)
    readme = pathlib.Path(args.readme)
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme} has no {START} ... {END} markers")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    readme.write_text(before + START + "\n" + render(pathlib.Path(args.results)) + END + after)
    print(f"updated the Performance tables in {readme}")


if __name__ == "__main__":
    main()
