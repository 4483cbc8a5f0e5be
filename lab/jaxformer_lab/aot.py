"""The real programs compiled ahead of time for accelerators that are not here.

`check(model, target, layout)` lays a model's train step, evaluation step, greedy decoding
or beam search (beam 4) out over a mesh of the target's chips and compiles it there: with
libtpu (the `tpu` extra) for a named TPU topology with no TPU present
(`jax.experimental.topologies`), which gives XLA's memory and cost analyses; without it,
lowered for a TPU only, so only the state's bytes are known. Per chip it reports
parameters, optimizer state, temporaries, whether the program fits in HBM and the largest
batch found to fit, XLA's FLOPs, a roofline lower bound on the step time from the
generation's published peaks (a bound, not a measurement) and the attention it runs.
With `packed`, a decoder's train and evaluation steps take packed rows (segment ids and
positions per document), as `--pack` trains.

    jaxformer compile-check --target tpu:v5e:2x4 --model gpt2_small --layout fsdp
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxformer import decode, train
from jaxformer.accelerators import StandInDevice
from jaxformer.checks import BadValue, MissingPackage
from jaxformer.config import TransformerConfig
from jaxformer.models import DecoderLM, Transformer
from jaxformer.parallel import make_mesh
from jaxformer.parallel.placement import MeshPlacement
from jaxformer.parallel.rules import DEFAULT_RULES, batch_shards
from jaxformer_lab.results import Table


class Chip(NamedTuple):
    """A TPU generation's published per-chip peaks."""

    bf16_flops: float  # dense bfloat16 FLOP/s
    hbm_bytes_per_s: float
    hbm_bytes: int


GiB = 1 << 30
# Google Cloud's TPU system architecture pages.
CHIPS = {
    "v4": Chip(275e12, 1228e9, 32 * GiB),
    "v5e": Chip(197e12, 819e9, 16 * GiB),
    "v5p": Chip(459e12, 2765e9, 95 * GiB),
    "v6e": Chip(918e12, 1638e9, 32 * GiB),
}
LAYOUTS = ("data", "fsdp", "tensor")
PROGRAMS = ("train", "eval", "decode", "beam")
VOCAB = 50304  # GPT-2's vocabulary padded to a multiple of 128, for every model here


class Model(NamedTuple):
    config: TransformerConfig
    batch_per_chip: int
    length: int


def _decoder(d_model: int, layers: int, heads: int) -> TransformerConfig:
    """A GPT-2-shaped decoder of another width and depth, its layers scanned and
    rematerialised as one would train it."""
    return TransformerConfig.gpt2_small(
        VOCAB, d_model=d_model, d_ff=4 * d_model, num_decoder_layers=layers,
        num_heads=heads, max_len=2048, scan_layers=True, remat="full",
    )  # fmt: skip


def models() -> dict[str, Model]:
    """What the command compiles by name: both model kinds, with bfloat16 compute and
    "auto" attention; "tiny" and "tiny_lm" are for quick checks."""
    tiny = TransformerConfig.tiny(VOCAB)
    found = {
        "tiny": Model(tiny, 4, 64),
        "tiny_lm": Model(tiny.replace(num_encoder_layers=0), 4, 64),
        "gpt2_small": Model(TransformerConfig.gpt2_small(VOCAB), 8, 1024),
        "paper_base": Model(TransformerConfig.paper_base(VOCAB), 32, 256),
        "paper_big": Model(TransformerConfig.paper_big(VOCAB), 16, 256),
        "decoder_1b": Model(_decoder(2048, 16, 16), 4, 2048),
        "decoder_7b": Model(_decoder(4096, 32, 32), 1, 2048),
    }
    common = dict(dtype="bfloat16", attention_impl="auto", dropout_rate=0.0)
    return {
        name: m._replace(config=m.config.replace(**common, max_len=max(m.config.max_len, m.length)))
        for name, m in found.items()
    }


MODEL_NAMES = (
    "tiny",
    "tiny_lm",
    "gpt2_small",
    "paper_base",
    "paper_big",
    "decoder_1b",
    "decoder_7b",
)


class Target(NamedTuple):
    generation: str  # a key of CHIPS
    topology: str  # e.g. "2x4" (v5e, v6e) or "2x2x1" (v4, v5p)

    @property
    def name(self) -> str:
        return f"tpu:{self.generation}:{self.topology}"

    @property
    def chips(self) -> int:
        return math.prod(int(n) for n in self.topology.split("x"))


def stand_in_cpus(count: int) -> None:
    """Ask for `count` CPU devices to lay a lowered-only program out over; call it before
    JAX first runs anything (a process that already has them keeps its own)."""
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # backends already started: their device count stands
        pass


def parse_target(text: str) -> Target:
    """ "tpu:v5e:2x4" -> Target("v5e", "2x4")."""
    match = re.fullmatch(r"tpu:(v\d+[a-z]?):(\d+(?:x\d+){1,2})", text)
    if match is None or match.group(1) not in CHIPS:
        raise BadValue(
            f"--target {text!r}: expected tpu:GENERATION:TOPOLOGY with GENERATION one of "
            f"{sorted(CHIPS)}, e.g. tpu:v5e:2x4 or tpu:v5p:2x2x1"
        )
    return Target(match.group(1), match.group(2))


# libtpu, loaded on a host that is not a TPU VM: say so rather than let it probe the
# metadata server, and let several processes (test workers) load it at once.
_NOT_A_TPU_HOST = {
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v5litepod-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_WORKER_ID": "0",
    "TF_CPP_MIN_LOG_LEVEL": "3",
}


def target_chips(target: Target, *, lowered_only: bool = False) -> tuple[list, bool]:
    """(the target's chips, whether they compile): libtpu's compile-only devices, or,
    without libtpu (or with `lowered_only`), this host's CPU devices standing in for a
    program that is only lowered for a TPU."""
    if not lowered_only and importlib.util.find_spec("libtpu") is not None:
        for name, value in _NOT_A_TPU_HOST.items():
            os.environ.setdefault(name, value)
        # the persistent cache cannot hold programs of devices this process lacks
        jax.config.update("jax_enable_compilation_cache", False)
        from jax.experimental import topologies

        try:
            description = topologies.get_topology_desc(
                platform="tpu", topology_name=f"{target.generation}:{target.topology}"
            )
        except Exception as error:  # libtpu's own words for a topology it does not know
            reason = str(error).strip().splitlines()[0][:200]
            raise BadValue(f"--target {target.name}: libtpu refuses it ({reason})") from None
        return list(description.devices), True
    count = target.chips
    cpus = jax.devices("cpu")
    if len(cpus) < count:
        raise MissingPackage(
            f"{target.name} has {count} chips; without libtpu (pip install 'jaxformer[tpu]') "
            f"it is lowered over as many CPU devices, and this process has {len(cpus)}"
        )
    return cpus[:count], False


def mesh_sizes(layout: str, chips: int, config: TransformerConfig) -> dict[str, int]:
    """The (data, fsdp, tensor) sizes of `layout` over `chips`: all data, all FSDP, or
    tensor parallel over the largest power of two dividing the heads, data over the rest."""
    if layout not in LAYOUTS:
        raise BadValue(f"--layout {layout!r}: expected one of {LAYOUTS}")
    if layout == "data":
        return dict(data=chips)
    if layout == "fsdp":
        return dict(data=1, fsdp=chips)
    tensor = math.gcd(chips, config.num_heads, config.num_kv_heads or config.num_heads)
    return dict(data=chips // tensor, tensor=tensor)


@dataclasses.dataclass
class Report:
    """One program compiled (or lowered) for a target: the per-chip figures."""

    target: str
    model: str
    program: str
    layout: str
    mesh: dict
    batch: int
    length: int
    compiled: bool  # False: lowered only (no libtpu)
    params_bytes: int
    optimizer_bytes: int
    temp_bytes: int | None = None
    total_bytes: int | None = None
    hbm_bytes: int = 0
    fits: bool | None = None
    largest_batch: int | None = None
    flops: float | None = None
    bytes_accessed: float | None = None
    roofline_seconds: float | None = None
    attention: str = ""
    packed: bool = False  # rows of packed documents (segment ids and positions)


def check(
    model: str,
    target: Target,
    *,
    program: str = "train",
    layout: str = "fsdp",
    batch: int | None = None,
    length: int | None = None,
    lowered_only: bool = False,
    find_largest_batch: bool = True,
    packed: bool = False,
) -> Report:
    """Compile (or lower) `model`'s `program` for `target` in `layout`: the Report."""
    if program not in PROGRAMS:
        raise BadValue(f"--program {program!r}: expected one of {PROGRAMS}")
    if model not in MODEL_NAMES:
        raise BadValue(f"--model {model!r}: expected one of {MODEL_NAMES}")
    config, batch_per_chip, default_length = models()[model]
    if packed and (config.num_encoder_layers or program not in ("train", "eval")):
        raise BadValue(
            f"--pack: packed rows are a decoder's train and eval steps, not {model} {program}"
        )
    chips, compiles = target_chips(target, lowered_only=lowered_only)
    sizes = mesh_sizes(layout, len(chips), config)
    placement = MeshPlacement(make_mesh(**sizes, devices=chips), DEFAULT_RULES)
    length = length or default_length
    batch = batch or batch_per_chip * len(chips)
    placement.check_rows(batch, "--batch")
    config = config.replace(max_len=max(config.max_len, length))
    build = {
        "train": functools.partial(_train_program, packed=packed),
        "eval": functools.partial(_eval_program, packed=packed),
        "decode": functools.partial(_decode_program, strategy=decode.greedy),
        "beam": functools.partial(_decode_program, strategy=decode.beam_search),
    }[program]
    chip = CHIPS[target.generation]
    # "auto" chooses attention for the default device: a chip of the target
    chip_device = chips[0] if compiles else StandInDevice("tpu", f"TPU {target.generation}")
    with jax.default_device(chip_device):
        lowered, state = build(config, placement, batch, length, compiles)
        report = Report(
            target.name, model, program, layout, sizes, batch, length, compiles,
            _bytes_per_chip(state.params), _bytes_per_chip(state.opt_state),
            hbm_bytes=chip.hbm_bytes, attention=_attention_kernel(lowered), packed=packed,
        )  # fmt: skip
        if compiles:
            compiled = _compiled(lowered)
            if compiled is None:
                report.fits = False
            else:
                _analyse(report, compiled, chip)
            if find_largest_batch and program == "train":
                report.largest_batch = _largest_batch(report, config, placement, build, chip)
    return report


def _train_program(config, placement, batch, length, compiles, *, packed=False):
    """(the train step at global `batch` lowered, its abstract state)."""
    schedule = optax.constant_schedule(1e-4)
    optimizer = train.make_optimizer(schedule, name="adamw")
    graphdef, state, layout = _abstract_state(config, placement, optimizer)
    step = train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.0)
    platform = None if compiles else "tpu"
    tokens = _token_batch(config, batch, length, packed)
    lowered = placement.lower(step, layout, state, tokens, donate_state=True, platform=platform)
    return lowered, state


def _eval_program(config, placement, batch, length, compiles, *, packed=False):
    """(the evaluation step's loss sums at global `batch` lowered, its abstract state:
    parameters only)."""
    graphdef, state, layout = _abstract_state(config, placement)
    evaluate = train.make_eval_step(graphdef, label_smoothing=0.0)
    platform = None if compiles else "tpu"
    tokens = _token_batch(config, batch, length, packed)
    lowered = placement.lower(evaluate, layout.params, state.params, tokens, platform=platform)
    return lowered, state.replace(opt_state=())


def _token_batch(config, batch: int, length: int, packed: bool = False) -> dict:
    """A step's batch of `batch` rows of `length` tokens, as ShapeDtypeStructs: the target
    side, and a source of the same shape for an encoder-decoder; packed rows add their
    documents' segment ids and positions."""
    tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    arrays = {"tgt_in": tokens, "tgt_out": tokens}
    if packed:
        arrays |= {"segment_ids": tokens, "positions": tokens}
    return arrays | {"src": tokens} if config.num_encoder_layers else arrays


def _decode_program(config, placement, batch, length, compiles, *, strategy):
    """(decoding by `strategy` (greedy, beam search) to `length` tokens, half of them the
    prompt, lowered; its abstract state: parameters only)."""
    graphdef, state, layout = _abstract_state(config, placement)

    def generate(params, prompt):
        model = nnx.merge(graphdef, params)
        return strategy(model, prompt["src"], max_new_tokens=length - length // 2)

    prompt = {"src": jax.ShapeDtypeStruct((batch, length // 2), jnp.int32)}
    platform = None if compiles else "tpu"
    lowered = placement.lower(generate, layout.params, state.params, prompt, platform=platform)
    return lowered, state.replace(opt_state=())


def _abstract_state(config, placement, optimizer=None):
    """(graphdef, the TrainState as ShapeDtypeStructs laid out on the mesh, its layout);
    without an optimizer, the state's optimizer part is empty."""
    kind = Transformer if config.num_encoder_layers else DecoderLM
    optimizer = optimizer or optax.identity()
    out = {}

    def create():
        model = kind(config, rngs=nnx.Rngs(0))
        out["graphdef"], state = train.create_train_state(model, optimizer, seed=0)
        return state

    state = jax.eval_shape(create)
    layout = train.state_layout(out["graphdef"], state)
    placed = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        state,
        placement.shardings(layout),
    )
    return out["graphdef"], placed, layout


def _bytes_per_chip(tree) -> int:
    """The bytes one chip holds of `tree` (ShapeDtypeStructs with shardings)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


def _analyse(report: Report, compiled, chip: Chip) -> None:
    """Fill the memory and cost figures from XLA's analyses of `compiled` (per chip)."""
    memory = compiled.memory_analysis()
    report.temp_bytes = int(memory.temp_size_in_bytes)
    report.total_bytes = int(
        memory.argument_size_in_bytes + memory.output_size_in_bytes
        - memory.alias_size_in_bytes + memory.temp_size_in_bytes
    )  # fmt: skip
    report.fits = report.total_bytes <= chip.hbm_bytes
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    report.flops = float(cost.get("flops", 0.0))
    report.bytes_accessed = float(cost.get("bytes accessed", 0.0))
    report.roofline_seconds = max(
        report.flops / chip.bf16_flops, report.bytes_accessed / chip.hbm_bytes_per_s
    )


def _largest_batch(report, config, placement, build, chip, compiles: int = 4) -> int:
    """The largest global batch (a multiple of the batch shards) verified to fit in HBM,
    within `compiles` more compiles: memory grows about linearly with the batch, so the
    line through two batches gives the next guess (at most 4 times the batch); once a
    batch does not fit, the gap to the largest that does is halved."""
    shards = batch_shards(placement.mesh, placement.rules)
    total = lambda b: _total_bytes(build(config, placement, b, report.length, True)[0])  # noqa: E731
    fits, over = (report.batch, None) if report.fits else (0, report.batch)
    guess = 2 * report.batch if report.fits else shards
    for _ in range(compiles):
        if guess <= fits or (over is not None and guess >= over):
            break
        used = total(guess)
        if used > chip.hbm_bytes:
            over = guess
        elif over is None:  # the line through two batches, at most 4 times as far
            per_row = max((used - report.total_bytes) / (guess - report.batch), 1.0)
            fits, guess = guess, min(guess + int((chip.hbm_bytes - used) // per_row), 4 * guess)
        else:
            fits = guess
        if over is not None:
            guess = (fits + over) // 2
        guess = guess // shards * shards
    return fits


def _compiled(lowered):
    """`lowered` compiled, or None when XLA finds the program cannot fit in HBM."""
    try:
        return lowered.compile()
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" in str(error):
            return None
        raise


def _total_bytes(lowered) -> float:
    """The bytes a chip needs for the compiled program (inf: XLA found it cannot fit)."""
    compiled = _compiled(lowered)
    if compiled is None:
        return math.inf
    memory = compiled.memory_analysis()
    return int(
        memory.argument_size_in_bytes + memory.output_size_in_bytes
        - memory.alias_size_in_bytes + memory.temp_size_in_bytes
    )  # fmt: skip


def _attention_kernel(lowered) -> str:
    """Which attention the program runs: splash's TPU kernel, or XLA's own code."""
    splash = lowered.as_text().count("splash_mha")
    return "splash" if splash else "XLA's code (xla or chunked)"


def results_table(reports: list[Report]) -> Table:
    """The reports as one table of per-chip figures, how they were made beneath it."""
    rows = []
    for r in reports:
        fits = "—" if r.fits is None else ("yes" if r.fits else "**no**")
        rows.append([
            r.model, f"{r.program}, packed" if r.packed else r.program, r.layout, _mesh_text(r.mesh), f"{r.batch} x {r.length}",
            _gib(r.params_bytes), _gib(r.optimizer_bytes), _gib(r.temp_bytes),
            f"{_gib(r.total_bytes)} / {_gib(r.hbm_bytes)}", fits,
            "—" if r.largest_batch is None else r.largest_batch,
            "—" if r.flops is None else f"{r.flops / 1e12:.3g}",
            "—" if r.roofline_seconds is None else f"{r.roofline_seconds * 1e3:.3g}",
            r.attention,
        ])  # fmt: skip
    columns = [
        "model", "program", "layout", "mesh", "batch", "params GiB", "optimizer GiB",
        "temporaries GiB", "total / HBM GiB", "fits", "fits at batch", "TFLOP", "bound ms",
        "attention",
    ]  # fmt: skip
    note = (
        "Fits at batch: the largest global batch found to fit in at most 4 more compiles "
        "(the largest that fits is at least this). TFLOP and bound: XLA's cost analysis of "
        "one step, and the larger of FLOPs / peak and bytes / HBM bandwidth at the "
        "generation's published peaks: a lower bound on the step time, not a measurement."
    )
    return Table(columns, rows, "lllllrrrrlrrrl", caption=how_made(reports), notes=[note])


def how_made(reports: list[Report]) -> str:
    """One line: per chip of which target, compiled (not run) or lowered only."""
    if all(r.compiled for r in reports):
        made = "compiled by libtpu for the topology with no TPU present: compiled, not run"
    else:
        made = "lowered only (no libtpu: pip install 'jaxformer[tpu]'), no memory or cost"
    return f"Per chip of {reports[0].target}, {made}."


def _gib(n: int | None) -> str:
    return "—" if n is None else f"{n / GiB:.2f}"


def _mesh_text(mesh: dict) -> str:
    return ",".join(f"{axis}={n}" for axis, n in mesh.items() if n > 1) or "one chip"
