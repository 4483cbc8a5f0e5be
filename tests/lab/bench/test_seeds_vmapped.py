"""jaxformer bench seeds-vmapped: k seeds as one vmapped step against the k seeds' own
steps, timed side by side; the record carries each row's intervals and is written after
every row."""

import json

import pytest

from jaxformer import cli
from jaxformer_lab.bench import seeds_vmapped


@pytest.mark.slow  # 25-75 s: three programs compiled for the dates model
def test_a_row_with_intervals_and_compile_costs(tmp_path):
    out = tmp_path / "seeds.json"
    argv = ["--tasks", "dates", "--seeds", "2", "--rounds", "6", "--steps", "1", "--decode", "4"]
    assert cli.main(["bench", "seeds-vmapped", *argv, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    given = ["jaxformer", "bench", "seeds-vmapped", "--out", str(out), *argv]
    assert record["command"] == " ".join(given)
    rows = record["data"]["rows"]
    assert [(r["task"], r["k"]) for r in rows] == [("dates", 2)]
    (row,) = rows
    for s in (row["speedup"], row["mapped_speedup"]):
        assert 0 < s["low"] <= s["median"] <= s["high"]
    assert all(row["compiled"][m]["seconds"] > 0 for m in ("vmapped", "mapped", "one seed"))
    assert row["padding"] == 1.0  # the dates task's batches are all one length
    assert record["data"]["headline"] == {
        "dates k=2 vmapped": round(row["speedup"]["median"], 3),
        "dates k=2 mapped": round(row["mapped_speedup"]["median"], 3),
        "dates k=2 decode": round(row["decode"]["speedup"]["median"], 3),
    }
    decoded = row["decode"]
    assert decoded["sources"] == 4 and decoded["beam"] == 1  # exact match: greedy
    assert decoded["same_predictions"]
    assert decoded["ms"]["apart"]["n"] == 6 and record["tables"][1]["rows"][0][:4] == [
        "dates",
        "2",
        "4",
        "1",
    ]
    table = record["tables"][0]
    assert [row[:2] for row in table["rows"]] == [["dates", "2"]]
    assert "what varied: the round" in table["caption"]
    flops, bytes_ = (float(x) for x in table["rows"][0][-1].split(", "))
    assert flops == pytest.approx(1.0, abs=0.02)  # vmapping adds no arithmetic
    assert 0.5 < bytes_ < 1.5


def test_whole_runs_need_rounds_for_an_interval(capsys):
    assert cli.main(["bench", "seeds-vmapped", "--processes", "3"]) == 2
    assert "--processes must be 0 or >= 6, got 3" in capsys.readouterr().err


@pytest.mark.parametrize("shared", [False, True])
def test_the_runs_timed_whole_are_the_runs_measured_in_process(shared):
    options = seeds_vmapped.SeedsOptions(shared_lengths=shared)
    flags = seeds_vmapped.train_flags("wyc-web", options)
    parser, _ = cli._parser((), "train")
    args = parser.parse_args(["train", *flags])
    assert args.dataset == "wyc-web" and getattr(args, "shared_lengths", False) is shared
    assert seeds_vmapped._run_fields("wyc-web", options).get("shared_lengths", False) is shared
