"""jaxformer_lab.bench.gpt2_jax, the minimal pure-JAX GPT-2 step: lm_throughput's model
(the same parameter count as jaxformer's), ln(V) at initialisation, and it learns."""

import math

import jax
import numpy as np
import pytest

from jaxformer_lab.bench import gpt2_jax

QUICK = dict(layers=2, d_model=128, heads=4, d_ff=512, context=128, vocab=1024, batch=8)
TINY = dict(layers=2, d_model=32, heads=4, d_ff=64, context=16, vocab=64, batch=3)


def test_quick_model_has_jaxformers_parameter_count():
    # 544,256: jaxformer's DecoderLM at lm-throughput's --quick sizes (tests/lab/bench/test_lm_throughput.py)
    params = gpt2_jax.init_params(QUICK)
    assert sum(a.size for a in jax.tree.leaves(params)) == 544_256
    assert {a.dtype for a in jax.tree.leaves(params)} == {np.dtype(np.float32)}


def test_the_batch_is_lm_throughputs():
    tokens = gpt2_jax.batch_tokens(TINY)
    expected = np.random.default_rng(0).integers(0, 64, (3, 17), dtype=np.int32)
    np.testing.assert_array_equal(tokens, expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_initial_loss_is_ln_v_and_steps_lower_it(dtype):
    program = gpt2_jax.program(TINY, dtype=dtype, lr=1e-2)
    losses = [program.run(1) for _ in range(4)]
    assert losses[0] == pytest.approx(math.log(64), abs=0.05)
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert program.info["attention"] == "xla"  # cuDNN only on an NVIDIA GPU
