"""The XLA-vs-eager lab's torch in another interpreter, where this one has none
(`--torch-python`, or one pythons.torch_python finds).

A worker process of that interpreter (rounds.Worker, importing this checkout's code)
builds the same workload (workloads.build at the same sizes and seed: the same weights,
through interop.torch) and serves each torch mode by name (modes.mode_call): a call of one
step is one call of the mode, timed by the worker's clock, so the lab's rounds interleave
it with JAX's modes as they would in-process calls. Asked, it saves each mode's first two
outputs for the agreement check (`outputs`), counts the aten operators (`ops`) and explains
dynamo's graphs (`graphs`). A worker without a workload serves the trivial torch op of
the host part's dispatch costs (`primitive`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pathlib
import tempfile
import time

import numpy as np

from jaxformer_lab.bench import pythons, rounds

PRIMITIVE = "torch primitive"


def spec_of(w, modes: tuple[str, ...], explain: tuple[str, ...] = ()) -> dict:
    """What a worker builds: workload `w` (its name, sizes, dtype), its torch `modes`, and
    the compiled modes whose graphs it explains."""
    c = w.config
    workload = dict(name=w.name, batch=w.batch, length=w.length, d_model=c.d_model)
    workload |= dict(layers=c.num_encoder_layers, vocab=c.vocab_size, dtype=c.dtype)
    return dict(workload=workload, modes=list(modes), explain=list(explain))


class Remote:
    """A started worker serving `spec` (`spec_of`, or {primitive: calls per step}) in the
    interpreter `python`, on torch's `device` ("cpu" or "cuda")."""

    def __init__(self, python: str, device: str, spec: dict):
        self.folder = tempfile.TemporaryDirectory(prefix="xla-vs-eager-torch-")
        spec = spec | {"device": device, "folder": self.folder.name}
        code = "import sys; from jaxformer_lab.bench import torch_side as t; t.serve(sys.argv[1])"
        log = open(pathlib.Path(self.folder.name) / "worker.log", "w")
        env = pythons.worker_env(JAX_PLATFORMS="cpu")  # its JAX builds the workload
        self.worker = rounds.Worker("torch", [python, "-c", code, json.dumps(spec)], env, log)
        self.modes = spec.get("modes", [PRIMITIVE])
        self.ready = rounds.ready_all({"torch": self.worker}, 900)["torch"]
        if "error" in self.ready:
            self.close()
            raise rounds.WorkerError(f"torch's worker: {self.ready['error']}")

    def calls(self) -> dict:
        """Mode -> a call of it in the worker, returning its seconds (stats.Elapsed)."""
        return {m: functools.partial(self.worker.timed, 1, m) for m in self.modes}

    def first_outputs(self) -> tuple[dict, dict]:
        """({mode: its first two outputs as float32 arrays}, {mode: seconds of the first
        two calls, compiling included})."""
        first, built = {}, {}
        programs = self.ready.get("programs", {})
        for m in self.modes:
            said = self.worker.ask("outputs", m)
            with np.load(said["path"]) as saved:
                first[m] = [saved["first"], saved["second"]]
            built[m] = programs[m]["first_step_s"] + said["second_s"]
        return first, built

    def ask(self, question: str):
        return self.worker.ask(question, self.modes[0])

    def close(self) -> None:
        self.worker.close()
        self.folder.cleanup()


@contextlib.contextmanager
def serving(python: str | None, device: str | None, w, modes: tuple, explain: tuple = ()):
    """A Remote serving `w`'s torch modes among `modes` where torch runs in the
    interpreter `python` (None: in this process, or no torch; then None)."""
    torch_modes = tuple(m for m in modes if m.startswith("torch"))
    if python is None or device is None or not torch_modes:
        yield None
        return
    remote = Remote(python, device, spec_of(w, torch_modes, explain))
    try:
        yield remote
    finally:
        remote.close()


def serve(given: str) -> None:
    """The worker's side: build what the spec (JSON) names, serve it (rounds.serve)."""
    rounds.serve(functools.partial(build, json.loads(given)))


def build(spec: dict) -> dict[str, rounds.Program]:
    """The programs of a spec (see `Remote`)."""
    import torch

    from jaxformer_lab.bench import host

    device = host.torch_device("gpu" if spec["device"] == "cuda" else "cpu")
    info = dict(torch=torch.__version__, torch_threads=torch.get_num_threads(), device=device)
    if "primitive" in spec:
        t, n = torch.ones(8, device=device), spec["primitive"]

        def primitive(k: int) -> float:
            for _ in range(k * n):
                out = t + t
            if device == "cuda":
                torch.cuda.synchronize()
            return float(out[0])

        return {PRIMITIVE: rounds.Program(primitive, 0, info)}
    from jaxformer_lab.bench import modes as lab_modes
    from jaxformer_lab.bench.workloads import bench_config
    from jaxformer_lab.bench.workloads import build as build_workload

    a = dict(spec["workload"])
    config = bench_config(a.pop("d_model"), a.pop("layers"), a.pop("vocab"), a.pop("dtype"))
    w = build_workload(a.pop("name"), config, **a)
    calls = lab_modes.mode_calls(w, device, tuple(spec["modes"]))
    eager = ("torch", "torch, fast path")[: 1 if w.stateful else 2]
    asks = {
        "ops": lambda: {m: _ops(w, device, m) for m in eager},
        "graphs": lambda: lab_modes.torch_graphs(w, device, tuple(spec["explain"])),
    }
    programs = {}
    for i, (m, call) in enumerate(calls.items()):
        mode = _Mode(call, pathlib.Path(spec["folder"]) / f"{i}.npz")
        programs[m] = rounds.Program(mode.run, 0, info, asks=asks | {"outputs": mode.saved})
    return programs


def _ops(w, device: str, mode: str) -> dict:
    """modes.torch_ops of one call of `mode`: the operators' number, the attention ones."""
    from jaxformer_lab.bench import modes

    ops = modes.torch_ops(modes.mode_call(w, device, mode))
    return {"ops": sum(ops.values()), "attention": modes.attention_ops(ops)}


class _Mode:
    """A mode's call that keeps its first two outputs (for the agreement check)."""

    def __init__(self, call, path: pathlib.Path):
        self.call, self.path, self.outputs, self.second_s = call, path, [], 0.0

    def run(self, k: int) -> float:
        from jaxformer_lab.bench.modes import to_numpy

        for _ in range(k):
            t0 = time.perf_counter()
            out = self.call()
            if len(self.outputs) < 2:
                self.second_s = time.perf_counter() - t0 if self.outputs else 0.0
                self.outputs.append(to_numpy(out))
        return 0.0

    def saved(self) -> dict:
        """Its first two outputs in an .npz file (calling it again if it has one)."""
        if len(self.outputs) < 2:
            self.run(1)
        np.savez(self.path, first=self.outputs[0], second=self.outputs[1])
        return {"path": os.fspath(self.path), "second_s": self.second_s}
