"""Seeds as an axis (jaxformer.train.seeds): k seeds vmapped in one program train as k
separate runs do."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import data, parallel, train
from jaxformer.train import seeds as seeds_lib

TOK = data.ByteTokenizer()
SEEDS = (0, 1, 2)


def _run(seed: int):
    config = jf.TransformerConfig.tiny(
        TOK.vocab_size, d_model=32, num_heads=2, d_ff=64, max_len=64, dropout_rate=0.1
    )
    schedule = optax.constant_schedule(3e-3)
    optimizer = train.make_optimizer(schedule)
    graphdef, state = train.create_train_state(
        jf.Transformer(config, rngs=nnx.Rngs(seed)), optimizer, seed=seed
    )
    step = train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1)
    return graphdef, state, step, data.TaskData("copy", TOK, seed=seed, dev_size=8)


@pytest.mark.slow  # test_seed_group.py checks the same through train_seeds in the quick suite
@pytest.mark.parametrize("at_once", [None, 1, 2])  # vmapped, mapped, mapped 2 at a time
def test_seeds_in_one_program_train_as_separate_runs(at_once):
    runs = [_run(seed) for seed in SEEDS]
    graphdef, _, step, _ = runs[0]
    separate = [(jax.jit(s), state, d) for _, state, s, d in runs]
    stacked = seeds_lib.stack([state for _, state, _, _ in runs])
    vmapped = jax.jit(seeds_lib.seed_step(step, at_once), donate_argnums=0)
    for i in range(3):
        batches = [d.train_batch(i, 8) for _, _, _, d in runs]
        stacked, metrics = vmapped(stacked, seeds_lib.stack_batches(batches))
        for k, (fn, state, d) in enumerate(separate):
            state, m = fn(state, batches[k])
            separate[k] = (fn, state, d)
            np.testing.assert_allclose(metrics["loss"][k], m["loss"], rtol=1e-5)
    assert len(set(np.asarray(metrics["loss"]).tolist())) == len(SEEDS)  # seeds differ
    for (_, state, _), mine in zip(separate, seeds_lib.unstack(stacked), strict=True):
        assert int(mine.step) == 3
        for a, b in zip(jax.tree.leaves(mine.params), jax.tree.leaves(state.params), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_mapped_step_gives_the_vmapped_steps_results():
    def step(state, batch):
        return state * 2 + batch.sum(), {"loss": (state * batch).sum()}

    state, batch = np.arange(5.0), np.arange(15.0).reshape(5, 3)
    vmapped = seeds_lib.seed_step(step)(state, batch)
    for at_once in (1, 2, 5):
        mapped = jax.jit(seeds_lib.seed_step(step, at_once))(state, batch)
        jax.tree.map(np.testing.assert_allclose, mapped, vmapped)
    with pytest.raises(ValueError, match="at_once must be >= 1"):
        seeds_lib.seed_step(step, 0)


def test_batches_of_different_lengths_are_padded_as_padding():
    a = {"tgt_in": np.ones((2, 3), np.int32), "tgt_valid": np.ones((2, 3), bool)}
    b = {"tgt_in": np.ones((2, 5), np.int32), "tgt_valid": np.ones((2, 5), bool)}
    both = seeds_lib.stack_batches([a, b])
    assert both["tgt_in"].shape == (2, 2, 5) and both["tgt_valid"][0].sum() == 6
    assert both["tgt_in"][0, :, 3:].sum() == 0
    with pytest.raises(ValueError, match="lengths differ between seeds, with no mask"):
        seeds_lib.stack_batches([{"tgt_in": a["tgt_in"]}, {"tgt_in": b["tgt_in"]}])
    with pytest.raises(ValueError, match="same leading"):
        seeds_lib.unstack({"x": np.zeros((2, 1)), "y": np.zeros((3, 1))})


@pytest.mark.devices(8)
def test_a_placement_lays_out_the_seed_axis_whole():
    graphdef, state, step, d = _run(0)
    stacked = seeds_lib.stack([state, _run(1)[1]])
    layout = seeds_lib.seed_layout(train.state_layout(graphdef, state), 2)
    placement = parallel.make_placement("data=1,fsdp=4,tensor=2")
    placed = placement.put(stacked, like=layout)
    wq = placed.params["encoder"]["layers"][0]["self_attn"]["wq"]
    assert wq.shape[0] == 2 and wq.sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", "tensor", None
    )


def test_vmapping_the_step_adds_no_loop_and_no_arithmetic():
    """The pitfalls of vmapping a train step: a batching rule that falls back to a loop over
    the seeds (reported for other kinds of random keys) and work the seeds do not need.
    XLA's compiled step for 3 seeds has the one seed's loops (threefry's rounds) and
    counts 3 times its flops."""
    runs = [_run(seed) for seed in SEEDS]
    _, state, step, d = runs[0]
    batches = [r[3].train_batch(0, 8) for r in runs]
    one = jax.jit(step).lower(state, batches[0]).compile()
    stacked = seeds_lib.stack([r[1] for r in runs])
    vmapped = jax.jit(seeds_lib.seed_step(step)).lower(stacked, seeds_lib.stack_batches(batches))
    vmapped = vmapped.compile()
    # threefry's own rounds run as loops (5 trips of 4 rounds), in both programs alike
    assert vmapped.as_text().count(" while(") == one.as_text().count(" while(")

    def flops(compiled):
        cost = compiled.cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    assert flops(vmapped) == pytest.approx(len(SEEDS) * flops(one), rel=0.02)
