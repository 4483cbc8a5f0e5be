"""jaxformer_lab.bench.train_step (`jaxformer bench train-step`): the analytic FLOP count, and
a quick run that times jaxformer against torch.nn.Transformer in paired rounds."""

import importlib.util

import pytest

from jaxformer_lab.bench import registry, shared, train_step


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
        quick=True, steps_per_round=1, batch=2, loss_steps=0, out=str(tmp_path / "t.json")
    )
    record = registry.run("train-step", options)
    runs = record.data["runs"]
    torch = importlib.util.find_spec("torch") is not None
    expected = {"jax_float32", "jax_bfloat16"} | ({"torch_float32"} if torch else set())
    assert set(runs) == expected and record.data["rounds"] == 6
    for run in runs.values():
        s = run["seconds"]
        assert s["n"] == 6 and s["low"] <= s["median"] <= s["high"]
        assert run["tokens_per_s"] == pytest.approx(2 * 64 / s["median"])
        if torch:
            assert run["speed_vs_torch"]["n"] == 6
    if torch:
        assert runs["torch_float32"]["speed_vs_torch"]["median"] == 1.0
    assert record.data["xla"]["float32"]["xla_flops"] > 0
    assert "bf16_loss_check" not in record.data and len(record.tables[0].rows) == len(runs)
