"""The workloads the XLA-vs-eager lab times, each an NNX module with its inputs and the
equivalent `torch.nn` module with the same weights (`interop.torch`):

    attention    causal multi-head self-attention      torch.nn.MultiheadAttention
    layer        one encoder layer                      torch.nn.TransformerEncoderLayer
    forward      the encoder-decoder's logits           torch.nn.Transformer stacks + embeddings
    train_step   loss, gradient and an Adam update      the same in torch, torch.optim.Adam

The model has no dropout (so every mode computes the same numbers) and every position is
valid; float32. torch is imported only when a torch module is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxformer import functional as F
from jaxformer import nn
from jaxformer.checks import BadValue
from jaxformer.config import TransformerConfig
from jaxformer.models import Transformer

WORKLOADS = ("attention", "layer", "forward", "train_step")
LEARNING_RATE = 1e-3


def bench_config(
    d_model: int = 128, layers: int = 2, vocab: int = 512, dtype: str = "float32"
) -> TransformerConfig:
    """The lab's model: the paper's layout at d_model, d_ff = 4 d_model, heads of 32
    dimensions (at least 2), `layers` + `layers` layers, biases everywhere (as torch), no
    dropout or label smoothing; `dtype` the compute dtype (parameters stay float32)."""
    if d_model < 64 or d_model % 32:
        raise BadValue(f"d_model must be a multiple of 32 and >= 64, got {d_model}")
    return TransformerConfig(
        dtype=dtype,
        vocab_size=vocab,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
        d_model=d_model,
        d_ff=4 * d_model,
        num_heads=d_model // 32,
        max_len=1024,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        label_smoothing=0.0,
        attention_bias=True,  # torch's layers have one bias flag for all their sub-layers
    )


class TrainStep(nnx.Module):
    """A model and its Adam state; calling it takes one optimizer step and returns the loss
    (mean token cross-entropy) before the step."""

    def __init__(self, model: Transformer):
        self.model = model
        tx = optax.adam(LEARNING_RATE, b1=0.9, b2=0.98, eps=1e-9)
        self.optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    def __call__(self, src: jax.Array, tgt_in: jax.Array, tgt_out: jax.Array) -> jax.Array:
        def loss_fn(model):
            logits = model(src, tgt_in)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tgt_out).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(self.model)
        self.optimizer.update(self.model, grads)
        return loss


@dataclass
class Workload:
    name: str
    module: nnx.Module  # called as module(*inputs)
    inputs: tuple
    stateful: bool  # the call changes the module (the train step)
    config: TransformerConfig
    batch: int
    length: int

    def torch(self, device: str):
        """(torch module, inputs on `device`, call(module, *inputs) -> output tensor)."""
        return _torch_equivalent(self, device)


def build(name: str, config: TransformerConfig, batch: int, length: int, seed: int = 0):
    """The workload `name` at this model, batch and sequence length (source = target)."""
    if name not in WORKLOADS:
        raise BadValue(f"unknown workload {name!r}; choose from {list(WORKLOADS)}")
    if batch < 1 or length < 2:
        raise BadValue(f"batch must be >= 1 and length >= 2, got {batch} and {length}")
    rng = np.random.default_rng(seed)
    rngs = nnx.Rngs(seed)
    x = jnp.asarray(rng.standard_normal((batch, length, config.d_model)), jnp.float32)
    tokens = [jnp.asarray(rng.integers(3, config.vocab_size, (batch, length)), jnp.int32)]
    tokens += [jnp.asarray(rng.integers(3, config.vocab_size, (batch, length)), jnp.int32)]
    if name == "attention":
        module = _CausalSelfAttention(config, rngs=rngs)
        inputs = (x,)
    elif name == "layer":
        module, inputs = nn.EncoderLayer(config, rngs=rngs), (x,)
    elif name == "forward":
        module, inputs = Transformer(config, rngs=rngs), (tokens[0], tokens[1])
    else:
        module = TrainStep(Transformer(config, rngs=rngs))
        inputs = (tokens[0], tokens[1], jnp.roll(tokens[1], -1, axis=1))
    return Workload(name, module, inputs, name == "train_step", config, batch, length)


class _CausalSelfAttention(nnx.Module):
    """Causal self-attention through `implementation` ("xla": the plain einsum-softmax
    path; "auto": JAX's best kernel for the device, cuDNN's fused one on a GPU)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, implementation="xla"):
        self.attention = nn.MultiHeadAttention(
            config.d_model,
            config.num_heads,
            use_bias=config.attention_bias,
            dtype=config.dtype,
            rngs=rngs,
        )
        self.implementation = implementation

    def __call__(self, x: jax.Array) -> jax.Array:
        causal = F.causal_mask(x.shape[1])
        return self.attention(x, mask=causal, implementation=self.implementation).out


def _torch_equivalent(w: Workload, device: str):
    """torch's side; with a bfloat16 config every call runs under torch.autocast(bfloat16),
    parameters float32, as JAX's compute dtype."""
    import torch

    from jaxformer.interop.torch import to_torch

    def on(array):
        return torch.from_numpy(np.array(array)).to(device)

    def autocast():
        return torch.autocast(device, torch.bfloat16, enabled=w.config.dtype == "bfloat16")

    inputs = tuple(on(a) for a in w.inputs)
    if w.name == "attention":
        module = to_torch(w.module.attention).to(device).eval()
        causal = torch.ones(w.length, w.length, dtype=torch.bool, device=device).triu(1)

        def call(m, x):
            with torch.inference_mode(), autocast():
                return m(x, x, x, attn_mask=causal, need_weights=False)[0]

        return module, inputs, call
    if w.name == "layer":
        module = to_torch(w.module).to(device).eval()

        def call(m, x):
            with torch.inference_mode(), autocast():
                return m(x)

        return module, inputs, call
    model = w.module.model if w.stateful else w.module
    module = _TorchSeq2Seq(model, torch).to(device)
    if not w.stateful:

        def call(m, src, tgt):
            with torch.inference_mode(), autocast():
                return m(src, tgt)

        return module.eval(), inputs, call
    optimizer = torch.optim.Adam(module.parameters(), LEARNING_RATE, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = torch.nn.CrossEntropyLoss()
    vocab = w.config.vocab_size

    def step(m, src, tgt_in, tgt_out):
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            logits = m(src, tgt_in).float()
        loss = loss_fn(logits.reshape(-1, vocab), tgt_out.reshape(-1).long())
        loss.backward()
        optimizer.step()
        return loss.detach()

    return module, inputs, step


def _TorchSeq2Seq(model: Transformer, torch) -> Any:
    """jaxformer's Transformer (tied embeddings scaled by sqrt(d_model), sinusoidal
    positions, post-LN stacks) as a torch module with its weights."""
    from jaxformer.interop.torch import to_torch

    c = model.config
    if not (c.share_embeddings and c.embed_scale and c.position_embedding == "sinusoidal"):
        raise BadValue("the torch equivalent needs tied, scaled embeddings and sinusoids")

    class Seq2Seq(torch.nn.Module):
        def __init__(self):
            super().__init__()
            table = np.array(model.src_inputs.embed.table[...])
            self.embed = torch.nn.Parameter(torch.from_numpy(table))
            self.encoder = to_torch(model.encoder)
            self.decoder = to_torch(model.decoder)
            positions = np.array(F.sinusoidal_positions(c.max_len, c.d_model))
            self.register_buffer("positions", torch.from_numpy(positions))

        def inputs(self, tokens):
            return self.embed[tokens] * math.sqrt(c.d_model) + self.positions[: tokens.shape[1]]

        def forward(self, src, tgt):
            memory = self.encoder(self.inputs(src))
            T = tgt.shape[1]
            causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)
            y = self.decoder(self.inputs(tgt), memory, tgt_mask=causal, tgt_is_causal=True)
            return y @ self.embed.T

    return Seq2Seq()
