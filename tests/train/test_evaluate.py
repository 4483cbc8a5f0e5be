"""Held-out predictions (decode.generate) decode with the tokenizer's own special ids."""

import numpy as np
from flax import nnx

import jaxformer as jf
from jaxformer import decode
from tests import hf_tokenizers as hf


def test_predict_decodes_with_the_tokenizers_ids(tmp_path, monkeypatch):
    tok = hf.seq2seq(tmp_path)
    config = jf.TransformerConfig.tiny(tok.vocab_size, d_model=16, num_heads=2, d_ff=32)
    model = jf.Transformer(config, rngs=nnx.Rngs(0))
    calls, greedy = [], decode.greedy

    def spy(model, src, valid, **kw):
        calls.append((np.asarray(src), np.asarray(valid), kw))
        return greedy(model, src, valid, **kw)

    monkeypatch.setattr(decode, "greedy", spy)
    sources = ["abc", "hello"]
    assert len(decode.generate(model, tok, sources, batch_size=4)) == 2
    ((src, valid, kw),) = calls
    assert (kw["bos_id"], kw["eos_id"], kw["pad_id"]) == (tok.bos_id, tok.eos_id, tok.pad_id)
    for row, text in enumerate(sources):
        assert src[row, : len(text) + 1].tolist() == [*tok.encode(text), tok.eos_id]
        assert valid[row].sum() == len(text) + 1
    assert valid.shape[0] == 2  # one batch: no rows to fill
