"""experiments/length_penalty.py, run as a user runs it, on a real (tiny) translation run:
the run's own alpha gives back the dev scores its training reported, other alphas are
compared with the first, and bad input is one error line with exit 2."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

import jaxformer as jf
from jaxformer.train import train

pytestmark = pytest.mark.slow  # two trained runs: 60 s of CI's quick suite

ROOT = pathlib.Path(__file__).resolve().parents[1]


def length_penalty(*argv: str) -> subprocess.CompletedProcess:
    """`python experiments/length_penalty.py ARGV` from the repository's root."""
    command = [sys.executable, "experiments/length_penalty.py", *argv]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


WORDS = "the king said to her be doers of word hope send him at once".split()


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """A translation run of a few steps on a TSV of word sequences and their upper case."""
    folder = tmp_path_factory.mktemp("length_penalty")
    lines = []
    for i in range(120):
        words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 5)]
        lines.append(f"{' '.join(words)}\t{' '.join(words).upper()}\n")
    (folder / "pairs.tsv").write_text("".join(lines))
    run = jf.RunConfig.from_options(
        data_tsv=str(folder / "pairs.tsv"),
        steps=300,
        batch_size=16,
        eval_every=1000,
        eval_beam=2,
        out=str(folder / "run"),
    )
    config = jf.TransformerConfig.tiny(
        259, num_encoder_layers=1, num_decoder_layers=1, d_model=32, d_ff=64
    )
    return folder / "run", train(config, run, progress=False)


def test_the_runs_own_alpha_gives_its_dev_scores_and_others_are_compared(translation_run, tmp_path):
    folder, summary = translation_run
    out = tmp_path / "alpha.json"
    done = length_penalty(str(folder), "--alphas", "0.6", "2.0", "--out", str(out))
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.splitlines()[-1])
    table = json.loads(out.read_text())["tables"][0]
    first, second = table["rows"]
    assert line["dev_bleu"] == {"0.6": [round(summary["bleu"], 2)], "2.0": [float(second[1])]}
    assert first == [
        "0.6",
        f"{summary['bleu']:.2f}",
        f"{summary['chrf']:.2f}",
        first[3],
        *[""] * 5,
    ]
    interval = r"\[[+-]\d+\.\d\d, [+-]\d+\.\d\d\]"
    assert second[0] == "2" and float(second[3]) > 0 and re.fullmatch(interval, second[6])
    assert second[4] == f"{float(second[1]) - float(first[1]):+.2f}" and second[5] == ""
    assert second[8] == "no verdict (one seed)"  # training variance unknown from one run
    assert (
        table["notes"][0]
        == f"Dev BLEU of each run (seeds 0): alpha 0.6: {first[1]}; alpha 2: {second[1]}."
    )


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory) -> pathlib.Path:
    """A run on a task scored by exact match, not BLEU."""
    folder = tmp_path_factory.mktemp("copy") / "run"
    run = jf.RunConfig.from_options(
        task="copy", steps=2, eval_every=1000, eval_examples=8, out=str(folder)
    )
    train(jf.TransformerConfig.tiny(259, d_model=32, d_ff=64), run, progress=False)
    return folder


@pytest.mark.parametrize(
    "argv, message",
    [
        (["/no/such/run"], "no config.json"),
        (["RUN", "--alphas", "-1"], "alpha must be >= 0, got -1.0"),
        (["RUN", "COPY"], "give the seeds of one configuration"),
        (["COPY"], "not scored by BLEU"),
    ],
)
def test_bad_input_is_one_error_line_with_exit_2(translation_run, copy_run, argv, message):
    named = {"RUN": str(translation_run[0]), "COPY": str(copy_run)}
    done = length_penalty(*[named.get(a, a) for a in argv], "--out", "/dev/null")
    assert done.returncode == 2 and message in done.stderr.splitlines()[-1]
