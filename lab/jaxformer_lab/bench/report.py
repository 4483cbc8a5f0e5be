"""The XLA-vs-eager lab's report.md, every table rendered from the lab's result dict
(report.json): `markdown` for report.md, `tables` for the body of the lab's record (the
documentation renders it). Every derived figure is printed with its interval; a section measured while
other processes kept the machine busy is marked; sections a run did not measure (a part
not run, or a report of an earlier lab version) are left out. The why: report_why.py;
the PNGs: plots.py."""

from __future__ import annotations

from jaxformer_lab.bench import report_why
from jaxformer_lab.bench.fmt import figure, first, g, mark, mib, ms, part_of, x
from jaxformer_lab.markdown import table


def markdown(result: dict) -> str:
    """The whole report.md."""
    return "# XLA vs eager\n\n" + tables(result)


def tables(result: dict) -> str:
    """Every table of the report, in markdown, from the lab's result dict."""
    sections = [_header, _plan, report_why.summary, _modes, _ratios, _break_evens]
    sections += [report_why.programs, report_why.eager_call, report_why.model]
    sections += [_memory, _torch_side, _dispatch, _overheads, _bf16, _compile, _recompile]
    sections += [_scale]
    lines = [line for section in sections for line in section(result)]
    return "\n".join(lines) + "\n"


def _header(result: dict) -> list[str]:
    m = result.get("machine") or {}
    label = "**A --quick run** (a small model, few repeats). " if result["quick"] else ""
    label += (
        "**A dry run: tiny sizes, no figure is a measurement.** " if result.get("dry_run") else ""
    )
    label += f"**{result['note']}** " if result.get("note") else ""
    torch = f"torch {m['torch']} ({m['torch_threads']} threads)" if "torch" in m else "no torch"
    if m.get("torch_python"):
        t = m["torch_python"]
        torch += f" in a worker of Python {t['python']} ({t['path']}, its jax {t['jax']})"
    if "torch" in m and m.get("omp_wait_policy"):
        torch += f", OMP_WAIT_POLICY={m['omp_wait_policy']}"
    cpu = m.get("cpu") or {}
    chip = f"{cpu['model']}, flags read from /proc/cpuinfo: {cpu['widest_simd']} " if cpu else ""
    chip += f"({', '.join(cpu['flags'])}); " if cpu else ""
    lines = [
        f"{label}`{result['command']}` on {m.get('device', 'a device not yet recorded')}: "
        f"{chip}jax {m.get('jax')} (Python {m.get('python')}), flax {m.get('flax')}, {torch}, "
        "XLA's intra-op threads "
        f"{m.get('xla_intra_op_threads')}, {m.get('cpu_count')} CPU cores; {_wall(result)}.",
        "",
        f"Model: {result['model']}. Times: median ms per call over {result['rounds']} "
        "interleaved rounds after warm-up (95% interval of the median). Ratios: the median "
        "of per-round ratios (each round is a pair; 95% order-statistic interval).",
    ]
    return lines + _revalidated(result) + _load_lines(result) + _stopped(result)


def _revalidated(result: dict) -> list[str]:
    r = result.get("revalidated")
    if not r:
        return []
    return [
        "",
        f"**Derived figures recomputed** ({r['date']}) from this run's own per-round times, "
        f"counts and roofs by `{r['command']}`: the fitted model scored out of sample, every "
        f"derived figure with its interval. This run's lab version did not measure "
        f"{r['not_measured']}.",
    ]


def _wall(result: dict) -> str:
    """The run's seconds: its parts' in all (and its calls') or, for an earlier lab
    version, the one call's."""
    if "parts_wall_s" not in result:
        return f"{result['wall_s']:.0f} s"
    calls = result["calls"]
    walls = " + ".join(f"{c['wall_s']:.0f}" for c in calls)
    return f"{result['parts_wall_s']:.0f} s in its parts; {len(calls)} call(s): {walls} s"


def _load_lines(result: dict) -> list[str]:
    load = result.get("load")
    if load is None:
        m = result.get("machine") or {}
        return [
            "",
            f"Load: this lab version recorded only the load average ({m.get('load_before', 0):.2f} "
            f"before, {m.get('load_after', 0):.2f} after, the lab's own processes included); "
            "it did not measure other processes' use of the cores.",
        ]
    loaded = load["loaded_parts"]
    verdict = (
        f"**measured under load**: during {', '.join(loaded)} other processes kept more than "
        f"{load['max_cores']:g} cores busy; the sections from those parts are marked "
        "**(loaded)** and their timings are not a quiet machine's."
        if loaded
        else f"every part ran while other processes kept at most {load['max_cores']:g} cores busy."
    )
    calls = result.get("calls") or [load]
    before = ", ".join(f"{c['others_cores']:.2f}" for c in calls)
    averages = ", ".join(f"{c['load_average']:.1f}" for c in calls)
    return [
        "",
        f"Load (other processes' use of this process's cores, from /proc/stat less the lab's "
        f"own CPU time): {before} of {load['cores']} cores before each call (load average "
        f"{averages}); {verdict}",
    ]


def _stopped(result: dict) -> list[str]:
    missing = [
        p["name"] for p in (result.get("plan") or {}).get("parts", []) if p["status"] != "done"
    ]
    lines = []
    if result.get("stopped"):
        lines += ["", f"**Stopped by {result['stopped']}**: the report holds the parts done."]
    if missing:
        lines += [
            "",
            f"Parts not measured yet: {', '.join(missing)} (rerun the command to add them).",
        ]
    return lines


def _plan(result: dict) -> list[str]:
    plan = result.get("plan")
    if not plan:
        return []
    rows = [
        [
            p["name"],
            p["budget_s"],
            f"{p['wall_s']:.0f}" if "wall_s" in p else "",
            f"{p['others_cores']:.2f}" if "others_cores" in p else "",
            {True: "quiet", False: "**loaded**"}.get(p.get("quiet"), p["status"]),
        ]
        for p in plan["parts"]
    ]
    lines = [
        "",
        f"## Plan: {plan['profile']}",
        "",
        f"Budgets (s) on a quiet 2-core CPU or one H100, compiling included; the plan's total "
        f"with the process's start: {plan['budget_s']} s.",
        "",
    ]
    columns = ["part", "budget s", "wall s", "others' cores", "load"]
    return lines + table(columns, rows, "lrrrl")


def _modes(result: dict) -> list[str]:
    rows = [
        [r["workload"] + mark(result, r["workload"]), mode, ms(ci)]
        for r in result["workloads"]
        for mode, ci in r["timing"].items()
        if mode != "python"
    ]
    if not rows:
        return []
    lines = ["", "## Modes: ms per call", "", *table(["workload", "mode", "ms"], rows, "llr")]
    return lines + _agreement(result)


def _agreement(result: dict) -> list[str]:
    checked = result["workloads"] + (result.get("scale") or [])
    checked += [result["bf16"]] if result.get("bf16") else []
    flagged = [
        f"{r['workload']} {r.get('axis', '')} {r.get('value', '')} {mode} ({a['max_abs_diff']:.2g})"
        for r in checked
        for mode, a in r["agreement"].items()
        if not a["agrees"]
    ]
    worst = max(a["max_abs_diff"] for r in checked for a in r["agreement"].values())
    tolerance = max(r.get("tolerance", result.get("tolerance") or 0) for r in checked)
    return [
        "",
        f"Outputs, here and in the scale sweep: every mode agrees with jit within "
        f"{tolerance:g} of the largest output (largest difference {worst:.2g})."
        if not flagged
        else f"**Outputs that disagree with jit** (max abs difference): {', '.join(flagged)}.",
    ]


def _ratios(result: dict) -> list[str]:
    rows = [
        [r["workload"] + mark(result, r["workload"]), name, x(ci), _significant(ci)]
        for r in result["workloads"]
        for name, ci in r["ratios"].items()
    ]
    if not rows:
        return []
    lines = ["", "## Paired ratios (slower / faster per round; > 1: the second is faster)", ""]
    columns = ["workload", "ratio", "median (95% interval)", "significant"]
    return lines + table(columns, rows, "llrl")


def _significant(ci: dict) -> str:
    return "no" if ci["low"] <= 1 <= ci["high"] else "yes"


def _break_evens(result: dict) -> list[str]:
    rows = []
    for r in result["workloads"]:
        for fast, b in r.get("break_even", {}).items():
            slow = "eager" if fast == "jit" else "torch"
            f = r["fresh"]
            part = mark(result, *part_of(r["workload"], fast))
            rows.append(
                [r["workload"] + part, f"{fast} vs {slow}", first(f[slow]["first_call_s"])]
                + [first(f[fast]["first_call_s"]), ms(b["saving_s"]), _pays(b)]
            )
    if not rows:
        return []
    caches = result.get("lab", 1) >= 2
    lines = [
        "",
        "## First calls and break-even",
        "",
        "First calls (compiling included) in fresh processes, "
        + (
            "with JAX's persistent cache off and Inductor's FX graph and autograd caches off "
            "(an empty cache folder)"
            if caches
            else "each with an empty JAX persistent cache (minimum compile time 0: every "
            "program written) and Inductor cache"
        )
        + f"; {result['repeats']} per mode (the interval's coverage beside it). Break-even: "
        "calls until the compiled mode's total time, from its first call, is below the "
        "other's, from its first call; 'not significant' where the per-call saving's 95% "
        "interval contains 0.",
        "",
    ]
    columns = ["workload", "compiled", "other's first call s", "compiled's first call s"]
    columns += ["saving ms per call", "pays off after (calls)"]
    return lines + table(columns, rows, "llrrrr")


def _pays(b: dict) -> str:
    if b["calls"] is None:
        return b["verdict"]
    if b["verdict"] == "from call 1" and b["high"] == 1:
        return "from call 1"
    return f"{b['calls']:,} ({b['low']:,}-{b['high']:,})"


def _memory(result: dict) -> list[str]:
    rows = []
    for r in result["workloads"] + ([result["bf16"]] if result.get("bf16") else []):
        name = r["workload"] + (
            "" if r.get("dtype", "float32") == "float32" else f" ({r['dtype']})"
        )
        for key, label in (
            ("memory_plan", "XLA's plan (jit)"),
            ("memory_plan_no_donation", "XLA's plan (jit, no donation)"),
        ):
            plan = r["counts"].get(key)
            if plan is not None:
                rows.append(
                    [name, label, mib(plan["temporaries"] + plan["outputs"] - plan["aliased"]), ""]
                )
        for mode, f in r.get("fresh", {}).items():
            parts = (
                ("bf16-train_step",) if r is result.get("bf16") else part_of(r["workload"], mode)
            )
            named = name + mark(result, *parts)
            if "error" in f:
                rows.append([named, mode, f"failed: {f['error']}", ""])
            else:
                rows.append([named, mode, _rise(f["peak_rise_bytes"]), first(f["first_call_s"])])
    if not rows:
        return []
    lines = [
        "",
        "## Memory: one call's rise, each mode in fresh processes",
        "",
        f"Every mode alike: first call, one warm-up call, the arguments resident, then the "
        f"peak reset and one call measured: the rise of the {_memory_measure(result)} "
        "(arguments excluded on every side); median over the processes with the interval's "
        "coverage. jit donates the train step's state, as the trainer does; the nnx modes "
        "and 'jit, no donation' do not; torch updates in place. XLA's plan: temporaries + "
        "outputs - aliased bytes of the jit program (exact).",
        "",
    ]
    return lines + table(["workload", "mode", "MiB", "first call s"], rows, "llrr")


def _memory_measure(result: dict) -> str:
    gpu = "gpu" in (result.get("machine") or {}).get("device", "")
    return "device's peak bytes in use" if gpu else "process's resident peak"


def _rise(r) -> str:
    """A memory rise: from one process (an earlier lab version) or several."""
    if isinstance(r, int | float):
        return f"{mib(r)} (1 process)"
    if r["n"] == 1:
        return f"{mib(r['median'])} (1 process)"
    return f"{mib(r['median'])} ({mib(r['low'])}-{mib(r['high'])}; {r['confidence']:.0%})"


def _torch_side(result: dict) -> list[str]:
    m = result.get("machine") or {}
    if not result["workloads"]:
        return []
    if "torch" not in m:
        return ["", "torch was not run (--no-torch or not installed)."]
    paths = (
        "'torch' runs op by op, its fused inference fast path off; 'torch, fast path' is "
        "torch's default for inference. Operators: the aten operators one call dispatched "
        "(a TorchDispatchMode counts them). Graphs and breaks: torch._dynamo.explain over "
        "one call of what each compiled mode compiles."
        if result.get("lab", 1) >= 2
        else "'torch' ran torch's default path: its fused inference fast path where it "
        "applies (the attention operators its profiler saw, below)."
    )
    lines = [
        "",
        "## PyTorch, made comparable",
        "",
        f"torch's intra-op threads are set to XLA's ({m['xla_intra_op_threads']}; torch "
        f"reports {m['torch_threads']}). {paths}",
        "",
    ]
    rows = [
        [r["workload"], r["attention_path"]["jax"], *_torch_ops(r)] for r in result["workloads"]
    ]
    columns = ["workload", "JAX attention", "torch op by op: ops (attention)"]
    lines += table(columns + ["torch fast path: ops (attention)"], rows, "llll")
    return lines + _graphs(result)


def _torch_ops(r: dict) -> list[str]:
    """Op by op and fast path: aten operators per call and the attention ones; an earlier
    lab's report has the attention operators of torch's default path only."""
    ops = r.get("torch_ops")
    if ops is None:
        return ["", ", ".join(r["attention_path"].get("torch", []))]
    cells = []
    for mode in ("torch", "torch, fast path"):
        o = ops.get(mode)
        cells.append(f"{o['ops']} ({', '.join(o['attention']) or 'none'})" if o else "")
    return cells


def _graphs(result: dict) -> list[str]:
    rows = []
    for r in result["workloads"]:
        for mode, gr in r.get("torch_graphs", {}).items():
            if "error" in gr:
                rows.append([r["workload"], mode, "", "", f"explain failed: {gr['error']}"])
            else:
                rows.append(
                    [r["workload"], mode, gr["graphs"], gr["breaks"], "; ".join(gr["reasons"])]
                )
        for mode, why in r.get("unavailable", {}).items():
            rows.append([r["workload"], mode, "", "", f"not run: {why}"])
    if not rows:
        return []
    columns = ["workload", "compiled mode", "graphs", "breaks", "first break reasons"]
    return ["", *table(columns, rows, "llrrl")]


def _dispatch(result: dict) -> list[str]:
    d = result.get("dispatch_us")
    if not d:
        return []
    lines = ["", "## Dispatch: one trivial call (8 numbers), us" + mark(result, "host"), ""]
    rows = [[name, g(ci)] for name, ci in d.items()]
    return lines + table(["call", "us (95% interval)"], rows, "lr")


def _overheads(result: dict) -> list[str]:
    over = result.get("nnx_overheads")
    if not over:
        return []
    lines = [
        "",
        "## NNX's per-call overhead against the module's graph (8x8 Linear layers)"
        + mark(result, "host"),
        "",
        "The same tiny compiled program called each way, interleaved; us per call, and "
        "each way's extra over jax.jit on the parameters as plain dicts (paired per-round "
        "difference, 95% interval).",
        "",
    ]
    ways = [k for k in _NNX_WAYS if k in next(iter(over.values()))["us"]]  # older runs: 3
    rows = [
        [
            layers,
            o["variables"],
            g(o["us"]["plain jit"]),
            *(f"{g(o['us'][k])}; +{g(o['extra_us'][k])}" for k in ways),
        ]
        for layers, o in over.items()
    ]
    columns = ["layers", "Variables", "plain jit us", *(f"{k} us; extra" for k in ways)]
    return lines + table(columns, rows, "rrr" + "r" * len(ways))


_NNX_WAYS = ("jit split/merge", "nnx.jit", "nnx.jit(graph=False)", "nnx.cached_partial")


def _bf16(result: dict) -> list[str]:
    r = result.get("bf16")
    if not r:
        return []
    lines = ["", "## The train step in bfloat16" + mark(result, "bf16-train_step"), ""]
    rows = [[mode, ms(ci)] for mode, ci in r["timing"].items() if mode != "python"]
    rows += [[name, x(ci)] for name, ci in r["ratios"].items()]
    return lines + table(["mode or ratio", "ms or ratio (95% interval)"], rows, "lr")


def _compile(result: dict) -> list[str]:
    c = result.get("compile")
    if not c:
        return []
    lines = [
        "",
        "## Compiling the train step against depth and width" + mark(result, "compile"),
        "",
        "Seconds of trace + lower and of XLA's compile with JAX's persistent cache off, "
        "cold (an empty folder: compiles and writes) and warm (reads what the cold compile "
        "wrote), as the plan measured them (columns), each after clearing the in-memory "
        "caches; median over the repeats (range, with its coverage).",
        "",
    ]
    keys = list(c["rows"][0]["times_s"])
    rows = [
        [r["d_model"], r["layers"], *(first(r["times_s"][k], "repeat") for k in keys)]
        for r in c["rows"]
    ]
    return lines + table(["d_model", "layers", *keys], rows, "rr" + "r" * len(keys))


def _recompile(result: dict) -> list[str]:
    v = result.get("recompile")
    if not v:
        return []
    lines = [
        "",
        "## Variable lengths: recompilations and padding" + mark(result, "recompile"),
        "",
        f"One encoder layer (d_model {v['d_model']}, batch {v['batch']}) over batches of "
        f"{v['lengths']} tokens, right-padded rows masked by length. Compilations: those "
        "the first pass made (XLA programs; dynamo graphs). First pass: its seconds, "
        "compiling included, from empty in-memory caches (JAX's persistent cache and "
        "Inductor's FX graph cache off; Inductor's compiled kernels on disk are reused "
        "across repeats). Warm pass: interleaved rounds.",
        "",
    ]
    rows = [
        [name, ", ".join(map(str, f["compiles"])), f"{v['padded_share'][name]:.0%}"]
        + [first(f["first_pass_s"], "repeat"), ms(v["steady_s"][name])]
        for name, f in v["first"].items()
    ]
    columns = ["strategy", "compilations", "padding", "first pass s", "warm pass ms"]
    lines += table(columns, rows, "lrrrr")
    ratios = [[name, x(ci), _significant(ci)] for name, ci in v["ratios"].items()]
    return lines + [
        "",
        *table(["warm pass ratio", "median (95% interval)", "significant"], ratios, "lrl"),
        *_recompile_reasons(v),
    ]


def _recompile_reasons(v: dict) -> list[str]:
    """Why each JAX strategy compiled, batch by batch, as jax_explain_cache_misses said
    (runs of a lab version without it: nothing)."""
    rows = [
        [name, r["length"], r["reason"]]
        for name, f in v["first"].items()
        for r in f.get("reasons", [])
    ]
    if not rows:
        return []
    return [
        "",
        "Why JAX compiled, per batch (the reason `jax_explain_cache_misses` logs for each "
        "tracing-cache miss, its closing clause; one more pass per strategy from empty "
        "caches, untimed):",
        "",
        *table(["strategy", "batch's length", "reason"], rows, "lrl"),
    ]


def _scale(result: dict) -> list[str]:
    if not result.get("scale"):
        return []
    lines = [
        "",
        "## Scale: the forward pass as the model, batch and sequence grow" + mark(result, "scale"),
        "",
        *figure(result, "scale.png"),
    ]
    predicted = report_why.predicted_by_point(result)
    rows = []
    for r in result["scale"]:
        t = r["timing"]
        times = [ms(t.get(mode)) for mode in ("eager", "jit", "torch", "torch.compile")]
        rows.append(
            [r["axis"], r["value"], *times, x(r["ratios"]["eager / jit"])]
            + [predicted.get((r["axis"], r["value"]), "")]
        )
    columns = ["axis", "value", "eager ms", "jit ms", "torch ms", "torch.compile ms"]
    columns += ["jit speed-up (paired)", "predicted (fitted to every point)"]
    return lines + table(columns, rows, "l" + "r" * 7)
