"""jaxformer_lab.bench.train_step (`jaxformer bench train-step`): the analytic FLOP count,
the targets' verdicts, the yardstick and the one GEMM peak, and a quick run that times
jaxformer against torch.nn.Transformer (in the interpreter that has torch) in paired rounds."""

import pytest

from jaxformer.checks import BadValue
from jaxformer_lab.bench import pythons, registry, shared, train_step


def test_the_analytic_flops_count_every_matrix_product():
    config = shared.seq2seq_config(1000)
    # per token: encoder 4E^2 + 2EF + 2SE; decoder 4E^2 + 2TE, cross 2E^2 (+2E^2 per
    # source token) + 2SE, 2EF; logits EV; times 2 (multiply-add) and 3 (backward)
    flops = train_step.analytic_train_flops(config, 32, 64, 64)
    E, F, V, tokens = 256, 1024, 1000, 32 * 64
    enc = 2 * tokens * (4 * E * E + 2 * E * F + 2 * 64 * E)
    dec = 2 * tokens * (4 * E * E + 2 * 64 * E + 4 * E * E + 2 * 64 * E + 2 * E * F)
    assert flops == 3 * 2 * (enc + dec + tokens * E * V) == 50_658_803_712  # docs: 50.7 GFLOP


@pytest.mark.slow  # one of the quick suite's slowest; gpt2-peers' quick run tests paired rounds there
def test_a_quick_run_times_the_programs_in_paired_rounds(tmp_path):
    options = train_step.TrainStepOptions(
        quick=True,
        steps_per_round=1,
        batch=2,
        loss_steps=0,
        torch_waits=("default", "passive"),
        out=str(tmp_path / "t.json"),
    )
    record = registry.run("train-step", options)
    runs = record.data["runs"]
    torch = pythons.torch_python() is not None  # this interpreter's, or one found beside it
    expected = {"jax_float32", "jax_bfloat16"} | (set(train_step.TORCH_RUNS) if torch else set())
    assert set(runs) == expected and record.data["rounds"] == 6
    for run in runs.values():
        s = run["seconds"]
        assert s["n"] == 6 and s["low"] <= s["median"] <= s["high"]
        assert run["tokens_per_s"] == pytest.approx(2 * 64 / s["median"])
        if torch:
            assert run["speed_vs_torch"]["n"] == 6
    if torch:
        assert runs[record.data["torch_yardstick"]]["speed_vs_torch"]["median"] == 1.0
        assert record.data["interpreters"]["torch"]["torch"] is not None
    assert record.data["xla"]["float32"]["xla_flops"] > 0
    assert "bf16_loss_check" not in record.data and len(record.tables[0].rows) == len(runs)
    assert [v["run"] for v in record.data["targets"]] == [t[0] for t in train_step.TARGETS]


def _ci(median, low, high):
    return dict(median=median, low=low, high=high)


def test_torch_waits_are_the_known_policies_at_least_one():
    with pytest.raises(BadValue, match="--torch-waits"):
        train_step.TrainStepOptions(torch_waits=())
    with pytest.raises(BadValue, match="--torch-waits"):
        train_step.TrainStepOptions(torch_waits=("spin",))


def test_a_target_is_reached_only_when_its_whole_interval_is():
    runs = {
        "jax_float32": dict(speed_vs_torch=_ci(1.3, 1.26, 1.4), share_of_peak=_ci(0.7, 0.6, 0.8)),
        "jax_bfloat16": dict(speed_vs_torch=_ci(0.9, 0.8, 0.99)),
    }
    verdicts = {(v["run"], v["figure"]): v["verdict"] for v in train_step.verdicts({"runs": runs})}
    assert verdicts == {
        ("jax_float32", "speed_vs_torch"): "reached",
        ("jax_float32", "share_of_peak"): "undecided",
        ("jax_bfloat16", "speed_vs_torch"): "not reached",
    }
    no_torch = {"jax_float32": dict(share_of_peak=_ci(0.7, 0.66, 0.8)), "jax_bfloat16": {}}
    verdicts = [v["verdict"] for v in train_step.verdicts({"runs": no_torch})]
    assert verdicts == ["not measured", "reached", "not measured"]


def test_the_speed_against_torch_is_against_the_faster_torch_run_round_by_round():
    k, n = 1, 6
    gemm = [train_step.PEAK_N**3 * 2 / 100e9] * n
    times = {
        "gemm_jax": gemm,
        "gemm_numpy": [2 * g for g in gemm],  # half as fast: not the peak
        "jax_float32": [0.2] * n,
        "jax_bfloat16": [0.1] * n,
        "torch_float32": [2.0] * n,  # collapsed (busy-waiting on a loaded machine)
        "torch_float32_passive": [0.3, 0.3, 0.3, 0.2, 0.2, 0.2],
    }
    r = train_step.figures(times, k, 32)
    assert (
        r["torch_yardstick"] == "torch_float32_passive" and r["gemm_peak_flops"]["of"] == "gemm_jax"
    )
    assert r["runs"]["jax_float32"]["speed_vs_torch"]["median"] == pytest.approx(1.25)
    assert r["runs"]["torch_float32_passive"]["speed_vs_torch"]["median"] == 1.0
    share = r["analytic_flops_per_step"] / 0.2 / 100e9
    assert r["runs"]["jax_float32"]["share_of_peak"]["median"] == pytest.approx(share)
