"""HFTokenizer: a Hugging Face tokenizer.json with its own special ids, and the batches
the datasets build with them (the ids are the tokenizer's, the masks come from lengths)."""

import json

import pytest

from jaxformer import data
from jaxformer.data import tasks
from tests import hf_tokenizers as hf

pytest.importorskip("tokenizers", reason="the Hugging Face tokenizer needs 'tokenizers'")


def test_round_trip_without_special_tokens(tmp_path):
    tok = hf.seq2seq(tmp_path)
    n = len(hf.LOWER)
    assert (tok.kind, tok.vocab_size) == ("hf", n + 4)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (n + 1, n + 2, n + 3)
    ids = tok.encode("the cat 12+3")
    assert ids == [1 + hf.LOWER.index(c) for c in "the cat 12+3"]  # no <s> ... </s> added
    assert tok.decode(ids) == "the cat 12+3"
    # Up to the first EOS; BOS and PAD dropped wherever they are.
    assert tok.decode([tok.bos_id, *ids[:3], tok.pad_id, *ids[3:], tok.eos_id, 5]) == (
        "the cat 12+3"
    )
    assert tok.token_strings([tok.bos_id, ids[0], tok.eos_id]) == ["<s>", "t", "</s>"]
    with pytest.raises(ValueError, match=rf"ids\[1\] = {n + 4} is outside the vocabulary"):
        tok.decode([3, n + 4])


def test_pad_may_equal_eos(tmp_path):
    tok = hf.gpt2_like(tmp_path)
    eot = len(hf.LOWER) + 1
    assert tok.pad_id == tok.bos_id == tok.eos_id == eot == tok.vocab_size - 1
    assert tok.decode([*tok.encode("ab"), eot, *tok.encode("cd")]) == "ab"
    assert tok.decode([eot, *tok.encode("ab")]) == ""  # the first EOS ends the text


def test_save_and_load(tmp_path):
    tok = hf.seq2seq(tmp_path)
    tok.save(tmp_path)
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["jaxformer_tokenizer"] == "hf"
    assert (saved["bos_id"], saved["eos_id"], saved["pad_id"]) == (
        tok.bos_id,
        tok.eos_id,
        tok.pad_id,
    )
    again = data.load_tokenizer(tmp_path)
    assert type(again) is data.HFTokenizer
    assert (again.bos_id, again.eos_id, again.pad_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    assert again.encode("a dog") == tok.encode("a dog") and again.vocab_size == tok.vocab_size
    assert again.decode(tok.encode("a dog") + [tok.eos_id]) == "a dog"


def test_bad_ids_and_files(tmp_path):
    path = hf.char_level(tmp_path / "t.json", "abc", ["<eos>"])  # 5 ids
    ok = dict(pad_id=4, bos_id=4, eos_id=4)
    for name, value in (("pad_id", 5), ("bos_id", -1), ("eos_id", 99)):
        match = rf"{name}={value} is outside the tokenizer's vocabulary \[0, 5\)"
        with pytest.raises(ValueError, match=match):
            data.HFTokenizer.from_file(path, **ok | {name: value})
    with pytest.raises(TypeError, match="bos_id must be an int, got '4'"):
        data.HFTokenizer.from_file(path, **ok | {"bos_id": "4"})
    with pytest.raises(TypeError, match="tokenizer must be a Tokenizer, got dict"):
        data.HFTokenizer({}, **ok)
    for name, content in (("other.json", b'{"model": 1}'), ("binary.json", b"\xff\xfe\x00")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=rf"{name} is not a Hugging Face tokenizer file"):
            data.HFTokenizer.from_file(tmp_path / name, **ok)
    with pytest.raises(FileNotFoundError, match="missing.json: no such file"):
        data.HFTokenizer.from_file(tmp_path / "missing.json", **ok)


def test_saved_file_without_its_ids_is_refused(tmp_path):
    tok = hf.seq2seq(tmp_path)
    tok.save(tmp_path)
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    del saved["pad_id"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"a saved 'hf' tokenizer lacks the keys \['pad_id'\]"):
        data.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved | {"pad_id": 0, "tokenizer": 3}))
    with pytest.raises(ValueError, match="tokenizer.json is not a Hugging Face tokenizer file"):
        data.load_tokenizer(tmp_path)


# --- batches with the tokenizer's ids -------------------------------------------------------


def expected_row(ids, width, pad):
    return ids + [pad] * (width - len(ids)), [True] * len(ids) + [False] * (width - len(ids))


@pytest.mark.parametrize("make", [hf.seq2seq, hf.gpt2_like])
def test_task_batches_use_the_tokenizer_ids_and_mask_by_length(tmp_path, make):
    tok = make(tmp_path)
    d = data.TaskData("addition", tok)
    b = d.train_batch(0, 4)
    pairs = tasks.train_examples(d.task, d.seed, 0, 4)
    for i, (src, tgt) in enumerate(pairs):
        s, t = tok.encode(src), tok.encode(tgt)
        want_src, want_src_valid = expected_row([*s, tok.eos_id], d.src_len, tok.pad_id)
        want_out, want_tgt_valid = expected_row([*t, tok.eos_id], d.tgt_len, tok.pad_id)
        want_in, _ = expected_row([tok.bos_id, *t], d.tgt_len, tok.pad_id)
        assert b["src"][i].tolist() == want_src
        assert b["src_valid"][i].tolist() == want_src_valid  # the EOS is real, even = pad
        assert b["tgt_in"][i].tolist() == want_in
        assert b["tgt_out"][i].tolist() == want_out
        assert b["tgt_valid"][i].tolist() == want_tgt_valid
    filler = data.encode_pairs([None], tok, 4, 4)
    assert (filler["src"] == tok.pad_id).all() and not filler["src_valid"].any()


def test_tsv_batches_end_sources_with_the_tokenizer_eos(tmp_path):
    tok = hf.gpt2_like(tmp_path)
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"source {i}\ttarget {i}+1\n" for i in range(100)))
    b = data.TsvData(path, tok, max_len=32).train_batch(0, 8)
    for src, valid, tgt_in in zip(b["src"], b["src_valid"], b["tgt_in"], strict=True):
        n = int(valid.sum())
        assert valid[:n].all()  # a prefix, its last token the EOS
        assert src[n - 1] == tok.eos_id and (src[n:] == tok.pad_id).all()
        assert tok.decode(src[: n - 1]).startswith("source ") and tgt_in[0] == tok.bos_id


def test_text_documents_end_with_the_tokenizer_eos(tmp_path):
    tok = hf.seq2seq(tmp_path)
    path = tmp_path / "t.txt"
    path.write_text("\n\n".join(f"doc {i} " + "x" * (i % 5) for i in range(30)))
    d = data.TextData(path, tok, seq_len=16)
    b = d.train_batch(0, 4)
    seg, tokens = b["segment_ids"], b["tgt_in"]
    ends = (seg[:, :-1] != seg[:, 1:]) & (seg[:, 1:] > 0)  # t: the last token of a document
    assert ends.any() and (tokens[:, :-1][ends] == tok.eos_id).all()
    assert b["tgt_valid"][:, :-1][(seg[:, :-1] == seg[:, 1:]) & (tokens[:, 1:] == tok.eos_id)].all()
    last = list(d.eval_batches(4))[-1]  # its rows beyond the text are filler
    assert (last["tgt_in"][last["segment_ids"] == 0] == tok.pad_id).all()
    assert (last["segment_ids"] == 0).any()
