"""A Hugging Face folder (config.json, model.safetensors, tokenizer.json) fine-tunes with
`jaxformer train --init-from`, saves and restores, decodes with `jaxformer generate`, and
exports back to transformers."""

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import checkpoints
from jaxformer.cli import main
from jaxformer.train import loop
from tests import hf_tokenizers

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face tests need transformers (make test installs it)"
)
torch = pytest.importorskip("torch")
from jaxformer.interop import hf  # noqa: E402

RUN = dict(batch_size=8, eval_every=30, log_every=5, checkpoint_every=30, lr=3e-3, eval_examples=8)


def _folder(tmp_path, kind):
    """A Hugging Face model folder with random weights and a character-level tokenizer."""
    folder = tmp_path / kind
    if kind == "gpt2":
        tok = hf_tokenizers.gpt2_like(tmp_path)
        config = transformers.GPT2Config(
            vocab_size=tok.vocab_size,
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=4,
            bos_token_id=tok.eos_id,
            eos_token_id=tok.eos_id,
        )
        model = transformers.GPT2LMHeadModel(config)
    else:
        tok = hf_tokenizers.seq2seq(tmp_path, hf_tokenizers.PRINTABLE)
        config = transformers.MarianConfig(
            vocab_size=tok.vocab_size,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            pad_token_id=tok.pad_id,
            decoder_start_token_id=tok.bos_id,
            eos_token_id=tok.eos_id,
            scale_embedding=True,
        )
        model = transformers.MarianMTModel(config)
    torch.manual_seed(0)
    model.save_pretrained(folder)
    tok.save_hf(folder / "tokenizer.json")
    return folder, tok


def _losses(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.mark.slow  # a fine-tuning run, saved and exported: 15 s of CI's quick suite
def test_a_converted_gpt2_fine_tunes_saves_restores_and_exports(tmp_path):
    folder, tok = _folder(tmp_path, "gpt2")
    text = tmp_path / "text.txt"
    text.write_text(
        "\n".join(
            f"the {w} sat on the mat number {i}" for i, w in enumerate(["cat", "dog", "hen"] * 20)
        )
    )
    out = tmp_path / "run"
    run = jf.RunConfig.from_options(
        data_text=str(text), init_from=str(folder), seq_len=32, steps=30, out=str(out), **RUN
    )
    summary = loop.train(jf.TransformerConfig.tiny(1), run, progress=False)
    losses = _losses(out)
    assert losses[-1] < 0.8 * losses[0], losses
    assert summary["model_config"] == hf.from_hf(folder).config.to_dict()

    model, restored_tok = checkpoints.restore_model(out)
    assert (restored_tok.pad_id, restored_tok.bos_id, restored_tok.eos_id) == (
        tok.pad_id,
        tok.bos_id,
        tok.eos_id,
    )
    exported = hf.to_hf(model, tmp_path / "exported", tokenizer=restored_tok)
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(exported).eval()
    tokens = np.array([tok.encode("the cat sat")])
    with torch.no_grad():
        expected = hf_model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(tokens)), expected, rtol=0, atol=1e-5)
    again, again_tok = hf.load(exported)  # the exported folder carries the tokenizer too
    assert again_tok.encode("the mat") == tok.encode("the mat")
    for a, b in zip(
        jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # tens of seconds of cold compiling in CI; make test-all runs it
def test_a_converted_marian_fine_tunes_on_a_task_and_generates(tmp_path, capsys):
    folder, tok = _folder(tmp_path, "marian")
    out = tmp_path / "run"
    run = jf.RunConfig.from_options(
        task="dates", init_from=str(folder), steps=30, out=str(out), **RUN
    )
    loop.train(jf.TransformerConfig.tiny(1), run, progress=False)
    capsys.readouterr()  # the training report
    losses = _losses(out)
    assert losses[-1] < 0.8 * losses[0], losses
    for checkpoint_folder in (out, folder):  # a run folder, and the Hugging Face folder itself
        code = main(
            [
                "generate",
                "--checkpoint",
                str(checkpoint_folder),
                "--input",
                "3 March 2001",
                "--max-new-tokens",
                "12",
            ]
        )
        printed = capsys.readouterr().out.splitlines()
        assert code == 0 and len(printed) == 1
        assert set(printed[0]) <= set(hf_tokenizers.PRINTABLE), printed


def test_init_from_refuses_a_mismatch_with_the_data(tmp_path):
    folder, _ = _folder(tmp_path, "gpt2")
    run = jf.RunConfig.from_options(
        task="dates", init_from=str(folder), steps=2, out=str(tmp_path / "r"), **RUN
    )
    with pytest.raises(
        ValueError,
        match="holds a DecoderLM, which trains on text \\(data_text, or a ",
    ):
        loop.train(jf.TransformerConfig.tiny(1), run, progress=False)
    with pytest.raises(ValueError, match="init_from brings its tokenizer"):
        jf.RunConfig.from_options(data_text="x.txt", init_from=str(folder), tokenizer="bpe")
    shutil.copytree(folder, tmp_path / "no_tokenizer")
    (tmp_path / "no_tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer.json; jaxformer reads Hugging Face"):
        hf.load(tmp_path / "no_tokenizer")
