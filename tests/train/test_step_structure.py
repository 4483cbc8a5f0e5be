"""The structure of the GPT-2-small train step, read from its lowered program on a CPU.

The step is lowered with abstract shapes (nothing is allocated or compiled): two GPT-2
layers at GPT-2-small's sizes (vocabulary V = 50304, d_model E = 768, d_ff F = 3072),
batch 32 x 1024, bfloat16 compute, the plain ("xla") attention that a CPU runs. The tests
walk every operation of the StableHLO module, the backward pass included, and check what
costs time on an accelerator: the dtypes of the matrix products, the passes over the
[.., V] logits, padding work for a batch without padding, and what crosses `jit`.
"""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax._src.lib.mlir import ir

import jaxformer as jf
from jaxformer import train
from jaxformer.functional import matmul

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
def _ops(lm_head: str = "dense", padded: bool = True, gpu: bool = False) -> tuple[tuple, ...]:
    """(name, operand types, result types) of every operation of the lowered train step,
    a type being (shape, element type). With `gpu`, the products are written as on a GPU
    (`matmul.gemm_output_dtype`: bfloat16, where a CPU writes float32 and casts)."""
    if gpu:
        with mock.patch.object(matmul, "gemm_output_dtype", lambda dtype: dtype):
            return _ops(lm_head, padded)
    schedule = optax.constant_schedule(1e-4)
    optimizer = train.make_optimizer(schedule, name="adamw", b2=0.95, weight_decay=0.1)
    graphdef, state = _abstract_state(_config(lm_head=lm_head), optimizer)
    step = train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.0)
    tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
    batch = {"tgt_in": tokens, "tgt_out": tokens}
    if padded:
        batch["tgt_valid"] = jax.ShapeDtypeStruct((B, T), jnp.bool_)
    module = jax.jit(step).lower(state, batch).compiler_ir("stablehlo")
    return tuple(_walk(module.operation))


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


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("lm_head", ["dense", "chunked"])
def test_every_matrix_product_takes_bfloat16_operands(lm_head, gpu):
    """Forward and backward, the projections, the attention and the LM head: a float32
    operand would make the product run at TF32 or float32 speed on a GPU (the logits'
    float32 cotangent did, jax-ml/jax#23797)."""
    dots = [(o, r) for name, o, r in _ops(lm_head, gpu=gpu) if name == "stablehlo.dot_general"]
    assert len(dots) > 20  # forward and backward of 2 layers and the head
    large = [(o, r) for o, r in dots if {V, F, E} & {d for shape, _ in o for d in shape}]
    assert len(large) >= 12
    not_bf16 = [(o, r) for o, r in dots if any(dtype != "bf16" for _, dtype in o)]
    assert not_bf16 == []


def test_on_a_gpu_the_feed_forward_products_write_bfloat16():
    """A float32 result cast afterwards is a separate GEMM fusion on a GPU (Triton's, 8.55
    ms a step where cuBLAS took 7.41 on an H100): the GEMM writes the compute dtype."""
    ffn = [
        r
        for name, o, r in _ops(gpu=True)
        if name == "stablehlo.dot_general" and F in o[0][0] + o[1][0]
    ]
    assert len(ffn) == 2 * 2 * 3  # 2 layers, 2 products, forward and 2 backward each
    assert {dtype for ((_, dtype),) in ffn} == {"bf16"}


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
