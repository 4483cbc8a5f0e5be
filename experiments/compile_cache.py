"""Time to the first training step of `make train`'s job, with an empty and then a warm
persistent compilation cache (the `jaxformer` command keeps one in
$XDG_CACHE_HOME/jaxformer/jax), and with the cache turned off.

    python experiments/compile_cache.py [--runs 2]

Each run is a fresh `python -m jaxformer train --task dates` process (make train's model
and batch; 2 steps, a small final evaluation) with XDG_CACHE_HOME pointing at a new
folder; "seconds_to_first_step" in its summary.json counts from `train()` being called
(data, model, compilation, the first step; not Python's and JAX's start-up). Prints a JSON
line; writes results/compile_cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
JOB = [
    "--task",
    "dates",
    "--steps",
    "2",
    "--eval-every",
    "2",
    "--eval-examples",
    "64",
    "--no-progress",
]


def run(cache: pathlib.Path, out: pathlib.Path, *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env |= dict(XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    command = [sys.executable, "-m", "jaxformer", "train", *JOB, "--out", str(out), *extra]
    subprocess.run(command, env=env, check=True, capture_output=True)
    summary = json.loads((out / "summary.json").read_text())
    return dict(first_step=summary["seconds_to_first_step"], process=time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="repeats of the cold/warm pair")
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            cache = pathlib.Path(tmp) / f"cache{i}"
            cold = run(cache, pathlib.Path(tmp) / f"cold{i}")
            warm = run(cache, pathlib.Path(tmp) / f"warm{i}")
            off = run(cache, pathlib.Path(tmp) / f"off{i}", "--no-compile-cache")
            rows.append(dict(cold=cold, warm=warm, off=off))
            times = ", ".join(f"{k} {r['first_step']:.2f} s" for k, r in rows[-1].items())
            print(f"{times} to the first step")
    best = {kind: min(r[kind]["first_step"] for r in rows) for kind in ("cold", "warm", "off")}
    summary = {f"{kind}_seconds": s for kind, s in best.items()}
    summary |= dict(speedup=round(best["cold"] / best["warm"], 2), runs=rows)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_cache.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))


if __name__ == "__main__":
    main()
