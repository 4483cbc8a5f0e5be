"""What several benchmarks share: the devices' peak rates, the language model's FLOP
count, the GPT-2 model and its training step built from a run file (--model-file,
default configs/models/gpt2_small.yaml, read by `jaxformer.train.config.load_run`; with the
options lm-throughput, gpt2-peers and profile take), the encoder-decoder of the
train-step and compile-time benchmarks, and timing one program through `stats`.

FLOPs per token of the decoder-only LM = 6 N (N = every parameter: the tied embedding is
used as the output projection's matrix; the position table's lookups, counted in N, are
free) plus attention's 12 L T d_model for Q K^T and P V forward and backward, halved
because causal attention needs only the lower triangle: 6 L T d_model. MFU = FLOPs per
step / step time / the device's dense bfloat16 peak (PEAK_TFLOPS; none on a CPU).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from jaxformer.checks import MissingFile, check_int
from jaxformer.config import TransformerConfig
from jaxformer.train.config import load_run
from jaxformer_lab.bench import stats
from jaxformer_lab.bench.registry import Options, setting

# Dense bfloat16 peak TFLOP/s by device kind (vendor data sheets; SXM parts), matched by
# the first key contained in jax's device_kind.
PEAK_TFLOPS = {
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "H200": 989.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "L4": 121.0,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,
    "TPU v5p": 459.0,
}
QUICK_VOCAB, QUICK_CONTEXT = 1024, 128
GPT2_SMALL = "configs/models/gpt2_small.yaml"


def peak_tflops(device_kind: str) -> float | None:
    return next((v for k, v in PEAK_TFLOPS.items() if k in device_kind), None)


def flops_per_token(n_params: int, layers: int, context: int, d_model: int) -> float:
    """6 N + causal attention's 6 L T d_model (see the module docstring)."""
    return 6 * n_params + 6 * layers * context * d_model


@dataclasses.dataclass(frozen=True)
class LMOptions(Options):
    """The GPT-2 model and batch of the language-model benchmarks."""

    model_file: str = setting(
        GPT2_SMALL,
        "the model's run file (its model section), relative to the working directory",
    )
    quick: bool = setting(False, "GPT-2's shape at the tiny preset's size (a CPU in seconds)")
    batch: int | None = setting(None, "sequences per step (default 16; quick 8)")
    layers: int | None = setting(None, "decoder layers (default 12; quick 2)")
    context: int | None = setting(None, "tokens per sequence (default 1024; quick 128)")
    remat: str = setting("none", "rematerialisation", choices=("none", "dots", "full"))
    scan: bool = setting(False, "scan over layers")
    attention: str = setting("auto", "attention_impl (a name in functional.ATTENTION)")
    lm_head: str = setting("auto", "the LM head", choices=("auto", "dense", "chunked"))

    def __post_init__(self):
        super().__post_init__()
        for name in ("batch", "layers", "context"):
            if getattr(self, name) is not None:
                check_int(f"--{name.replace('_', '-')}", getattr(self, name))
        if not os.path.isfile(self.model_file):
            raise MissingFile(f"--model-file {self.model_file}: no such file")

    def config(self) -> TransformerConfig:
        """The run file's model (quick: at the tiny preset's width and depth, a
        vocabulary of 1024 and a context of 128), with these options."""
        config, _ = load_run(self.model_file, model=quick_sizes() if self.quick else None)
        return config.replace(
            num_decoder_layers=self.layers or config.num_decoder_layers,
            max_len=self.context or config.max_len,
            remat=self.remat,
            scan_layers=self.scan,
            attention_impl=self.attention,
            lm_head=self.lm_head,
        )

    def sizes(self) -> dict:
        """The model's and batch's sizes (gpt2_jax's and gpt2_torch's `s`)."""
        c = self.config()
        return dict(
            layers=c.num_decoder_layers,
            d_model=c.d_model,
            heads=c.num_heads,
            d_ff=c.d_ff,
            context=c.max_len,
            vocab=c.vocab_size,
            batch=self.batch or (8 if self.quick else 16),
        )


def quick_sizes() -> dict:
    """The model fields of --quick: the tiny preset's depth and width, a vocabulary of
    1024 and a context of 128 (GPT-2-small's architecture: 544,256 parameters)."""
    tiny = TransformerConfig.tiny(QUICK_VOCAB)
    size = ("num_decoder_layers", "d_model", "d_ff", "num_heads", "vocab_size")
    return {name: getattr(tiny, name) for name in size} | {"max_len": QUICK_CONTEXT}


def lm_step(options: LMOptions):
    """(jitted step with donated state, state, batch, parameter count) of the options'
    model: AdamW (b2 0.95, eps 1e-8, weight decay 0.1, lr 1e-4), bfloat16 compute,
    float32 parameters and optimizer state, on gpt2_jax's random tokens."""
    import jax
    import optax
    from flax import nnx

    from jaxformer import train
    from jaxformer.models import DecoderLM, count_params
    from jaxformer_lab.bench.gpt2_jax import batch_tokens

    model = DecoderLM(options.config(), rngs=nnx.Rngs(0))
    schedule = optax.constant_schedule(1e-4)
    optimizer = train.make_optimizer(schedule, name="adamw", b2=0.95, eps=1e-8, weight_decay=0.1)
    graphdef, state = train.create_train_state(model, optimizer, seed=0)
    step = train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.0)
    tokens = batch_tokens(options.sizes())
    batch = jax.device_put({"tgt_in": tokens[:, :-1], "tgt_out": tokens[:, 1:]})  # unpadded
    return jax.jit(step, donate_argnums=0), state, batch, count_params(model)


def resolved(options: LMOptions) -> dict:
    """What "auto" picks for the options' model on this device: the attention kernel of
    its causal, unpadded self-attention in bfloat16, and the LM head."""
    import jax
    import jax.numpy as jnp

    from jaxformer.functional.attention import choose_implementation
    from jaxformer.train.steps import lm_head_choice

    s = options.sizes()
    B, T, H = s["batch"], s["context"], s["heads"]
    q = jax.ShapeDtypeStruct((B, T, H, s["d_model"] // H), jnp.bfloat16)
    attention = options.attention
    if attention == "auto":
        attention = choose_implementation(q, q, q, masked=True, padded=False, dropout_rate=0.0)
    return dict(attention=attention, lm_head=lm_head_choice(options.lm_head, B * T, s["vocab"]))


def seq2seq_config(vocab_size: int, **overrides) -> TransformerConfig:
    """The encoder-decoder of train-step and compile-time: the tiny preset (2+2 post-LN
    layers, 4 heads, dropout and label smoothing 0.1) at d_model 256, d_ff 1024,
    max_len 128."""
    fields = dict(d_model=256, d_ff=1024, max_len=128)
    return TransformerConfig.tiny(vocab_size, **(fields | overrides))


def time_one(call: Callable[[], object], rounds: int, warmup: int = 1) -> dict:
    """Seconds per call of one program over `rounds` calls (stats.time_interleaved):
    median_ci's figure (best_median_ci below 6 calls) with the samples."""
    seconds = stats.time_interleaved({"call": call}, rounds, warmup)["call"]
    return stats.best_median_ci(seconds) | {"samples": seconds}


def conditions() -> dict:
    """What besides the device shapes a CPU figure: the load average, the preloaded
    allocator and XLA's flags."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return dict(
        load_average=load,
        ld_preload=os.environ.get("LD_PRELOAD", ""),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
    )
