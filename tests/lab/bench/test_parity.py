"""jaxformer_lab.bench.parity (`jaxformer bench parity`): converted torch modules and Hugging
Face models reproduce the originals, and the record says by how much."""

import pytest

from jaxformer_lab.bench import parity, parity_cases, registry

pytest.importorskip("torch")


def test_the_paper_rows_are_the_base_preset():
    (post, pre) = parity_cases.paper_runs()
    assert post[2] | {"norm_first": True, "activation": "gelu"} == pre[2]
    assert (post[2]["d_model"], post[2]["nhead"], post[2]["dim_feedforward"]) == (512, 8, 2048)
    assert post[4] == (6, 6)


@pytest.mark.slow  # the quick suite's slowest test; tests/interop checks parity there
def test_a_quick_run_compares_every_small_case(tmp_path):
    pytest.importorskip("transformers")
    options = parity.ParityOptions(quick=True, out=str(tmp_path / "p.json"))
    record = registry.run("parity", options)
    torch_rows, hf_rows = record.data["torch"], record.data["hf"]
    assert [r["module"] for r in torch_rows] == list(parity_cases.KINDS)
    assert {r["config"] for r in torch_rows} == set(parity_cases.SMALL)  # each at least once
    assert max(r["output_max_abs"] for r in torch_rows) < 1e-5
    assert max(r["grad_max_abs"] for r in torch_rows) < 1e-4
    assert [r["config"] for r in hf_rows] == ["GPT-2, 2 layers, d 32", "Marian, gelu", "BART"]
    assert all(r["greedy_20_equal"] and r["logits_max_abs_diff"] < 1e-4 for r in hf_rows)
    assert record.data["headline"]["hf_all_greedy_equal"] and len(record.tables) == 2
