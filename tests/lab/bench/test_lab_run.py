"""The lab's runner and report: the recorded command reproduces the options given, the
plans keep to their budgets, a busy machine is refused (or every figure marked), parts
resume and a stopped run keeps what it measured, and the report renders every section,
with intervals, from report.json."""

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import types

import numpy as np
import pytest

from jaxformer_lab import results
from jaxformer_lab.bench import load, plan, registry, report, stats
from jaxformer_lab.bench import xla_vs_eager as lab


def _parse(words: list[str]) -> lab.LabOptions:
    parser = argparse.ArgumentParser()
    parser.add_argument("benchmark")
    registry.add_options(parser, lab.LabOptions)
    return registry.options_from(parser.parse_args(words), lab.LabOptions)


def _command(options: lab.LabOptions) -> str:
    return registry.command("xla-vs-eager", options)


def test_the_recorded_command_gives_back_every_option():
    given = lab.LabOptions(
        quick=True,
        rounds=6,
        repeats=1,
        no_torch=True,
        parts=("host", "layer"),
        time_limit=170.0,
        max_load=0.5,
        note="a note with 'quotes' and spaces",
    )
    words = shlex.split(_command(given))
    assert words[:3] == ["jaxformer", "bench", "xla-vs-eager"]
    assert "--rounds" in words and words[words.index("--rounds") + 1] == "6"
    assert _parse(words[2:]) == given
    assert _command(lab.LabOptions()) == "jaxformer bench xla-vs-eager"


def test_the_plans_fit_their_machines_budgets():
    quick = plan.CPU_QUICK
    assert sum(quick.budgets.values()) + plan.STARTUP_S <= plan.CPU_QUICK_S
    gpu = plan.GPU_QUICK
    assert sum(gpu.budgets.values()) + plan.STARTUP_S <= plan.GPU_QUICK_S
    assert all(b + plan.STARTUP_S <= plan.GPU_PART_S for b in plan.GPU_FULL.budgets.values())
    for profile in plan.PROFILES.values():
        assert set(profile.part_names()) == set(profile.budgets), profile.name
        assert all(w in profile.torch_compiled for w in profile.workloads)
    dry = plan.dry(plan.GPU_QUICK)
    assert dry.part_names() == plan.GPU_QUICK.part_names() and dry.rounds == 6


def test_others_cores_are_the_busy_time_not_ours():
    tick = load.TICK
    a, b = (0.0, 1000, 500), (2.0, 1000 + 4 * tick, 500 + tick)  # 4 core-s busy, 1 ours
    assert load.others_cores(a, b) == pytest.approx(1.5)
    assert load.verdict({"others_cores": 0.2}, 0.25) and not load.verdict(
        {"others_cores": 0.3}, 0.25
    )
    sample = load.probe(0.2)
    assert sample["others_cores"] >= 0 and sample["cores"] == len(os.sched_getaffinity(0))


def test_our_count_keeps_the_time_of_a_grandchild_its_child_reaped():
    """A sweep's runs are its children's children: each run's CPU time stays ours after
    the sweep reaps it, not a jump in the others' cores."""
    burn = "import time\nwhile time.process_time() < 0.5: pass"
    child = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n"
        "print('reaped', flush=True)\n"
        "time.sleep(60)"
    )
    before = load.snapshot()
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "reaped"
        after = load.snapshot()
    finally:
        proc.kill()
        proc.wait()
    assert after[2] - before[2] >= 0.5 * load.TICK  # the grandchild's half second of CPU


def _busy(seconds):
    return {"others_cores": 1.9, "window_s": seconds, "load_average": 4.0, "cores": 2}


def test_a_busy_machine_is_refused_naming_the_way_out(monkeypatch, tmp_path):
    monkeypatch.setattr(load, "probe", _busy)
    with pytest.raises(
        ValueError, match="machine is busy: other processes kept 1.90 of 2.*--allow-load"
    ):
        lab.run_lab(lab.LabOptions(quick=True, out=str(tmp_path)))
    assert not (tmp_path / "report.json").exists()


def test_parts_that_do_not_fit_the_time_limit_are_left_for_the_next_call(monkeypatch, tmp_path):
    monkeypatch.setattr(load, "probe", _busy)
    # 8 s: less than either part's budget, more than the set-up takes on a busy machine
    # (no torch to import)
    options = lab.LabOptions(
        quick=True,
        dry_run=True,
        no_torch=True,
        out=str(tmp_path),
        parts=("host", "layer"),
        time_limit=8,
    )
    record = registry.run("xla-vs-eager", options)  # the record, in the report's folder
    headline = record.data["headline"]
    assert headline["missing"] == plan.CPU_QUICK.part_names() and headline["loaded"] is False
    assert "Parts not measured yet: host, attention" in record.markdown()
    result = json.loads((tmp_path / "report.json").read_text())
    assert result["command"] == _command(options) == record.command
    assert result["load"]["others_cores"] == 1.9
    assert record.body == report.tables(result)  # the report, as the docs show it
    assert "Parts not measured yet: host, attention" in (tmp_path / "report.md").read_text()


def test_parts_of_another_run_are_refused(tmp_path):
    record = {"name": "host", "fingerprint": {"plan": "cpu"}, "result": {}}
    lab.save_part(tmp_path / "parts", record)
    with pytest.raises(ValueError, match="holds parts of another run"):
        lab.read_parts(tmp_path / "parts", {"plan": "cpu quick"})
    assert lab.read_parts(tmp_path / "parts", {"plan": "cpu"})["host"] == record
    (tmp_path / "parts" / "layer.json").write_text('{"name": "lay')  # cut short
    assert list(lab.read_parts(tmp_path / "parts", {"plan": "cpu"})) == ["host"]


@pytest.mark.slow
def test_sigterm_keeps_what_was_measured_and_a_rerun_resumes(tmp_path):
    cmd = [sys.executable, "-m", "jaxformer", "bench", "xla-vs-eager", "--quick", "--dry-run"]
    cmd += ["--out", str(tmp_path), "--parts", "host", "compile"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:  # progress from the start
        lines.append(line)
        if line.startswith("[2/2] compile"):
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM during part compile" in err and "Traceback" not in err
    assert not (tmp_path / "record.json").exists()  # a stopped run writes its report only
    assert lines[0].startswith("jaxformer bench xla-vs-eager: measuring the machine's load")
    assert "USDT" not in "".join(lines) + out + err
    result = json.loads((tmp_path / "report.json").read_text())
    assert result["stopped"] == "SIGTERM during part compile"
    done = {p["name"] for p in result["plan"]["parts"] if p["status"] == "done"}
    assert done == {"host"} and "--parts host compile --dry-run" in result["command"]
    again = subprocess.run(cmd[:-1], capture_output=True, text=True, check=True)  # host only
    assert "host: done (kept)" in again.stderr


def test_a_stop_during_torchs_explain_is_not_swallowed_as_its_failure(monkeypatch):
    """A mode explain cannot trace is recorded as its error; a stop (SIGTERM, the time
    limit) raised inside explain stops the lab."""
    torch = pytest.importorskip("torch")
    from jaxformer_lab.bench import modes

    workload = types.SimpleNamespace(torch=lambda device: (None, (), lambda module: None))
    raised = []

    def explain(fn):
        def explained(*args):
            raise raised[-1]

        return explained

    monkeypatch.setattr(torch._dynamo, "explain", explain)
    raised.append(RuntimeError("cannot trace"))
    graphs = modes.torch_graphs(workload, "cpu", ("torch.compile",))
    assert graphs == {"torch.compile": {"error": "RuntimeError: cannot trace"}}
    raised.append(registry.Stopped("SIGTERM during part counts", 143))
    with pytest.raises(registry.Stopped, match="SIGTERM"):
        modes.torch_graphs(workload, "cpu", ("torch.compile",))


def _row(name, eager_ms, jit_ms, rng, **extra):
    """A workload row from constructed timings (jit's rounds x eager_ms / jit_ms for
    eager), with the counts, launches and torch facts a run records."""
    jit = list(rng.lognormal(np.log(jit_ms / 1e3), 0.1, 12))
    times = {
        "eager": [t * eager_ms / jit_ms for t in jit],
        "jit": jit,
        "python": list(np.array(jit) / 50),
    }
    times["torch"] = list(rng.permutation(jit))  # as fast as jit: a ratio spanning 1
    counts = {
        "dispatches": {"primitives": 90, "jit_calls": 10, "total": 100},
        "launched": {"eager": {"launches": 95, "transfers": 30, "events": {}}},
        "jaxpr_equations": 120,
        "hlo_ops_before": 200,
        "hlo_ops_after": 50,
        "fusions": 30,
        "flops": 1e8 * eager_ms,
        "bytes_unfused": 1e7 * eager_ms * (1 + rng.random()),
        "bytes_fused": 4e6 * eager_ms,
        "memory_plan": None,
    }
    return {
        "workload": name,
        "d_model": 64,
        "batch": 4,
        "length": 16,
        "layers": 1,
        "times": times,
        "timing": {m: stats.median_ci(t) for m, t in times.items()},
        "ratios": {"eager / jit": stats.paired_ratio(times["eager"], jit)}
        | {"torch / jit": stats.paired_ratio(times["torch"], jit)},
        "agreement": {"jit": {"max_abs_diff": 0.0, "agrees": True}},
        "tolerance": 1e-4,
        "counts": counts,
        "attention_path": {"jax": "xla", "torch": {"torch": ["aten.scaled_dot_product_attention"]}},
        "torch_ops": {"torch": {"ops": 29, "attention": ["aten.scaled_dot_product_attention"]}},
        "torch_graphs": {"torch.compile step": {"graphs": 3, "breaks": 2, "reasons": ["backward"]}},
        "unavailable": {"torch.compile reduce-overhead": "CUDA graphs need CUDA tensors"},
    } | extra


def _first(median):
    return {"median": median, "low": median * 0.9, "high": median * 1.1, "n": 3, "confidence": 0.75}


def _records(rng) -> dict:
    ci = {"median": 1e10, "low": 9e9, "high": 1.1e10}
    host = {
        "machine": {
            "device": "cpu (cpu)",
            "jax": "x",
            "flax": "y",
            "cpu_count": 2,
            "xla_intra_op_threads": 2,
            "torch": "z",
            "torch_threads": 2,
            "torch_device": "cpu",
        },
        "roofs": {"gemm_flops": ci, "gemm_n": 512, "bandwidth_bytes": ci},
        "dispatch_us": {
            k: {"median": 10.0, "low": 9.0, "high": 11.0}
            for k in ("eager primitive", "jit call", "host-to-device put")
        },
        "nnx_overheads": None,
    }
    results = {"host": host}
    sizes = (
        ("attention", 4.0, 1.0),
        ("layer", 6.0, 2.0),
        ("forward", 9.0, 2.5),
        ("train_step", 30.0, 10.0),
    )
    for name, e, j in sizes:
        results[name] = _row(name, e, j, rng)
    fresh = {
        m: {"first_call_s": _first(s), "peak_rise_bytes": _first(2**20)}
        for m, s in (("eager", 5.0), ("jit", 2.0))
    }
    results["first-calls-train_step"] = {"workload": "train_step", "fresh": fresh}
    return {
        n: {
            "name": n,
            "result": r,
            "wall_s": 1.0,
            "quiet": n != "layer",
            "date": "d",
            "load": {"others_cores": 1.0 if n == "layer" else 0.0},
        }
        for n, r in results.items()
    }


def _result(rng):
    options = lab.LabOptions(quick=True, rounds=12, note="Under test.")
    guard = {"others_cores": 0.1, "cores": 2, "load_average": 0.5, "max_cores": 0.25, "quiet": True}
    return lab.assemble(
        _records(rng), options, plan.CPU_QUICK, {"start": 0.0, "guard": guard, "earlier": []}
    )


def test_the_report_carries_intervals_verdicts_and_load_marks(tmp_path):
    result = _result(np.random.default_rng(0))
    text = report.markdown(result)
    assert text.startswith(
        "# XLA vs eager\n\n**A --quick run** (a small model, few repeats). **Under test.**"
    )
    assert "| attention | eager / jit | 4.00 (4.00-4.00) | yes |" in text  # constructed 4x
    assert "| layer **(loaded)** | eager | " in text  # its part ran while others were busy
    assert "during layer other processes kept more than 0.25 cores busy" in text
    be = "| train_step | jit vs eager | 5.00 (4.50-5.50; 3 processes, 75%) | 2.00 (1.80-2.20; "
    assert be in text and "| from call 1 |" in text
    assert "| train_step | torch.compile step | 3 | 2 | backward |" in text
    assert "not run: CUDA graphs need CUDA tensors" in text
    assert "| 100 (90 + 10) | 95, 30 |" in text  # estimated; launched, puts
    assert "### Where the model fails" in text and result["why"]["points"] == 4
    assert "Parts not measured yet: scale, compile, recompile" in text
    assert "](roofline.png)" not in text  # drawn when the last part is done: none yet
    for part in result["plan"]["parts"]:
        part["status"] = "done"
    assert "![roofline](roofline.png)" in report.markdown(result)


def test_a_page_shows_the_labs_record_with_its_report_one_level_down(tmp_path):
    result = _result(np.random.default_rng(1))
    for part in result["plan"]["parts"]:
        part["status"] = "done"  # the report links its figures
    record = results.Record([], "jaxformer bench xla-vs-eager", "cpu", "2026-01-01", "s")
    record.body = report.tables(result)
    record.write(tmp_path / "results/xla_vs_eager/run1/record.json")
    marker = "<!-- results:xla_vs_eager/run1/record:{} -->\n"
    page = "# Lab\n\n" + marker.format("start") + marker.format("end")
    shown = results.render_page(page, tmp_path / "results", tmp_path)
    assert "\n### Modes: ms per call\n" in shown and "\n## Modes" not in shown
    assert "](results/xla_vs_eager/run1/roofline.png)" in shown
    assert shown.rstrip().endswith("source: s.*\n" + marker.format("end").rstrip())


def test_too_few_rounds_is_one_line_and_exit_2(tmp_path):
    cmd = [sys.executable, "-m", "jaxformer", "bench", "xla-vs-eager", "--rounds", "3"]
    result = subprocess.run(
        cmd + ["--out", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "--rounds must be >= 6" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_quick_plan_runs_every_part_and_reports_it(tmp_path):
    cmd = [sys.executable, "-m", "jaxformer", "bench", "xla-vs-eager", "--quick", "--dry-run"]
    done = subprocess.run(
        cmd + ["--out", str(tmp_path)], capture_output=True, text=True, check=True
    )
    headline = json.loads(done.stdout.strip().splitlines()[-1])
    assert headline["missing"] == [] and "USDT" not in done.stdout + done.stderr
    assert headline["record"] == str(tmp_path / "record.json")
    result = json.loads((tmp_path / "report.json").read_text())
    assert {p["status"] for p in result["plan"]["parts"]} == {"done"}
    for row in result["workloads"]:
        assert all(a["agrees"] for a in row["agreement"].values()), row["workload"]
        assert (
            row["counts"]["launched"]["eager"]["launches"] <= row["counts"]["dispatches"]["total"]
        )
    text = (tmp_path / "report.md").read_text()
    for heading in ("## Summary", "## First calls", "### Where the model fails", "## Scale"):
        assert heading in text
    for heading in ("## Compiling the train step", "## Variable lengths", "## NNX's per-call"):
        assert heading in text
    folder = {p.name for p in tmp_path.iterdir()}
    assert folder >= {"report.md", "modes.png", "scale.png", "parts"}
