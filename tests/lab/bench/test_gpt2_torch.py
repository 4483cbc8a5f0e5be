"""jaxformer_lab.bench.gpt2_torch against gpt2_jax: the same function of the same weights (a
wrong transpose, a missing causal mask or a different norm would break it), the same
steps, the same parameter count."""

import math

import jax
import numpy as np
import pytest

from jaxformer_lab.bench import gpt2_jax

torch = pytest.importorskip("torch")
gpt2_torch = pytest.importorskip("jaxformer_lab.bench.gpt2_torch")

TINY = dict(layers=2, d_model=32, heads=4, d_ff=64, context=16, vocab=64, batch=3)


def test_same_weights_give_the_same_loss():
    # Weights far from the init (std 0.3 noise added), so the loss is far from ln(V) and
    # every layer shapes it: agreement at 1e-5 then checks each of them.
    rng = np.random.default_rng(1)
    params = jax.tree.map(
        lambda a: (a + 0.3 * rng.standard_normal(a.shape)).astype(np.float32),
        gpt2_jax.init_params(TINY),
    )
    tokens = gpt2_jax.batch_tokens(TINY)
    expected = float(gpt2_jax.loss(params, tokens, heads=4, dtype=np.float32))
    model = gpt2_torch.GPT2(TINY)
    model.load(params)
    got = model(torch.from_numpy(tokens).long()).item()
    assert abs(expected - math.log(64)) > 0.5
    assert got == pytest.approx(expected, rel=1e-5)


# bfloat16: torch's autocast keeps the residual stream in float32, gpt2_jax in bfloat16
@pytest.mark.parametrize("dtype, rel", [("float32", 1e-4), ("bfloat16", 1e-2)])
def test_both_peers_take_the_same_steps(dtype, rel):
    jax_run = gpt2_jax.program(TINY, dtype=dtype, lr=1e-2)
    torch_run = gpt2_torch.program(TINY, mode="eager", dtype=dtype, lr=1e-2)
    expected = [jax_run.run(1) for _ in range(4)]
    got = [torch_run.run(1) for _ in range(4)]
    assert got == pytest.approx(expected, rel=rel)
    assert expected[0] - expected[-1] > 0.1  # the steps learn, so the comparison has teeth
    assert torch_run.params == jax_run.params == 19_712


def test_a_wrong_shape_is_refused():
    params = gpt2_jax.init_params(TINY | {"d_ff": 32})
    with pytest.raises(ValueError, match=r"parameter \(64, 32\) given \(32, 32\)"):
        gpt2_torch.GPT2(TINY).load(params)


def test_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="mode"):
        gpt2_torch.program(TINY, mode="fast")
