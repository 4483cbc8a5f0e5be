"""`jaxformer generate`: outputs equal the library's decoding of the restored model, one
line per input; bad input is one error line with exit code 2."""

import io
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer as jf
from jaxformer import checkpoints, decode
from jaxformer.cli import main
from jaxformer.data import tasks
from jaxformer.train import loop
from tests import hf_tokenizers as hf

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMALL = dict(
    num_encoder_layers=1, num_decoder_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=48
)
RUN = dict(batch_size=8, eval_every=1000, log_every=1, eval_examples=8, checkpoint_every=2, lr=3e-3)


@pytest.fixture(scope="module")
def seq2seq_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dates")
    run = jf.RunConfig.from_options(task="dates", steps=2, out=str(out), **RUN)
    loop.train(jf.TransformerConfig.tiny(259, **SMALL), run, progress=False)
    return out


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    text = out / "text.txt"
    text.write_text("\n\n".join(f"document {i}: " + "abc def ghi " * 6 for i in range(30)))
    run = jf.RunConfig.from_options(
        task=None, data_text=str(text), seq_len=32, steps=2, out=str(out), **RUN
    )
    loop.train(jf.TransformerConfig.tiny(259, **SMALL), run, progress=False)
    return out


def generate(capsys, monkeypatch, *args, stdin=None):
    """(exit code, stdout lines, stderr) of `jaxformer generate ARGS`."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    try:
        code = main(["generate", *args])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def special_ids(tokenizer):
    return dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)


def library(run_dir, lines, method, **kw):
    """What the library decodes for each line alone (a batch of one; sources padded to a
    multiple of 16 tokens, prompts not padded) with the tokenizer's ids, as text."""
    model, tokenizer = checkpoints.restore_model(run_dir)
    seq2seq = isinstance(model, jf.Transformer)
    out = []
    for line in lines:
        ids = tokenizer.encode(line) + ([tokenizer.eos_id] if seq2seq else [])
        width = -(-len(ids) // 16) * 16 if seq2seq else len(ids)
        src = np.full((1, width), tokenizer.pad_id, np.int32)
        src[0, : len(ids)] = ids
        valid = np.arange(width)[None, :] < len(ids)
        tokens = method(model, jnp.asarray(src), jnp.asarray(valid), **kw, **special_ids(tokenizer))
        tokens = tokens[0][:, 0] if isinstance(tokens, tuple) else tokens  # beam search's best
        out.append(tokenizer.decode(np.asarray(tokens)[0][: len(ids) + 50]))
    return out


LINES = ["3 March 2001", "Saturday, 3 March 2001", "20010303"]


def test_greedy_lines_from_stdin_equal_the_library(seq2seq_run, capsys, monkeypatch):
    code, out, err = generate(
        capsys, monkeypatch, "--checkpoint", str(seq2seq_run), stdin="\n".join(LINES) + "\n"
    )
    assert code == 0 and err == ""
    assert out == library(seq2seq_run, LINES, decode.greedy, max_new_tokens=48)
    padded = "\n".join(f"  {line}\t " for line in LINES)  # surrounding spaces are stripped
    assert generate(capsys, monkeypatch, "--checkpoint", str(seq2seq_run), stdin=padded)[1] == out


def test_beam_and_sampling(seq2seq_run, capsys, monkeypatch):
    args = ("--checkpoint", str(seq2seq_run), "--input", LINES[1])
    code, out, _ = generate(capsys, monkeypatch, *args, "--beam", "2", "--alpha", "0.6")
    assert code == 0
    want = library(seq2seq_run, LINES[1:2], decode.beam_search, beam_size=2, alpha=0.6)
    assert out == want
    sampling = ("--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "3")
    code, first, _ = generate(capsys, monkeypatch, *args, *sampling)
    assert code == 0 and len(first) == 1
    assert generate(capsys, monkeypatch, *args, *sampling)[1] == first  # seeded


def test_lm_continues_prompts(lm_run, capsys, monkeypatch):
    prompts = ["document 3: abc", "doc"]
    code, out, _ = generate(
        capsys,
        monkeypatch,
        "--checkpoint",
        str(lm_run),
        "--max-new-tokens",
        "8",
        stdin="\n".join(prompts),
    )
    assert code == 0
    assert out == library(lm_run, prompts, decode.greedy, max_new_tokens=8)


@pytest.fixture
def hf_run(seq2seq_run, tmp_path):
    """The dates run with a GPT-2-like tokenizer in place of its bytes: one id, not 0, 1
    or 2, is bos, eos and pad."""
    run = tmp_path / "run"
    shutil.copytree(seq2seq_run, run)
    hf.gpt2_like(tmp_path, alphabet=hf.PRINTABLE).save(run)
    return run


EOT = len(hf.PRINTABLE) + 1  # the GPT-2-like tokenizer's one special id


def recording(method, calls):
    """`method`, recording the (src, valid, keyword arguments) of each call."""

    def spy(model, src, valid, **kw):
        calls.append((np.asarray(src), np.asarray(valid), kw))
        return method(model, src, valid, **kw)

    return spy


def test_sources_end_with_the_tokenizers_eos_which_the_mask_keeps(hf_run, capsys, monkeypatch):
    calls, greedy = [], decode.greedy
    monkeypatch.setattr(decode, "greedy", recording(greedy, calls))
    code, out, err = generate(
        capsys, monkeypatch, "--checkpoint", str(hf_run), stdin="\n".join(LINES)
    )
    assert code == 0 and err == ""
    assert out == library(hf_run, LINES, greedy, max_new_tokens=48)
    ((src, valid, kw),) = calls
    assert (kw["bos_id"], kw["eos_id"], kw["pad_id"]) == (EOT, EOT, EOT)
    for row, line in enumerate(LINES):
        n = len(line) + 1  # one id per character, then EOS (= pad, yet a real token)
        assert src[row, n - 1] == EOT and (src[row, n:] == EOT).all()
        assert valid[row].tolist() == [True] * n + [False] * (src.shape[1] - n)


def test_beam_search_gets_the_tokenizers_ids(hf_run, capsys, monkeypatch):
    calls, beam_search = [], decode.beam_search
    monkeypatch.setattr(decode, "beam_search", recording(beam_search, calls))
    args = ("--checkpoint", str(hf_run), "--input", LINES[1], "--beam", "2")
    code, out, _ = generate(capsys, monkeypatch, *args)
    assert code == 0
    assert out == library(hf_run, LINES[1:2], beam_search, beam_size=2, alpha=0.6)
    ((src, valid, kw),) = calls
    assert (kw["bos_id"], kw["eos_id"], kw["pad_id"]) == (EOT, EOT, EOT)
    assert src[0, len(LINES[1])] == EOT and valid[0].sum() == len(LINES[1]) + 1


@pytest.mark.parametrize(
    "args, stdin, match",
    [
        ([], "3 March 2001\n\n20010303\n", "input line 2 is empty"),
        (["--input", "x" * 48], None, "input line 1 has 49 tokens, more than the model's max_len=48"),
        (["--input", "1", "--temperature", "0"], None, "--temperature must be > 0"),
        (["--input", "1", "--top-p", "1.5"], None, r"--top-p must be in \(0, 1\]"),
        (["--input", "1", "--top-p", "0"], None, r"--top-p must be in \(0, 1\]"),
        (["--input", "1", "--beam", "0"], None, "--beam must be >= 1, got 0"),
        (["--input", "1", "--alpha", "-1"], None, r"--alpha must be >= 0, got -1.0$"),
        (["--input", "1", "--top-k", "0"], None, r"--top-k must be >= 1, got 0$"),
        (["--input", "1", "--batch-size", "0"], None, "--batch-size must be >= 1, got 0"),
        (["--input", "1", "--top-k", "two"], None, "argument --top-k: invalid int value: 'two'"),
        (["--input", "1", "--beam", "2", "--temperature", "1"], None, "not both"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(seq2seq_run, capsys, monkeypatch, args, stdin, match):
    code, out, err = generate(
        capsys, monkeypatch, "--checkpoint", str(seq2seq_run), *args, stdin=stdin
    )
    assert code == 2 and out == []
    assert len(err.splitlines()) == 1 and err.startswith("jaxformer generate: error: ")
    assert re.search(match, err), err


def test_bad_checkpoint_folders(seq2seq_run, tmp_path, capsys, monkeypatch):
    code, _, err = generate(capsys, monkeypatch, "--checkpoint", str(tmp_path / "nope"))
    assert code == 2 and "no such run folder" in err and len(err.splitlines()) == 1
    copy = tmp_path / "copy"
    shutil.copytree(seq2seq_run, copy)
    (copy / "config.json").write_text('{"model": {"d_model": 3')  # cut short
    code, out, err = generate(capsys, monkeypatch, "--checkpoint", str(copy), "--input", "1")
    assert code == 2 and out == [] and len(err.splitlines()) == 1
    assert re.match(rf"jaxformer generate: error: {copy}/config.json: not valid JSON", err)
    (copy / "tokenizer.json").write_text("{")
    code, _, err = generate(capsys, monkeypatch, "--checkpoint", str(copy), "--input", "1")
    assert code == 2 and "tokenizer.json is not a jaxformer tokenizer file" in err
    assert len(err.splitlines()) == 1
    (copy / "tokenizer.json").unlink()
    code, _, err = generate(capsys, monkeypatch, "--checkpoint", str(copy), "--input", "1")
    assert code == 2 and "no tokenizer" in err and len(err.splitlines()) == 1


def test_the_command_exits_2_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "jaxformer", "generate", "--checkpoint", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        env=dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "lab")]),
            JAX_PLATFORMS="cpu",
            XLA_FLAGS="",
        ),
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"jaxformer generate: error: {tmp_path / 'nope'}: no such run folder"
    ]


@pytest.mark.slow
def test_trained_on_dates_generate_prints_the_iso_dates(tmp_path, capsys, monkeypatch):
    """The issue's end-to-end check: train on dates, then translate held-out dates."""
    run = jf.RunConfig.from_options(
        task="dates", steps=1500, lr=3e-3, out=str(tmp_path), eval_examples=200
    )
    loop.train(jf.TransformerConfig.tiny(259), run, progress=False)
    capsys.readouterr()  # the training report
    pairs = tasks.dev_examples(tasks.get_task("dates"), seed=123, n=20)
    code, out, _ = generate(
        capsys,
        monkeypatch,
        "--checkpoint",
        str(tmp_path),
        "--beam",
        "4",
        stdin="\n".join(src for src, _ in pairs),
    )
    assert code == 0
    correct = sum(got == want for got, (_, want) in zip(out, pairs, strict=True))
    assert correct >= 19, list(zip(out, pairs, strict=True))


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_while_decoding_a_large_input_keeps_the_printed_outputs(seq2seq_run, name):
    """Outputs are printed a batch at a time; Ctrl-C, SIGTERM or SIGHUP mid-way exits 130,
    143 or 129 with one line saying how many were printed and where the rest starts, and
    those lines stay."""
    from tests.stopping import Started

    lines = [f"{d} March 2001" for d in range(1, 29)] * 100
    argv = ["generate", "--checkpoint", str(seq2seq_run), "--batch-size", "1"]
    run = Started(argv, stdin="\n".join(lines) + "\n")
    run.wait_for("out", r"")  # the first output (an untrained model: maybe empty)
    code, seconds = run.stop(getattr(signal, name))
    assert code == 128 + getattr(signal, name) and seconds < 10, run.err()
    printed = len(run.lines["out"])
    assert 1 <= printed < len(lines) and all(line.endswith("\n") for line in run.lines["out"])
    why = "interrupted" if name == "SIGINT" else f"terminated by {name}"
    said = f"jaxformer generate: {why} after {printed} of {len(lines)} outputs"
    assert run.err()[-1] == (
        f"{said} (printed); for the rest, give it stdin from line {printed + 1} on "
        f"(tail -n +{printed + 1})"
    )
    assert run.survivors() == []
