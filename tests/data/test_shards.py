"""Token shards (`jaxformer.data.shards`) and `jaxformer prepare`: the reader against files
written byte by byte the way llm.c's and modded-nanogpt's scripts write them, prepare's
round trip, batches a pure function of (seed, step), a process's own rows, and every bad
shard refused in one line naming the file, with no run folder left."""

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from jaxformer.cli import main
from jaxformer.data import load_tokenizer, shards
from jaxformer.data.datasets import held_out, text_documents
from jaxformer.data.tokenizers import IdsTokenizer
from jaxformer.train.config import RunConfig
from jaxformer.train.setup import build_data
from tests.train.test_loop import cli_env, config_file

GPT2_EOT = 50256


def llmc_shard(path, tokens, magic=20240520, version=1, count=None, dtype="<u2"):
    """A shard as llm.c's write_datafile writes it: 256 int32 (magic, version, token
    count, zeros), then the tokens."""
    header = np.zeros(256, "<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    pathlib.Path(path).write_bytes(header.tobytes() + np.asarray(tokens, dtype).tobytes())
    return path


def gpt2_stream(rng, documents):
    """GPT-2-like ids, each document after an end-of-text token, as their scripts write."""
    return np.concatenate([[GPT2_EOT, *rng.integers(0, GPT2_EOT, int(n))] for n in documents])


def test_the_reader_takes_a_hand_written_llmc_shard(tmp_path):
    tokens = [GPT2_EOT, 11, 12, 13, GPT2_EOT, 50000, 7]
    read = shards.read_shard(llmc_shard(tmp_path / "a.bin", tokens))
    assert isinstance(read, np.memmap) and read.dtype == np.uint16
    np.testing.assert_array_equal(read, tokens)
    wide = llmc_shard(tmp_path / "b.bin", [1, 70000, 2], 20240801, 7, dtype="<u4")
    np.testing.assert_array_equal(shards.read_shard(wide), [1, 70000, 2])


def test_documents_run_from_each_end_of_text_through_the_next(tmp_path):
    llmc_shard(tmp_path / "a_0.bin", [5, 6, GPT2_EOT, 1, 2, 3, GPT2_EOT, 9])
    llmc_shard(tmp_path / "a_1.bin", [GPT2_EOT, 4, GPT2_EOT])
    found = shards.TokenShards(str(tmp_path / "a_*.bin"), "data_shards", 50257, GPT2_EOT)
    assert found.tokens == 11
    # a shard's start begins a document too; each ends at (and holds) the next EOT
    np.testing.assert_array_equal(found.starts, [0, 2, 6, 8, 10])
    np.testing.assert_array_equal(found.lengths, [3, 5, 2, 3, 1])
    np.testing.assert_array_equal(found.read(np.array([9, 0, 8, 7])), [4, 5, GPT2_EOT, 9])


def test_write_shard_round_trip_and_no_partial_file_on_a_crash(tmp_path, monkeypatch):
    shards.write_shard(tmp_path / "s.bin", [3, 1, 2], vocab_size=100)
    assert (tmp_path / "s.bin").stat().st_size == 1024 + 3 * 2
    np.testing.assert_array_equal(shards.read_shard(tmp_path / "s.bin"), [3, 1, 2])
    shards.write_shard(tmp_path / "w.bin", [70000], vocab_size=70001)  # uint32, llm.c's v7
    assert np.fromfile(tmp_path / "w.bin", "<i4", count=3).tolist() == [20240801, 7, 1]

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(shards.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        shards.write_shard(tmp_path / "t.bin", [1, 2], vocab_size=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.bin", "w.bin"]


def test_prepare_round_trip(tmp_path, capsys):
    rng = np.random.default_rng(0)
    words = "in the beginning god created heaven and earth light darkness".split()
    paragraphs = [" ".join(rng.choice(words, int(rng.integers(3, 40)))) for _ in range(300)]
    text = tmp_path / "book.txt"
    text.write_text("\n\n".join(paragraphs) + "\n")
    out = tmp_path / "data"
    assert (
        main(["prepare", str(text), "--out", str(out), "--shard-tokens", "1000", "--no-progress"])
        == 0
    )
    tokenizer = load_tokenizer(out)
    eot = tokenizer.eos_id
    train, val = held_out(text_documents(text.read_text().splitlines()))
    for split, docs in (("train", train), ("val", val)):
        paths = sorted(out.glob(f"{split}_*.bin"))
        tokens = [shards.read_shard(p) for p in paths]
        assert all(len(t) <= 1000 and t[0] == eot and t[-1] == eot for t in tokens)
        stream = np.concatenate([t[:-1] for t in tokens]).tolist()  # without shard-end EOTs
        starts = [i for i, t in enumerate(stream) if t == eot] + [len(stream)]
        decoded = [
            tokenizer.decode(stream[a + 1 : b])
            for a, b in zip(starts[:-1], starts[1:], strict=True)
        ]
        assert decoded == docs
    assert len(list(out.glob("train_*.bin"))) > 1
    assert "train: 27" in capsys.readouterr().out  # 270-odd of 300 documents train


def test_prepare_imports_no_lab_no_scipy_no_training(tmp_path):
    (tmp_path / "t.txt").write_text("one two three\n\nfour five six\n\nseven eight\n")
    code = (
        "import sys; from jaxformer.cli import main; "
        f"main(['prepare', {str(tmp_path / 't.txt')!r}, '--out', {str(tmp_path / 'o')!r}, "
        "'--no-progress']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scipy', 'jaxformer_lab') "
        "or m.startswith('jaxformer.train')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    plugin = "['jaxformer_lab', 'jaxformer_lab.plugin']"  # the lab's commands, by name
    assert done.stdout.strip().splitlines()[-1] in ("[]", plugin)


@pytest.fixture(scope="module")
def gpt2_shards(tmp_path_factory):
    """llm.c-style shards of GPT-2 ids with no tokenizer beside them."""
    folder = tmp_path_factory.mktemp("gpt2")
    rng = np.random.default_rng(0)
    for i in range(2):
        llmc_shard(folder / f"fineweb_train_{i:06d}.bin", gpt2_stream(rng, rng.integers(1, 60, 40)))
    llmc_shard(folder / "fineweb_val_000000.bin", gpt2_stream(rng, rng.integers(1, 60, 20)))
    return folder


def shard_run(folder, **options):
    given = dict(
        data_shards=str(folder / "*train_*.bin"), val_shards=str(folder / "*val_*.bin"), seq_len=32
    )
    return RunConfig.from_options(**(given | options))


def test_gpt2_shards_without_a_tokenizer_take_the_vocab_size_and_gpt2s_eot(gpt2_shards, tmp_path):
    tokenizer, data = build_data(shard_run(gpt2_shards), vocab_size=50257)
    assert isinstance(tokenizer, IdsTokenizer) and tokenizer.eos_id == GPT2_EOT
    tokenizer.save(tmp_path)  # what a run saves for generate, which then refuses text
    again = load_tokenizer(tmp_path)
    assert (again.vocab_size, again.eos_id, again.decode([5, 7, GPT2_EOT, 9])) == (
        50257,
        GPT2_EOT,
        "5 7",
    )
    with pytest.raises(ValueError, match="trained on token ids with no tokenizer"):
        again.encode("text")
    batch = data.train_batch(0, 4)
    assert batch["tgt_in"].shape == (4, 32) and batch["tgt_in"].max() < 50257
    starts = batch["tgt_in"][batch["positions"] == 0]
    assert (starts[batch["segment_ids"][batch["positions"] == 0] > 0] == GPT2_EOT).mean() > 0.5
    assert data.counts["train_tokens"] == sum(
        len(shards.read_shard(p)) for p in gpt2_shards.glob("*train*")
    )


def test_batches_are_a_pure_function_of_seed_and_step(gpt2_shards):
    def batches(seed, steps=(0, 3, 11, 40)):
        _, data = build_data(shard_run(gpt2_shards, seed=seed), vocab_size=50257)
        return [data.train_batch(i, 4) for i in steps], data

    (first, data), (again, _) = batches(0), batches(0)
    for x, y in zip(first, again, strict=True):
        assert x.keys() == y.keys() and all((x[k] == y[k]).all() for k in x)
    resumed = data.reseeded(0)
    assert all((resumed.train_batch(11, 4)[k] == first[2][k]).all() for k in first[2])
    other, _ = batches(1)
    assert any((x["tgt_in"] != y["tgt_in"]).any() for x, y in zip(first, other, strict=True))
    epoch = data.batches_per_epoch(4)  # an epoch visits distinct rows
    seen = [tuple(row) for i in range(epoch) for row in data.train_batch(i, 4)["tgt_in"]]
    every = data._train.batch(np.arange(data._train.rows), data.tokenizer.pad_id)["tgt_in"]
    assert len(set(seen)) == len(seen) == 4 * epoch and set(seen) <= set(map(tuple, every))


def test_a_process_fills_only_its_own_rows(gpt2_shards):
    _, data = build_data(shard_run(gpt2_shards), vocab_size=50257)
    whole, own = data.train_batch(5, 8), data.for_process([2, 3]).train_batch(5, 8)
    for key in whole:
        np.testing.assert_array_equal(own[key][2:4], whole[key][2:4])
    assert not own["tgt_valid"][:2].any() and not own["tgt_valid"][4:].any()


def test_unpacked_shards_give_one_piece_a_row(gpt2_shards):
    _, packed = build_data(shard_run(gpt2_shards), vocab_size=50257)
    _, unpacked = build_data(shard_run(gpt2_shards, pack=False), vocab_size=50257)
    assert "segment_ids" not in unpacked.train_batch(0, 4)
    assert packed._train.efficiency > unpacked._train.efficiency
    assert packed._train.tokens == unpacked._train.tokens


def _train(capsys, *argv):
    """`jaxformer train ARGV` in this process: (exit code, stderr lines)."""
    try:
        code = main(["train", *map(str, argv), "--no-progress"])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


def _bad_shards(tmp_path):
    rng = np.random.default_rng(0)
    good = gpt2_stream(rng, [20, 30, 10])
    llmc_shard(tmp_path / "val_000000.bin", good)
    cases = {
        "good": llmc_shard(tmp_path / "train_000000.bin", good),
        "magic": llmc_shard(tmp_path / "magic.bin", good, magic=1234),
        "version": llmc_shard(tmp_path / "version.bin", good, version=2),
        "truncated": llmc_shard(tmp_path / "truncated.bin", good, count=len(good) + 5),
        "vocab": llmc_shard(tmp_path / "vocab.bin", [*good[:7], 60000, *good[7:]]),
        "short": tmp_path / "short.bin",
    }
    cases["short"].write_bytes(b"\x00" * 100)
    return cases


BAD = [
    ("magic", "magic.bin: not a token shard: magic number 1234, expected 20240520"),
    ("version", "version.bin: version 2 of magic number 20240520, expected 1"),
    ("truncated", r"truncated.bin: its header says 68 tokens \(1,160 bytes\) but the file has 1,150"),
    ("vocab", r"vocab.bin: token id 60000 at offset 7 \(tokens after the header\) is outside the vocabulary \[0, 50257\)"),
    ("short", "short.bin: 100 bytes, shorter than a token shard's 1024-byte header"),
    ("none", r"--data-shards '[^']*nothing_\*.bin' matches no file"),
    ("no val", "--data-shards needs --val-shards, a glob of held-out shards"),
    ("val missing", r"--val-shards '[^']*nope_\*.bin' matches no file"),
    ("no vocab", r"the vocabulary is the model's --vocab-size \(259\) and the end-of-text id --eot-id \(50256"),
]  # fmt: skip


@pytest.mark.parametrize("case, match", BAD, ids=[case for case, _ in BAD])
def test_bad_shards_are_one_line_naming_the_file_and_leave_no_run_folder(
    tmp_path, capsys, case, match
):
    cases = _bad_shards(tmp_path)
    train = {"none": tmp_path / "nothing_*.bin"}.get(case, cases.get(case, cases["good"]))
    val = {"no val": None, "val missing": tmp_path / "nope_*.bin"}.get(case, tmp_path / "val_*.bin")
    argv = ["--data-shards", train, *(["--val-shards", val] if val else [])]
    argv += [] if case == "no vocab" else ["--vocab-size", "50257"]
    out = tmp_path / "run"
    code, lines = _train(capsys, *argv, "--config", config_file(tmp_path), "--out", out)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("jaxformer train: error:") and re.search(match, lines[0]), lines
    assert not out.exists()


@pytest.mark.slow  # three short runs, each compiling its steps: about 20 s on 2 cores
def test_a_short_run_on_shards_and_its_resume_see_the_same_batches(gpt2_shards, tmp_path, capsys):
    """`jaxformer train --data-shards` end to end; 2 steps resumed to 4 give the losses of
    4 straight, bit for bit."""
    argv = [
        *("--data-shards", gpt2_shards / "*train_*.bin", "--val-shards", gpt2_shards / "*val*"),
        *"--vocab-size 50257 --seq-len 32 --batch-size 4 --schedule constant --log-every 1".split(),
        *"--eval-every 2 --checkpoint-every 2 --eval-examples 8".split(),
        *("--config", config_file(tmp_path, d_model=16, d_ff=32)),
    ]

    def losses(out):
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if "loss" in r]

    assert _train(capsys, *argv, "--steps", "4", "--out", tmp_path / "straight")[0] == 0
    assert _train(capsys, *argv, "--steps", "2", "--out", tmp_path / "split")[0] == 0
    code, _ = _train(capsys, *argv, "--steps", "4", "--out", tmp_path / "split", "--resume")
    assert code == 0 and len(losses(tmp_path / "straight")) == 4
    assert losses(tmp_path / "split") == losses(tmp_path / "straight")
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["model_config"]["vocab_size"] == 50257 and summary["data_counts"]["val_rows"] > 0
    assert json.loads((tmp_path / "straight" / "tokenizer.json").read_text())["eos_id"] == GPT2_EOT


def test_prepare_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("a b c\n\nd e f\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "train_000000.bin").write_bytes(b"")
    cases = [
        ([str(tmp_path / "nope.txt")], "nope.txt: no such file"),
        ([str(tmp_path / "t.txt"), "--shard-tokens", "0"], "--shard-tokens must be >= 1"),
        ([str(tmp_path / "t.txt"), "--out", str(tmp_path / "full")], "already holds shards"),
    ]
    for argv, match in cases:
        out = [] if "--out" in argv else ["--out", str(tmp_path / "o")]
        assert main(["prepare", *argv, *out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("jaxformer prepare: error:") and match in err[0]
    assert not (tmp_path / "o").exists()


def test_prepare_takes_a_hugging_face_tokenizer_json_and_its_end_of_text_id(tmp_path, capsys):
    from tests.hf_tokenizers import LOWER, char_level

    path = char_level(tmp_path / "hf.json", LOWER, ["<|endoftext|>"])
    eot = json.loads(path.read_text())["added_tokens"][-1]["id"]
    (tmp_path / "t.txt").write_text("abc def\n\nghi jkl\n\nmno\n")
    argv = ["prepare", str(tmp_path / "t.txt"), "--tokenizer", str(path), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "no-id")]) == 2  # a HF file names no EOS
    assert "hf.json is not a jaxformer tokenizer file" in capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "o"), "--eot-id", str(eot)]) == 0
    tokenizer = load_tokenizer(tmp_path / "o")
    assert tokenizer.eos_id == eot and tokenizer.encode("abc") == [1, 2, 3]
    assert shards.read_shard(sorted((tmp_path / "o").glob("train_*"))[0])[0] == eot


@pytest.mark.slow  # two processes and one, each compiling from scratch: about 90 s
def test_two_processes_reading_their_own_rows_train_like_one_process(tmp_path):
    """Each of two processes fills only the rows its devices hold (the others padding,
    unread): the run's losses are those of one process with the same four devices."""
    from tests.parallel.test_multihost import env, free_port, losses

    rng = np.random.default_rng(0)
    for split, n in (("train", 120), ("val", 20)):
        stream = np.concatenate(
            [[299, *rng.integers(0, 299, int(k))] for k in rng.integers(2, 50, n)]
        )
        llmc_shard(tmp_path / f"{split}_000000.bin", stream)
    argv = [
        *("-m", "jaxformer", "train", "--data-shards", str(tmp_path / "train_*.bin")),
        *("--val-shards", str(tmp_path / "val_*.bin"), "--config", config_file(tmp_path)),
        *"--vocab-size 300 --eot-id 299 --seq-len 32 --steps 4 --batch-size 8 --log-every 1".split(),
        *"--eval-every 4 --checkpoint-every 4 --eval-examples 8 --no-progress".split(),
        *("--mesh", "data=2,fsdp=2"),
    ]
    coordinator = f"127.0.0.1:{free_port()}"
    two = [
        subprocess.Popen(
            [sys.executable, *argv, "--out", str(tmp_path / "two"), "--coordinator", coordinator]
            + ["--num-processes", "2", "--process-id", str(i), "--coordinator-timeout", "60"],
            env=env(2),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    one = subprocess.run(
        [sys.executable, *argv, "--out", str(tmp_path / "one")],
        env=env(4),
        capture_output=True,
        text=True,
        timeout=600,
    )
    outputs = []
    for p in two:
        try:
            outputs.append(p.communicate(timeout=600)[0])
        finally:
            p.kill()
    assert one.returncode == 0, one.stderr[-3000:]
    assert [p.returncode for p in two] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert len(losses(tmp_path / "one")) == 4
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
