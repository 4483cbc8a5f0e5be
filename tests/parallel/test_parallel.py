"""Mesh, sharding rules and placements (one device, meshes, pmap) on 8 virtual CPU
devices: each layout must give the single-device losses, with parameters laid out as the
rules say, from the one train step function."""

import functools
import math

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import jaxformer as jf
from jaxformer import checkpoints, data, parallel, train

TOK = data.ByteTokenizer()
BATCHES = [data.TaskData("copy", TOK, seed=0, dev_size=10).train_batch(i, 16) for i in range(5)]


def small(**overrides):
    fields = dict(
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_model=32,
        num_heads=4,
        d_ff=64,
        max_len=64,
        dropout_rate=0.0,
    )
    return jf.TransformerConfig.tiny(TOK.vocab_size, **(fields | overrides))


def setup(config, optimizer="adam"):
    schedule = optax.constant_schedule(3e-3)
    optimizer = train.make_optimizer(schedule, name=optimizer)
    graphdef, state = train.create_train_state(
        jf.Transformer(config, rngs=nnx.Rngs(0)), optimizer, seed=0
    )
    return graphdef, state, optimizer, schedule


def placed_losses(config, placement, accum_steps=1, optimizer="adam"):
    """5 steps of the train step compiled by `placement`: (losses, final state)."""
    graphdef, state, optimizer, schedule = setup(config, optimizer)
    step = train.make_train_step(
        graphdef, optimizer, schedule, label_smoothing=0.1, accum_steps=accum_steps
    )
    layout = train.state_layout(graphdef, state)
    state = placement.put(state, like=layout)
    compiled = placement.compile(step, layout, donate_state=True)
    losses = []
    for batch in BATCHES:
        state, m = compiled(state, batch)
        losses.append(float(m["loss"]))
    return losses, state


@functools.cache
def single_device_losses(config, accum_steps=1, optimizer="adam") -> list[float]:
    graphdef, state, optimizer, schedule = setup(config, optimizer)
    step = jax.jit(
        train.make_train_step(
            graphdef, optimizer, schedule, label_smoothing=0.1, accum_steps=accum_steps
        )
    )
    losses = []
    for batch in BATCHES:
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    return losses


def test_one_device_placement_is_plain_jit():
    placement = parallel.make_placement()
    assert placement.description.startswith("one device") and placement.mesh.size == 1
    losses, state = placed_losses(small(dropout_rate=0.1), placement)
    assert losses == single_device_losses(small(dropout_rate=0.1))  # bit for bit
    assert int(state.step) == 5


@pytest.mark.devices(8)
def test_make_mesh_fills_and_checks():
    assert dict(parallel.make_mesh().shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert dict(parallel.make_mesh(fsdp=2, tensor=2).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(parallel.make_mesh(data=2, fsdp=-1).shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    with pytest.raises(ValueError, match="needs 12 devices, but there are 8"):
        parallel.make_mesh(data=3, fsdp=4)
    with pytest.raises(ValueError, match="8 is not divisible by 3"):
        parallel.make_mesh(fsdp=3)
    with pytest.raises(ValueError, match="only one mesh axis may be -1"):
        parallel.make_mesh(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="tensor must be a positive int or -1"):
        parallel.make_mesh(tensor=0)
    assert parallel.parse_mesh("data=2, fsdp=2,tensor=2") == {"data": 2, "fsdp": 2, "tensor": 2}
    for bad in ("data=2,model=4", "data", "data=two", "data=2,data=4"):
        with pytest.raises(ValueError, match="mesh"):
            parallel.parse_mesh(bad)


# The rules, written out: what each parameter kind must become.
EXPECTED_SPECS = {
    "wq": P("fsdp", "tensor", None),
    "wk": P("fsdp", "tensor", None),
    "wv": P("fsdp", "tensor", None),
    "wo": P("tensor", None, "fsdp"),
    "w1": P("fsdp", "tensor"),
    "w2": P("tensor", "fsdp"),
    "b1": P("tensor"),
    "b2": P("fsdp"),
    "scale": P("fsdp"),
    "bias": P("fsdp"),
    "table": P(None, "fsdp"),
}


def check_layout(state, mesh):
    """Every parameter, and its two Adam moments, is laid out as the rules say, and each
    device holds the matching slice."""
    checked = {}
    for path, x in jax.tree_util.tree_leaves_with_path((state.params, state.opt_state)):
        if x.ndim == 0:  # step counters
            continue
        name = path[-1].key  # [..., DictKey(name)]: plain arrays
        spec = EXPECTED_SPECS[name]
        assert x.sharding.spec == spec, (jax.tree_util.keystr(path), x.sharding.spec)
        split = [math.prod(mesh.shape[a] for a in ([axis] if axis else [])) for axis in spec]
        local = tuple(n // k for n, k in zip(x.shape, split, strict=True))
        assert x.addressable_shards[0].data.shape == local
        checked[name] = checked.get(name, 0) + 1
    assert set(checked) == set(EXPECTED_SPECS)
    assert all(n % 3 == 0 for n in checked.values())  # parameter, mu, nu


@pytest.mark.devices(8)
@pytest.mark.parametrize(
    "shape,accum",
    [  # the last uses every axis and accumulates: the others run in make test-all
        pytest.param(dict(data=8), 1, marks=pytest.mark.slow),
        pytest.param(dict(data=2, fsdp=4), 1, marks=pytest.mark.slow),
        pytest.param(dict(data=2, tensor=4), 1, marks=pytest.mark.slow),
        (dict(data=2, fsdp=2, tensor=2), 2),
    ],
    ids=["data8", "fsdp2x4", "tensor2x4", "dft2x2x2-accum2"],
)
def test_sharded_steps_match_one_device(shape, accum):
    """5 steps with dropout: the same losses as one device (threefry keys do not depend on
    the layout, so even the dropout masks agree)."""
    config = small(dropout_rate=0.1)
    expected = single_device_losses(config, accum)
    mesh = parallel.make_mesh(**shape)
    losses, state = placed_losses(config, parallel.make_placement(mesh), accum)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    check_layout(state, mesh)
    assert int(state.step) == 5


@pytest.mark.devices(8)
@pytest.mark.parametrize(
    "shape",
    [dict(data=2, fsdp=4), pytest.param(dict(data=2, tensor=4), marks=pytest.mark.slow)],
    ids=["fsdp2x4", "tensor2x4"],
)
def test_muon_sharded_steps_match_one_device(shape):
    """Muon's Newton-Schulz on matrices split over the fsdp or tensor axis: the one-device
    losses, with its momentum laid out as its parameters (AdamW's moments as theirs)."""
    config = small(dropout_rate=0.1)
    expected = single_device_losses(config, 1, "muon")
    mesh = parallel.make_mesh(**shape)
    losses, state = placed_losses(config, parallel.make_placement(mesh), 1, "muon")
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    groups = state.opt_state.inner_states
    momenta = (groups["muon"].inner_state[0].mu, groups["adam"].inner_state[0].mu)
    for path, x in jax.tree_util.tree_leaves_with_path(momenta):
        assert x.sharding.spec == EXPECTED_SPECS[path[-1].key], jax.tree_util.keystr(path)
    assert len(jax.tree.leaves(momenta[0])) == 16  # 4 + 4 + 4 attention, 2 + 2 feed-forward


@pytest.mark.devices(8)
def test_fsdp_divides_parameter_and_optimizer_bytes_by_its_size():
    config = small(ffn_bias=False)  # every parameter then has a d_model axis
    graphdef, state, *_ = setup(config)
    layout = train.state_layout(graphdef, state)
    total = sum(x.nbytes for x in jax.tree.leaves((state.params, state.opt_state)))
    for fsdp in (2, 4, 8):
        mesh = parallel.make_mesh(data=-1, fsdp=fsdp)
        placed = parallel.make_placement(mesh).put(state, like=layout)
        per_device = sum(
            x.addressable_shards[0].data.nbytes
            for x in jax.tree.leaves((placed.params, placed.opt_state))
        )
        counts = [4] * 2  # the two Adam step counters (int32 scalars) stay whole
        assert per_device == pytest.approx((total - sum(counts)) / fsdp + sum(counts))


@pytest.mark.devices(8)
def test_layouts_that_do_not_divide_are_clear_errors():
    graphdef, state, *_ = setup(small(num_heads=4, num_kv_heads=2))
    layout = train.state_layout(graphdef, state)
    with pytest.raises(
        ValueError, match=r"wk.*dimension 1 \(heads\) of size 2 .* tensor of size 4"
    ):
        parallel.make_placement(parallel.make_mesh(data=2, tensor=4)).put(state, like=layout)
    with pytest.raises(ValueError, match="holds no nnx Variables, so nothing says how to split"):
        parallel.make_placement(parallel.make_mesh(data=2, tensor=4)).put(state)
    graphdef, state, *_ = setup(small(d_model=36))
    layout = train.state_layout(graphdef, state)
    with pytest.raises(ValueError, match=r"dimension \d \(embed\) of size 36 .* fsdp of size 8"):
        parallel.make_placement(parallel.make_mesh(data=1, fsdp=8)).put(state, like=layout)
    mesh = parallel.make_mesh(data=4, fsdp=2)
    with pytest.raises(ValueError, match="rows 12 is not divisible by data\\*fsdp = 8"):
        parallel.shard_batch({k: v[:12] for k, v in BATCHES[0].items()}, mesh)
    with pytest.raises(ValueError, match="not a mesh axis"):
        parallel.state_shardings(layout, mesh, parallel.DEFAULT_RULES | {"mlp": "model"})


@pytest.mark.devices(8)
def test_pmap_step_equals_the_single_device_step():
    config = small()
    expected = single_device_losses(config)
    placement = parallel.make_placement(pmap=True)
    losses, state = placed_losses(config, placement)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    assert state.step.shape == (8,)  # one copy per device
    assert int(placement.one_copy(state).step) == 5
    with pytest.raises(ValueError, match="batch size 12 is not divisible by the 8 devices"):
        placement.check_rows(12, "batch size")
    with pytest.raises(ValueError, match="not divisible by the 8 devices of pmap"):
        parallel.split_batch({"src": BATCHES[0]["src"][:12]})


@pytest.mark.devices(8)
def test_sharded_checkpoint_restores_onto_another_mesh_and_one_device(tmp_path):
    """Orbax writes the pieces; restoring takes the target's layout, whatever the saved one."""
    graphdef, state, *_ = setup(small())
    layout = train.state_layout(graphdef, state)
    saved = parallel.make_placement("data=2,fsdp=2,tensor=2").put(state, like=layout)
    meta = {"model_kind": "Transformer", "model_config": small().to_dict(), "run": {}}
    ckpt = checkpoints.Checkpointer(tmp_path)
    ckpt.save(saved, meta)
    target = parallel.make_placement("data=1,fsdp=8").put(state, like=layout)
    restored, _ = ckpt.restore(checkpoints.abstract_train_state(target), meta)
    ckpt.close()
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(a, b)
    wq = restored.params["encoder"]["layers"][0]["self_attn"]["wq"]
    assert wq.sharding.spec == P("fsdp", "tensor", None) and wq.sharding.mesh.shape["fsdp"] == 8
    TOK.save(tmp_path)
    model, _ = checkpoints.restore_model(tmp_path)
    table = model.src_inputs.embed.table[...]
    assert len(table.sharding.device_set) == 1
    np.testing.assert_array_equal(table, state.params["src_inputs"]["embed"]["table"][...])


@pytest.mark.devices(8)
@pytest.mark.parametrize("layout", ["data=2,fsdp=2,tensor=2", "pmap"])
def test_eval_step_sums_agree_across_placements(layout):
    """The eval step's loss sums over a placement equal one device's (pmap adds the
    devices' sums with sum_over_replicas)."""
    graphdef, state, *_ = setup(small())
    evaluate = train.make_eval_step(graphdef, label_smoothing=0.1)
    expected = jax.jit(evaluate)(state.params, BATCHES[0])
    placement = (
        parallel.make_placement(pmap=True) if layout == "pmap" else parallel.make_placement(layout)
    )
    layout = train.state_layout(graphdef, state)
    placed = placement.put(state, like=layout)
    got = placement.compile(evaluate, layout.params)(placed.params, BATCHES[0])
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-5)
