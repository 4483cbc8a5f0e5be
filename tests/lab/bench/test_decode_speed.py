"""jaxformer_lab.bench.decode_speed (`jaxformer bench decode`): a quick run through the command
writes its record, with the same tokens either way and paired speed-ups, and prints its
headline."""

import json

from jaxformer import cli
from jaxformer_lab.results import Record


def test_a_quick_decode_writes_its_record_and_prints_its_headline(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert cli.main(["bench", "decode", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    headline = json.loads(printed.out.splitlines()[-1])
    assert headline["record"] == str(out) and headline["at_new_tokens"] == 32
    assert "greedy 16 tokens" in printed.err  # progress on stderr
    record = Record.read(out)
    assert record.command == f"jaxformer bench decode --out {out} --quick"
    cases = record.data["cases"]
    assert [(c["method"], c["new_tokens"]) for c in cases] == [
        ("greedy", 16),
        ("greedy", 32),
        ("beam4", 16),
        ("beam4", 32),
    ]
    for c in cases:  # the same tokens either way; the speed-up from the paired rounds
        assert c["same_tokens"] and len(c["seconds"]["cached"]) == 6
        assert c["speedup"]["low"] <= c["speedup"]["median"] <= c["speedup"]["high"]
    assert "| greedy | 16 |" in record.markdown()
