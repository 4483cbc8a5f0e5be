"""jaxformer bench shard-loader: the loader's tokens/s packed and unpacked, and how full
the rows are, on shards given (llm.c-style GPT-2 shards written here)."""

import json

import numpy as np

from jaxformer import cli
from tests.data.test_shards import gpt2_stream, llmc_shard


def test_the_record_holds_speed_and_fullness_of_both_modes(tmp_path, capsys):
    rng = np.random.default_rng(0)
    llmc_shard(tmp_path / "train_000000.bin", gpt2_stream(rng, rng.integers(1, 40, 200)))
    llmc_shard(tmp_path / "val_000000.bin", gpt2_stream(rng, rng.integers(1, 40, 20)))
    out = tmp_path / "loader.json"
    argv = ["bench", "shard-loader", "--shards", str(tmp_path / "train_*.bin")]
    argv += ["--val-shards", str(tmp_path / "val_*.bin"), "--seq-len", "32", "--batch", "4"]
    argv += [*"--batches 2 --rounds 2 --fullness-seq-lens 16 32 --no-web-lm".split()]
    assert cli.main([*argv, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    speed, full = record["data"]["speed"], record["data"]["fullness"]["shards"]
    assert speed["packed"]["median"] > 0 and speed["unpacked"]["median"] > 0
    assert speed["packed"]["real"] > speed["unpacked"]["real"]
    for seq_len in (16, 32):
        packed, unpacked = full[f"{seq_len} packed"], full[f"{seq_len} unpacked"]
        assert packed["rows"] < unpacked["rows"] and packed["real"] > unpacked["real"]
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["target"] == 1_000_000
    assert record["command"].startswith("jaxformer bench shard-loader --out")
    assert "--seq-len 32 --batch 4" in record["command"]


def test_shards_without_val_shards_is_one_line_exit_2(capsys):
    assert cli.main(["bench", "shard-loader", "--shards", "x/*.bin"]) == 2
    assert "--shards and --val-shards go together" in capsys.readouterr().err
