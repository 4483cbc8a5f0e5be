"""LoRA on an imported GPT-2: adapters trained with `--init-from --lora-rank` leave the
imported weights as they were, and the export merges them into weights that transformers
loads with the adapted model's logits."""

import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import checkpoints
from jaxformer.nn import add_lora
from jaxformer.train import loop

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face tests need transformers (make test installs it)"
)
torch = pytest.importorskip("torch")
from jaxformer.interop import hf  # noqa: E402
from tests.interop.test_hf_training import RUN, _folder, _losses  # noqa: E402
from tests.train.test_lora import _randomised  # noqa: E402


def _hf_logits(folder, tokens) -> np.ndarray:
    model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


def test_a_merged_export_loads_in_transformers_with_the_adapted_logits(tmp_path):
    folder, tok = _folder(tmp_path, "gpt2")
    model = add_lora(hf.from_hf(folder), 4, alpha=8.0, targets="q,k,v,o,ff")
    _randomised(model)
    tokens = np.array([tok.encode("the cat sat on the mat")])
    adapted = np.asarray(model(tokens))
    assert np.abs(adapted - _hf_logits(folder, tokens)).max() > 1e-2  # the adapters matter
    exported = hf.to_hf(model, tmp_path / "exported", tokenizer=tok)
    np.testing.assert_allclose(_hf_logits(exported, tokens), adapted, rtol=0, atol=1e-4)
    assert nnx.state(model, nnx.LoRAParam)  # the export merged a copy


@pytest.mark.slow  # a fine-tuning run and an export, 20 s
def test_lora_fine_tunes_an_imported_gpt2_with_its_weights_frozen(tmp_path):
    folder, tok = _folder(tmp_path, "gpt2")
    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"the cat sat on the mat number {i}" for i in range(60)))
    out = tmp_path / "run"
    run = jf.RunConfig.from_options(
        data_text=str(text), init_from=str(folder), seq_len=32, steps=30, out=str(out),
        lora_rank=4, lora_targets="q,k,v,o,ff", **RUN | dict(lr=1e-2),
    )  # fmt: skip
    loop.train(jf.TransformerConfig.tiny(1), run, progress=False)
    losses = _losses(out)
    assert losses[-1] < 0.95 * losses[0], losses  # the adapters alone learn
    model, restored_tok = checkpoints.restore_model(out)
    base = hf.from_hf(folder)
    trained = dict(nnx.to_flat_state(nnx.state(model)))
    for path, value in nnx.to_flat_state(nnx.state(base)):  # the imported weights, unchanged
        np.testing.assert_array_equal(np.asarray(trained[path][...]), np.asarray(value[...]))
    tokens = np.array([tok.encode("the cat sat")])
    exported = hf.to_hf(model, tmp_path / "exported", tokenizer=restored_tok)
    np.testing.assert_allclose(_hf_logits(exported, tokens), np.asarray(model(tokens)), atol=1e-4)
