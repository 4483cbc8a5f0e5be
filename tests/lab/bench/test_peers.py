"""jaxformer_lab.bench.peers (`jaxformer bench gpt2-peers`): a quick run on the CPU writes a
consistent record; the ratios come from paired rounds; a missing program is a note, not
a crash."""

import importlib.util
import math
import statistics

import pytest

from jaxformer_lab.bench import peers, registry


def test_a_quick_run_writes_a_consistent_record(tmp_path):
    options = peers.PeersOptions(quick=True, rounds=6, steps=1, out=str(tmp_path / "p.json"))
    record = registry.run("gpt2-peers", options)
    result = record.data
    programs = result["programs"]
    torch = importlib.util.find_spec("torch") is not None
    names = ["jaxformer", "jax", "torch"] if torch else ["jaxformer", "jax"]
    assert [n for n, p in programs.items() if p["status"] == "ok"] == names
    for p in (programs[n] for n in names):
        assert p["params"] == 544_256 and len(p["round_step_ms"]) == 6
        assert p["step_ms"]["median"] == statistics.median(p["round_step_ms"])
        # the first step (a compile, or a read of the compile cache) less a later one
        assert p["compile_s"] == pytest.approx(p["first_step_s"] - p["step_ms"]["median"] / 1e3)
        assert p["tokens_per_second"] == pytest.approx(8 * 128 / p["step_ms"]["median"] * 1e3)
    for peer in names[1:]:
        assert programs[peer]["initial_loss"] == pytest.approx(math.log(1024), abs=0.05)
        ours, theirs = programs["jaxformer"]["round_step_ms"], programs[peer]["round_step_ms"]
        ratio = result["ratios"][f"jaxformer/{peer}"]
        pairs = zip(ours, theirs, strict=True)
        assert ratio["median"] == pytest.approx(statistics.median(a / b for a, b in pairs))
        assert ratio["n"] == 6 and ratio["low"] <= ratio["median"] <= ratio["high"]
    if torch:  # the peers start from the same weights on the same tokens
        assert programs["torch"]["initial_loss"] == pytest.approx(
            programs["jax"]["initial_loss"], abs=2e-3
        )
        assert programs["torch"]["mode"] == "eager"  # "auto" on a CPU
    assert result["jaxformer_auto"] == {"attention": "xla", "lm_head": "dense"}
    assert (tmp_path / "p" / "jax.log").is_file()  # the workers' logs, next to the record
    assert result["jaxformer_asked"] == {"attention": "auto", "lm_head": "auto"}
    assert "| jaxformer (attention xla (auto), head dense (auto)) |" in record.markdown()
    assert "--rounds 6 --steps 1" in record.command


def ready(params=100, device="cpu"):
    first = dict(first_step_s=2.0, initial_loss=6.9, peak_bytes=None)
    return dict(ready=True, params=params, device=device, **first)


def test_ratios_are_medians_of_paired_rounds_and_a_missing_peer_is_a_note():
    options = peers.PeersOptions(quick=True, rounds=6, steps=2)
    # Round 2 is slow for both programs: paired, it cancels; the ratio of the medians
    # (12 / 10 = 1.2) would not be the median of the per-round ratios (1.5).
    jaxformer = [3.0, 3.0, 30.0, 3.0, 3.0, 3.0]
    jax = [2.0, 2.0, 20.0, 2.0, 2.0, 2.0]
    times = {"jaxformer": jaxformer, "jax": jax}
    found = {
        "jaxformer": ready() | {"attention": "xla", "lm_head": "dense"},
        "jax": ready() | {"attention": "xla"},
    }
    found["torch"] = {"error": "skipped: torch is not installed (the `torch` extra)"}
    result = peers.summarize(options, found, times)
    assert result["ratios"]["jaxformer/jax"]["median"] == pytest.approx(1.5)
    assert list(result["ratios"]) == ["jaxformer/jax"]
    assert result["programs"]["jax"]["step_ms"]["median"] == pytest.approx(1000.0)
    assert result["programs"]["torch"]["status"] == "failed"
    text = "\n".join(peers.table(result).markdown())
    assert "| PyTorch | skipped: torch is not installed (the `torch` extra) |" in text
    assert result["params"] == 100 and result["device"] == "cpu"
    found["jaxformer"] = {"error": "worker jaxformer exited (1); see jaxformer.log"}
    result = peers.summarize(options, found, {"jax": jax})
    assert result["ratios"] == {} and result["programs"]["jax"]["status"] == "ok"
    assert "| jaxformer | worker jaxformer exited (1)" in "\n".join(peers.table(result).markdown())


def test_too_few_rounds_for_an_interval_are_refused():
    with pytest.raises(ValueError, match="--rounds must be >= 6"):
        peers.PeersOptions(rounds=5)
