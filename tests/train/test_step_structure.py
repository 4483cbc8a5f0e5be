"""The structure of the GPT-2-small train step, read from its lowered program on a CPU.

The step is lowered with abstract shapes (nothing is allocated or compiled), for the
CPU and, from the CPU, for a GPU and a TPU: two GPT-2 layers at GPT-2-small's sizes (vocabulary V = 50304, d_model E = 768, d_ff F = 3072),
batch 32 x 1024, bfloat16 compute, the plain ("xla") attention that a CPU runs. The tests
walk every operation of the StableHLO module, the backward pass included, and check what
costs time on an accelerator: the dtypes of the matrix products, the passes over the
[.., V] logits, padding work for a batch without padding, and what crosses `jit`.
"""

import functools
import math

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.extend.mlir import ir

import jaxformer as jf
from jaxformer import train

B, T, V, E, F = 32, 1024, 50304, 768, 3072


def _config(**overrides) -> jf.TransformerConfig:
    """GPT-2-small with two of its layers, on the attention a CPU runs."""
    return jf.TransformerConfig.gpt2_small(
        V, num_decoder_layers=2, attention_impl="xla", **overrides
    )


def _abstract_state(config: jf.TransformerConfig, optimizer):
    """(graphdef, TrainState of ShapeDtypeStructs): create_train_state, nothing allocated."""
    out = {}

    def create():
        model = jf.DecoderLM(config, rngs=nnx.Rngs(0))
        out["graphdef"], state = train.create_train_state(model, optimizer, seed=0)
        return state

    state = jax.eval_shape(create)
    return out["graphdef"], state


@functools.cache
def _ops(lm_head: str = "dense", padded: bool = True, platform: str = "cpu") -> tuple[tuple, ...]:
    """(name, operand types, result types) of every operation of the train step lowered
    for `platform` ("cpu", "cuda" or "tpu"), a type being (shape, element type)."""
    schedule = optax.constant_schedule(1e-4)
    optimizer = train.make_optimizer(schedule, name="adamw", b2=0.95, weight_decay=0.1)
    graphdef, state = _abstract_state(_config(lm_head=lm_head), optimizer)
    step = train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.0)
    tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
    batch = {"tgt_in": tokens, "tgt_out": tokens}
    if padded:
        batch["tgt_valid"] = jax.ShapeDtypeStruct((B, T), jnp.bool_)
    lowered = jax.jit(step).trace(state, batch).lower(lowering_platforms=(platform,))
    return tuple(_walk(lowered.compiler_ir("stablehlo").operation))


def _walk(operation):
    for region in operation.regions:
        for block in region.blocks:
            for op in block.operations:
                yield op.operation.name, _types(op.operation.operands), _types(op.operation.results)
                yield from _walk(op.operation)


def _types(values) -> tuple:
    out = []
    for v in values:
        if isinstance(v.type, ir.RankedTensorType):
            out.append((tuple(v.type.shape), str(v.type.element_type)))
    return tuple(out)


def _dots(ops) -> list[tuple]:
    return [(o, r) for name, o, r in ops if name == "stablehlo.dot_general"]


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
@pytest.mark.parametrize("lm_head", ["dense", "chunked"])
def test_every_matrix_product_takes_bfloat16_operands(lm_head, platform):
    """Forward and backward, the projections, the attention and the LM head: a float32
    operand would make the product run at TF32 or float32 speed on a GPU (the logits'
    float32 cotangent did, jax-ml/jax#23797)."""
    dots = _dots(_ops(lm_head, platform=platform))
    assert len(dots) > 20  # forward and backward of 2 layers and the head
    large = [(o, r) for o, r in dots if {V, F, E} & {d for shape, _ in o for d in shape}]
    assert len(large) >= 12
    not_bf16 = [(o, r) for o, r in dots if any(dtype != "bf16" for _, dtype in o)]
    assert not_bf16 == []


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_on_an_accelerator_every_product_but_the_attention_logits_writes_bfloat16(platform):
    """A float32 result cast afterwards is a separate GEMM fusion on a GPU: every
    projection, the attention's value product and the LM head, forward and backward, write
    the compute dtype. Only the attention logits, which the softmax reads, write float32,
    one product per layer. The program is lowered for the accelerator from the CPU."""
    dots = _dots(_ops(platform=platform))
    ffn = [r for o, r in dots if F in o[0][0] + o[1][0]]
    assert len(ffn) == 2 * 2 * 3  # 2 layers, 2 products, forward and 2 backward each
    # Per layer: Q/K/V and output projections, feed-forward in and out (3 each), the
    # attention's 2 forward and 4 backward products; then the LM head's 3.
    assert len(dots) == 2 * (4 * 3 + 6) + 3
    f32 = [r for o, r in dots if r[0][1] != "bf16"]
    heads = 12
    assert [(math.prod(shape), dtype) for ((shape, dtype),) in f32] == [
        (B * heads * T * T, "f32")
    ] * 2


def test_on_a_cpu_products_write_float32_and_round_once():
    """XLA's CPU backend multiplies bfloat16 at full speed only into float32."""
    dots = _dots(_ops())
    assert {r[0][1] for o, r in dots} == {"f32"}


def _over_vocab(types) -> bool:
    return any(shape and shape[-1] == V for shape, _ in types)


def test_the_dense_loss_reads_the_logits_twice_forward_without_argmax_or_scatter():
    ops = [(name, o, r) for name, o, r in _ops("dense") if _over_vocab(o)]
    reductions = [o for name, o, r in ops if name == "stablehlo.reduce"]
    assert len(reductions) <= 2  # the row maximum, then the sum of exponentials
    assert not [o for o in reductions if any(dtype == "i32" for _, dtype in o)]  # argmax
    assert not [o for name, o, r in ops if name == "stablehlo.scatter"]
    assert len(ops) > 0


def _padding_work(ops) -> list:
    """The operations that turn `tgt_valid` into key lengths (a sum of each [B, T] row)
    or into a key mask [B, 1, 1, T]."""
    return [
        (name, o, r)
        for name, o, r in ops
        if (name == "stablehlo.reduce" and o[0][0] == (B, T) and r[0][0] == (B,))
        or any(shape == (B, 1, 1, T) for shape, _ in o + r)
    ]


def test_a_batch_without_padding_takes_no_padding_work():
    """Without `tgt_valid` every token is real: no lengths and no key mask reach the
    attention (on a GPU: no select over cuDNN's output), no weights the loss."""
    assert len(_padding_work(_ops("dense"))) >= 2
    assert _padding_work(_ops("dense", padded=False)) == []


def test_the_train_state_is_plain_arrays():
    """No nnx.Variable or nnx.State crosses `jit`: flattening 588 Variables cost about
    1.5 ms per call on a CPU against 0.05 ms for a dict of arrays."""
    schedule = optax.constant_schedule(1e-4)
    optimizer = train.make_optimizer(schedule, name="adamw")
    _, state = _abstract_state(_config(), optimizer)
    nodes = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable | nnx.State))
    assert nodes and all(isinstance(x, jax.ShapeDtypeStruct) for x in nodes)
