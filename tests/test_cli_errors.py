"""Errors a new user meets in `jaxformer train` before the run starts: each is one line on
stderr (a few for a --variants file's own error) with exit code 2, names the flag to
change, and leaves no run folder behind."""

import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import jax
import pytest

from tests.train.test_loop import cli_env, config_file

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _train(*argv):
    """`jaxformer train ARGV --no-progress` in a process: (exit code, stderr lines)."""
    command = [sys.executable, "-m", "jaxformer", "train", *map(str, argv), "--no-progress"]
    done = subprocess.run(command, env=cli_env(), capture_output=True, text=True)
    return done.returncode, done.stderr.strip().splitlines()


def _one_line(code, lines, *words):
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("jaxformer train: error:"), lines
    assert all(word in lines[0] for word in words), lines


def test_a_run_that_fails_before_its_first_step_leaves_no_folder(tmp_path):
    """A batch larger than a small text file is found at the first step, after the folder
    was opened: the folder goes, and a folder that was there keeps what it held."""
    small = tmp_path / "small.txt"
    small.write_text("a few words of text on a line\n" * 4)
    argv = ["--data-text", small, "--seq-len", "32", "--config", config_file(tmp_path)]
    out = tmp_path / "runs" / "small"
    code, lines = _train(*argv, "--out", out)
    _one_line(code, lines, "batch size 64 is larger than", "--batch-size")
    assert not (tmp_path / "runs").exists()

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    code, lines = _train(*argv, "--out", kept)
    _one_line(code, lines, "--batch-size")
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cudnn runs on a GPU")
def test_a_kernel_the_device_lacks_leaves_no_folder(tmp_path):
    out = tmp_path / "run"
    argv = ["--task", "copy", "--config", config_file(tmp_path), "--steps", "2"]
    code, lines = _train(*argv, "--attention-impl", "cudnn", "--out", out)
    _one_line(code, lines, "needs an NVIDIA GPU", "--attention-impl")
    assert not out.exists()


@pytest.mark.parametrize("under", ["a file", "/proc"])
def test_an_out_that_cannot_be_made_names_out(tmp_path, under):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "run" if under == "a file" else "/proc/no/such/run"
    code, lines = _train("--task", "copy", "--config", config_file(tmp_path), "--out", out)
    _one_line(code, lines, "cannot make the run folder", "--out")


def test_a_variants_file_that_raises_shows_its_own_error(tmp_path):
    """The user's exception and the line of their file that raised it, in a few lines,
    without the import machinery's or jaxformer's frames."""
    variants = tmp_path / "my_variants.py"
    variants.write_text("import math\n\nraise ValueError(f'no such kernel {math.pi:.2f}')\n")
    out = tmp_path / "run"
    code, lines = _train("--task", "copy", "--variants", variants, "--out", out)
    assert code == 2, lines
    assert lines[0] == f"jaxformer train: error: --variants {variants} raised on import:", lines
    assert f'File "{variants}", line 3, in <module>' in lines[1], lines
    assert lines[-1] == "ValueError: no such kernel 3.14", lines
    assert len(lines) <= 5, lines
    assert not any("importlib" in line or "jaxformer/" in line for line in lines), lines
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--batch-size", "0"], ["--batch-size must be >= 1, got 0"]),
        (
            ["--data-tsv", "pairs.tsv"],
            [
                "give one of --task, --data-tsv, --data-text, --dataset or --data-shards, not several"
            ],
        ),
    ],
)
def test_errors_name_flags_not_fields(tmp_path, argv, words):
    argv = [tmp_path / a if a.endswith(".tsv") else a for a in argv]
    (tmp_path / "pairs.tsv").write_text("a b\tb a\n")
    out = tmp_path / "run"
    code, lines = _train("--task", "copy", *argv, "--out", out)
    _one_line(code, lines, *words)
    assert not out.exists()


def _in_process(capsys, *argv):
    """`jaxformer train ARGV --no-progress` in this process: (exit code, stderr lines)."""
    from jaxformer.cli import main

    try:
        code = main(["train", *map(str, argv), "--no-progress"])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


# Found by a fault trial: a flag's value named as a field or blamed on the --config file.
FLAGS = [
    ("a flag over --config is the flag's", ["--config", "small.json", "--steps", "0"], r"--steps must be >= 1, got 0$"),
    ("a model flag over --config", ["--config", "small.json", "--dropout-rate", "1.5"], r"--dropout-rate must be in \[0, 1\), got 1.5$"),
    ("the file's own value is the file's", ["--config", "bad_lr.json"], r"bad_lr.json: lr must be > 0, got -1$"),
    ("--coordinator", ["--coordinator", "nohostport", "--num-processes", "2", "--process-id", "0"], r"--coordinator must be HOST:PORT \(or 'auto'\), got 'nohostport'$"),
    ("--process-id", ["--coordinator", "localhost:1", "--num-processes", "2", "--process-id", "5"], r"--process-id must be in \[0, 1\] for --num-processes=2, got 5$"),
    ("--coordinator-timeout", ["--coordinator", "localhost:1", "--num-processes", "2", "--process-id", "0", "--coordinator-timeout", "0"], r"--coordinator-timeout must be a positive int \(seconds\), got 0$"),
    ("--seeds repeated", ["--seeds", "0", "0"], r"--seeds must be distinct, at least one, got \[0, 0\]$"),
    ("--seq-len over --max-len", ["--data-text", "text.txt", "--seq-len", "100", "--max-len", "64"], r"--seq-len=100 is more than the model's --max-len=64$"),
    ("a --variants module not there", ["--variants", "no_such_variants_module"], r"--variants no_such_variants_module: no such file or module$"),
    ("model flags with --init-from", ["--init-from", "run", "--d-model", "64", "--dropout-rate", "0.2"], r"--d-model, --dropout-rate: the model is --init-from's; leave model options out$"),
]  # fmt: skip


@pytest.mark.parametrize("argv, match", [pytest.param(a, m, id=n) for n, a, m in FLAGS])
def test_errors_name_the_flag_given(tmp_path, capsys, monkeypatch, argv, match):
    (tmp_path / "small.json").write_text('{"d_model": 16, "num_heads": 2, "d_ff": 32}')
    (tmp_path / "bad_lr.json").write_text('{"run": {"lr": -1}}')
    (tmp_path / "text.txt").write_text("one document here\n\nand another one\n")
    monkeypatch.chdir(tmp_path)
    task = [] if "--data-text" in argv else ["--task", "copy"]
    code, lines = _in_process(capsys, *task, *argv, "--out", tmp_path / "run")
    _one_line(code, lines)
    assert re.search(match, lines[0]), lines
    assert not (tmp_path / "run").exists()


def test_a_variants_file_that_exits_is_an_error_not_an_exit(tmp_path, capsys):
    variants = tmp_path / "exits.py"
    variants.write_text("import sys\n\nsys.exit(3)\n")
    code, lines = _in_process(capsys, "--task", "copy", "--variants", variants)
    assert code == 2 and lines[0].endswith(f"--variants {variants} raised on import:"), lines
    assert lines[-1] == "SystemExit: 3" and len(lines) <= 5, lines


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the kernel may run on a GPU or TPU")
def test_a_tokamax_kernel_on_a_cpu_is_one_line_and_leaves_no_folder(tmp_path, capsys):
    """Found when the first step is traced, after the folder was made: the folder goes."""
    out = tmp_path / "run"
    argv = ["--task", "copy", "--config", config_file(tmp_path), "--steps", "2"]
    code, lines = _in_process(capsys, *argv, "--attention-impl", "tokamax_mosaic", "--out", out)
    _one_line(code, lines, "tokamax")
    assert not out.exists()


# Found by a new user's fault trial: sizes past what a run can hold, a divergence before
# the first checkpoint, a finished run whose checkpoints went, and a `next:` line that
# left out the --variants the model needs.
SIZES = [
    pytest.param(["--steps", "100000000000000000000000"], "--steps must be <= 2,147,483,647", id="steps past int32"),
    pytest.param(["--batch-size", "1099511627776"], "--batch-size must be <= 2,147,483,647", id="batch past int32"),
    pytest.param(["--batch-size", "1073741824"], "GiB of activations, past this machine's", id="batch past memory"),
    pytest.param(["--batch-size", "200000", "--steps", "2"], "--batch-size=200000 does not fit in memory", id="batch past XLA's memory", marks=pytest.mark.slow),
]  # fmt: skip


@pytest.mark.parametrize("argv, words", SIZES)
def test_sizes_a_run_cannot_hold_are_one_line_and_leave_no_folder(tmp_path, argv, words):
    out = tmp_path / "run"
    code, lines = _train("--task", "copy", *argv, "--out", out)
    _one_line(code, lines, words)
    assert not out.exists()


def test_a_run_diverging_before_its_first_checkpoint_says_none_was_saved(tmp_path):
    out = tmp_path / "run"
    argv = ["--task", "copy", "--config", config_file(tmp_path), "--lr", "1e30", "--steps", "40"]
    code, lines = _train(*argv, "--out", out)
    assert code == 1 and len(lines) == 1, lines
    assert "before the first checkpoint: no checkpoint was saved" in lines[0], lines
    assert "--lr" in lines[0] and "--warmup-steps" in lines[0] and "intact" not in lines[0]


def test_a_finished_run_without_its_checkpoints_is_not_trained_over(tmp_path):
    out = tmp_path / "run"
    argv = ["--task", "copy", "--config", config_file(tmp_path), "--steps", "2", "--out", out]
    assert _train(*argv)[0] == 0
    shutil.rmtree(out / "checkpoints")
    summary = (out / "summary.json").read_text()
    for resume in ([], ["--resume"]):
        code, lines = _train(*argv, *resume)
        _one_line(code, lines, "holds a finished run (summary.json) and no checkpoint", "--out")
        assert (out / "summary.json").read_text() == summary


@pytest.mark.slow  # two processes: a run, then its generate line
def test_the_next_line_after_a_variants_run_runs_as_printed(tmp_path):
    variants = ROOT / "experiments" / "variants" / "squared_relu.py"
    out = tmp_path / "run"
    argv = ["train", "--task", "copy", "--config", config_file(tmp_path), "--steps", "2"]
    argv += ["--variants", variants, "--activation", "squared_relu", "--out", out]
    done = subprocess.run(
        [sys.executable, "-m", "jaxformer", *map(str, argv)],
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    (next_line,) = [line for line in done.stdout.splitlines() if line.startswith("next: ")]
    assert f"--variants {variants}" in next_line
    words = shlex.split(next_line.removeprefix("next: jaxformer "))
    again = subprocess.run(
        [sys.executable, "-m", "jaxformer", *words], env=cli_env(), capture_output=True, text=True
    )
    assert again.returncode == 0 and again.stdout.strip(), again.stderr
