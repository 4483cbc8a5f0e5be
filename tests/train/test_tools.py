"""The tools around a run: `--profile` traces, the persistent compilation cache of the
`jaxformer` command, and the time to the first step in the summary."""

import json
import os
import subprocess
import sys

import pytest

import jaxformer as jf
from jaxformer.train import loop
from tests.train.test_loop import ROOT, run_config, small_config


def test_profile_writes_a_trace_of_the_asked_steps(tmp_path, capsys):
    run = run_config(tmp_path / "run", steps=4, profile="1:3")
    summary = loop.train(small_config(), run)
    traces = list((tmp_path / "run" / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert list((tmp_path / "run" / "profile").rglob("perfetto_trace.json.gz"))
    assert "profile of steps 2-3:" in capsys.readouterr().out
    assert 0 < summary["seconds_to_first_step"] < summary["wall_seconds"] + 60


@pytest.mark.parametrize(
    "profile, match",
    [
        ("3:3", "empty or reversed range"),
        ("5:2", "empty or reversed range"),
        ("2:50", "goes past steps=20"),
        ("2-5", "profile must be START:STOP"),
        (":4", "profile must be START:STOP"),
    ],
)
def test_bad_profile_ranges_are_refused(profile, match):
    with pytest.raises(ValueError, match=match):
        jf.RunConfig.from_options(steps=20, profile=profile)


# A second `jaxformer` process finds the first one's compiled programs: JAX reports each
# persistent-cache hit as a monitoring event, counted here.
COUNT_HITS = """
import sys, jax.monitoring
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
from jaxformer.cli import main
code = main(sys.argv[1:])
print("HITS", len(hits), "CODE", code)
"""


@pytest.mark.slow  # two fresh processes compiling from an empty cache: ~1 min on 2 cores
def test_the_command_reuses_compiled_programs_from_an_earlier_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env |= dict(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "lab")]),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="",
        XDG_CACHE_HOME=str(tmp_path),
    )
    (tmp_path / "model.json").write_text(
        json.dumps(
            dict(num_encoder_layers=1, num_decoder_layers=1, d_model=32, num_heads=2, d_ff=64)
        )
    )

    def run(out, *extra):
        argv = [
            *"train --task copy --steps 2 --batch-size 8 --eval-every 2".split(),
            *"--eval-examples 8".split(),
            "--config",
            str(tmp_path / "model.json"),
            "--no-progress",
            "--out",
            str(tmp_path / out),
            *extra,
        ]
        done = subprocess.run(
            [sys.executable, "-c", COUNT_HITS, *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split("HITS ")[1].split()[0])

    first = run("first")  # a program compiled twice in one process may already hit
    entries = list((tmp_path / "jaxformer" / "jax").iterdir())
    assert len(entries) > first  # the cache folder was filled
    assert run("second") >= len(entries) // 2 > first


def test_no_compile_cache_turns_the_cache_off(monkeypatch):
    import jax

    from jaxformer import cli

    monkeypatch.setattr(jax.config, "update", lambda name, value: updates.append((name, value)))
    updates = []
    cli._use_compilation_cache(False)
    assert updates == [("jax_enable_compilation_cache", False)]
