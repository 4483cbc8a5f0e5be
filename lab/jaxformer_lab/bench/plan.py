"""What a run of the XLA-vs-eager lab measures, and how long each part may take.

A plan is a list of parts, each with a time budget in seconds: on a quiet 2-core CPU for
the CPU profiles, on one H100 for the GPU ones, compiling included. The GPU quick plan sums
to at most GPU_QUICK_S (a loan's command, process start included); every GPU part is at
most GPU_PART_S, so the full GPU run goes in calls of a few parts each (--parts,
--time-limit), resuming in the same folder. The budgets are declared here once; the run
records each part's wall time beside its budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

CPU_QUICK_S = 450  # the CPU quick plan, on a quiet 2-core CPU
GPU_QUICK_S = 180  # the GPU quick plan, on one H100, with the process's start (~15 s)
GPU_PART_S = 240  # any GPU call of a part, the process's start included: loans are 15 min
STARTUP_S = 15  # importing JAX and torch, the load probe and the final plots


# Pairs (slower, faster) compared beside "X / jit": torch eager against its other modes.
TORCH_PAIRS = tuple(
    ("torch", m)
    for m in (
        "torch, fast path",
        "torch.compile",
        "torch.compile max-autotune",
        "torch.compile reduce-overhead",
        "torch.compile step",
        "torch.compile functional step",
    )
)


@dataclass(frozen=True)
class Profile:
    """The sizes and modes of one plan (see PROFILES)."""

    name: str
    point: dict  # d_model, layers, batch, length of the four workloads
    rounds: int
    repeats: int  # fresh processes per first call
    workloads: tuple[str, ...]
    torch_compiled: dict  # workload -> its timed torch.compile modes
    first_calls: tuple  # (part name, workload, modes) run in fresh processes
    scale_axes: dict  # axis -> values (the forward pass), moved one at a time from center
    scale_center: dict
    scale_modes: tuple[str, ...]
    compile_points: tuple  # the train step's (d_model, layers) for compile times
    lengths: tuple[int, ...]  # the variable-length workload's batches
    recompile_size: dict  # d_model, batch of the variable-length workload
    overhead_sizes: tuple[int, ...]  # layers of the module whose NNX overheads are timed
    roofs: dict  # gemm_n, stream_mib
    budgets: dict = field(default_factory=dict)  # part -> seconds
    bf16: bool = False  # a part timing the train step in bfloat16, with its memory
    compile_caches: tuple[str, ...] = ("off", "cold", "warm")  # JAX's persistent cache

    def part_names(self) -> list[str]:
        """The parts in the order they run."""
        names = ["host", *self.workloads, *(p for p, _, _ in self.first_calls)]
        names += ["bf16-train_step"] if self.bf16 else []
        names += ["scale"] if self.scale_axes else []
        names += ["compile"] if self.compile_points else []
        names += ["recompile"] if self.lengths else []
        return names


_FRESH = ("eager", "jit", "torch", "torch.compile")
_SCALE = ("eager", "jit", "torch", "torch.compile")

CPU_QUICK = Profile(
    name="cpu quick",
    point=dict(d_model=64, layers=1, batch=4, length=16),
    rounds=12,
    repeats=2,
    workloads=("attention", "layer", "forward", "train_step"),
    torch_compiled={
        "attention": ("torch.compile",),
        "layer": ("torch.compile", "torch.compile max-autotune", "torch.compile reduce-overhead"),
        "forward": ("torch.compile",),
        "train_step": (),  # its compile: 59 of the part's 93 s of building (the full plan has it)
    },
    first_calls=(("first-calls-train_step", "train_step", ("eager", "jit")),),
    scale_axes={"d_model": [64, 128, 256], "batch": [1, 8, 32], "length": [16, 32, 64]},
    scale_center=dict(d_model=128, batch=8, length=32, layers=1),
    scale_modes=("eager", "jit"),
    compile_points=(
        dict(d_model=64, layers=1),
        dict(d_model=64, layers=2),
        dict(d_model=128, layers=1),
    ),
    lengths=(5, 8, 13, 16, 8, 13),
    recompile_size=dict(d_model=64, batch=4),
    overhead_sizes=(1, 4, 16, 64),
    roofs=dict(gemm_n=512, stream_mib=16),
    compile_caches=("cold", "warm"),  # the cache off: about half the part's 80 s
    # Each part's wall seconds in the quiet run of 2026-11-26 (docs/results/xla_vs_eager/
    # cpu-2core-quiet-quick-cut-2026-11-26) times 1.5: the margin for a host a little slower,
    # and for the tree mode and the recompile part's explained pass added since.
    budgets={
        "host": 20,
        "attention": 40,
        "layer": 12,
        "forward": 21,
        "train_step": 75,
        "first-calls-train_step": 75,
        "scale": 62,
        "compile": 56,
        "recompile": 62,
    },
)

_FULL_COMPILED = ("torch.compile", "torch.compile max-autotune", "torch.compile reduce-overhead")
CPU_FULL = Profile(
    name="cpu",
    point=dict(d_model=256, layers=2, batch=16, length=64),
    rounds=30,
    repeats=7,
    workloads=("attention", "layer", "forward", "train_step"),
    torch_compiled={
        "attention": _FULL_COMPILED,
        "layer": _FULL_COMPILED,
        "forward": _FULL_COMPILED,
        "train_step": ("torch.compile", "torch.compile step", "torch.compile functional step"),
    },
    first_calls=(
        ("first-calls-attention", "attention", _FRESH),
        ("first-calls-layer", "layer", _FRESH),
        ("first-calls-forward", "forward", _FRESH),
        ("first-calls-train_step", "train_step", ("eager", "jit", "jit, no donation")),
        (
            "first-calls-train_step-torch",
            "train_step",
            ("torch", "torch.compile", "torch.compile step", "torch.compile functional step"),
        ),
    ),
    scale_axes={
        "d_model": [64, 128, 256, 512],
        "batch": [1, 4, 16, 64],
        "length": [16, 64, 256],
        "layers": [1, 2, 4],
    },
    scale_center=dict(d_model=128, batch=8, length=32, layers=2),
    scale_modes=_SCALE,
    compile_points=(
        dict(d_model=256, layers=1),
        dict(d_model=256, layers=2),
        dict(d_model=256, layers=4),
        dict(d_model=128, layers=2),
        dict(d_model=512, layers=2),
    ),
    lengths=(17, 33, 50, 64, 100, 128, 33, 77),
    recompile_size=dict(d_model=256, batch=16),
    overhead_sizes=(1, 4, 16, 64, 256),
    roofs=dict(gemm_n=2048, stream_mib=64),
    # The quiet full run of 2026-11-26 (docs/results/xla_vs_eager/cpu-2core-quiet-full-
    # 2026-11-26: its Plan table's wall times), about 10% added.
    budgets={
        "host": 110,
        "attention": 40,
        "layer": 30,
        "forward": 60,
        "train_step": 400,
        "first-calls-attention": 300,
        "first-calls-layer": 330,
        "first-calls-forward": 400,
        "first-calls-train_step": 330,
        "first-calls-train_step-torch": 1750,
        "scale": 300,
        "compile": 650,
        "recompile": 260,
    },
)

_GPU_COMPILED = ("torch.compile", "torch.compile reduce-overhead")
GPU_QUICK = Profile(
    name="gpu quick",
    point=dict(d_model=512, layers=2, batch=16, length=128),
    rounds=12,
    repeats=2,
    workloads=("attention", "layer", "train_step"),
    torch_compiled={
        "attention": _GPU_COMPILED,
        "layer": _GPU_COMPILED,
        "train_step": (),  # the full plan's: its part ran out of time building 9 modes
    },
    first_calls=(),  # fresh processes, each starting CUDA: the full plan's
    scale_axes={},
    scale_center={},
    scale_modes=(),
    compile_points=(),
    lengths=(),
    recompile_size={},
    overhead_sizes=(1, 4, 16, 64),
    roofs=dict(gemm_n=8192, stream_mib=256),
    # host, attention and layer as measured on one H100 (2026-11-26: 20, 37 and 23 s); the
    # train step's part, with torch.compile, was still building its modes after 79 s
    budgets={
        "host": 20,
        "attention": 40,
        "layer": 25,
        "train_step": 45,
        "bf16-train_step": 30,
    },
    bf16=True,
)

GPU_FULL = replace(
    CPU_FULL,
    name="gpu",
    point=dict(d_model=1024, layers=4, batch=32, length=256),
    repeats=3,
    torch_compiled={
        "attention": _GPU_COMPILED,
        "layer": (*_GPU_COMPILED, "torch.compile max-autotune"),
        "forward": _GPU_COMPILED,
        "train_step": ("torch.compile", "torch.compile step", "torch.compile functional step"),
    },
    scale_axes={
        "d_model": [256, 512, 1024, 2048],
        "batch": [1, 8, 32, 128],
        "length": [64, 256, 1024],
        "layers": [1, 4, 8],
    },
    scale_center=dict(d_model=512, batch=16, length=256, layers=2),
    compile_points=(
        dict(d_model=1024, layers=1),
        dict(d_model=1024, layers=4),
        dict(d_model=1024, layers=8),
        dict(d_model=512, layers=4),
        dict(d_model=2048, layers=4),
    ),
    recompile_size=dict(d_model=1024, batch=32),
    roofs=dict(gemm_n=8192, stream_mib=1024),
    overhead_sizes=(1, 4, 16, 64, 256),
    budgets={
        "host": 20,
        "attention": 90,
        "layer": 150,
        "forward": 120,
        "train_step": 200,
        "first-calls-attention": 150,
        "first-calls-layer": 150,
        "first-calls-forward": 150,
        "first-calls-train_step": 200,
        "first-calls-train_step-torch": 220,
        "bf16-train_step": 90,
        "scale": 200,
        "compile": 150,
        "recompile": 150,
    },
    bf16=True,
)

PROFILES = {
    ("cpu", True): CPU_QUICK,
    ("cpu", False): CPU_FULL,
    ("gpu", True): GPU_QUICK,
    ("gpu", False): GPU_FULL,
}


def dry(profile: Profile) -> Profile:
    """The same plan (parts, modes, budgets) at tiny sizes, 6 rounds and one fresh process
    per first call: every code path of the plan in seconds, on a CPU too."""
    tiny = dict(d_model=64, layers=1, batch=2, length=8)
    values = {"d_model": [64, 128], "batch": [1, 2], "length": [8, 16], "layers": [1, 2]}
    axes = {axis: values[axis] for axis in profile.scale_axes}
    return replace(
        profile,
        name=f"{profile.name} (dry run)",
        point=tiny,
        rounds=6,
        repeats=1,
        scale_axes=axes,
        scale_center=dict(d_model=64, batch=1, length=8, layers=1) if axes else {},
        compile_points=tuple(dict(d_model=64, layers=1) for _ in profile.compile_points[:1]),
        lengths=(5, 8, 5) if profile.lengths else (),
        recompile_size=dict(d_model=64, batch=2),
        overhead_sizes=(1, 4),
        roofs=dict(gemm_n=128, stream_mib=4),
    )
