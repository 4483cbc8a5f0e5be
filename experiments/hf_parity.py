"""How closely models converted from Hugging Face transformers reproduce them, float32 on CPU.

    python experiments/hf_parity.py [--out results] [--quick]

For each configuration, a transformers model is built from a config with random weights
(no download; biases and norms drawn at random too, since their initial 0 and 1 would hide
a misplaced one), converted with `jaxformer.interop.hf.from_hf`, and both run on the same
padded batch (3 rows, source 9 and target 7 tokens, some rows padded). Reported: the max
absolute logit difference over the real target positions, the largest logit, and whether
20 greedy tokens equal `generate(do_sample=False, num_beams=1)` with no early stop (from
the prompts for GPT-2, from the decoder start token for Marian and BART). The last rows
are GPT-2 small (124M parameters) and an OPUS-MT-sized Marian (6+6 layers, d_model 512,
58,101 tokens), skipped with --quick. Writes results/hf_parity.{json,md}; the last line
printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers as tf

from jaxformer import decode
from jaxformer.interop.hf import from_hf
from jaxformer.markdown import table
from jaxformer.models import DecoderLM

GPT2 = (tf.GPT2LMHeadModel, tf.GPT2Config)
MARIAN = (tf.MarianMTModel, tf.MarianConfig)
BART = (tf.BartForConditionalGeneration, tf.BartConfig)
# The small models' settings; each configuration below is (model kind, config settings).
TINY_GPT2 = dict(
    vocab_size=101, n_positions=64, n_layer=2, initializer_range=0.2, bos_token_id=0, eos_token_id=0
)
UNTIED_GPT2 = TINY_GPT2 | dict(
    n_embd=24, n_head=2, n_inner=48, activation_function="relu", tie_word_embeddings=False
)
SEQ2SEQ = dict(
    vocab_size=101,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    init_std=0.2,
)
TINY_MARIAN = SEQ2SEQ | dict(pad_token_id=100, decoder_start_token_id=100, eos_token_id=0)
SMALL = {
    "GPT-2, 2 layers, d 32": (GPT2, TINY_GPT2 | dict(n_embd=32, n_head=4)),
    "GPT-2 untied, relu, d_ff 48": (GPT2, UNTIED_GPT2),
    "Marian, gelu": (MARIAN, TINY_MARIAN),
    "Marian, swish, scaled embeddings": (
        MARIAN,
        TINY_MARIAN | dict(activation_function="swish", scale_embedding=True),
    ),
    "BART": (BART, SEQ2SEQ),
}
OPUS_MT = dict(
    vocab_size=58101,
    decoder_vocab_size=58101,
    d_model=512,
    encoder_ffn_dim=2048,
    decoder_ffn_dim=2048,
    encoder_attention_heads=8,
    decoder_attention_heads=8,
    activation_function="swish",
    scale_embedding=True,
    pad_token_id=58100,
    decoder_start_token_id=58100,
    eos_token_id=0,
    max_position_embeddings=512,
)
LARGE = {
    "GPT-2 small (12 layers, d 768, 124M)": (GPT2, {}),
    "Marian, OPUS-MT size (6+6, d 512)": (MARIAN, OPUS_MT),
}


def randomise(hf):
    """Biases, norms and the logits bias drawn at random, as the tests do."""
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1:
                p.add_(0.05 * torch.randn_like(p))
        if hasattr(hf, "final_logits_bias"):
            hf.final_logits_bias.normal_(std=0.1)
    return hf.eval()


def case(kind: tuple, settings: dict) -> dict:
    """Build the transformers model `kind` (model class, config class) with `settings`,
    convert it, and compare logits and 20 greedy tokens."""
    model_class, config_class = kind
    torch.manual_seed(0)
    hf = randomise(model_class(config_class(**settings)))
    model = from_hf(hf)
    V = hf.config.vocab_size
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(3, V - 1, (3, 9)), rng.integers(3, V - 1, (3, 7))
    src_valid = np.arange(9) < np.array([[9], [5], [2]])
    tgt_valid = np.arange(7) < np.array([[7], [3], [6]])
    t = lambda a: torch.tensor(np.asarray(a)).long()  # noqa: E731
    lm = isinstance(model, DecoderLM)
    greedy = dict(max_new_tokens=20, do_sample=False, num_beams=1, eos_token_id=None)
    with torch.no_grad():
        if lm:
            expected = hf(t(tgt), attention_mask=t(tgt_valid)).logits.numpy()
            got = model(jnp.asarray(tgt), jnp.asarray(tgt_valid))
            hf_tokens = hf.generate(
                t(tgt), attention_mask=torch.ones(3, 7).long(), pad_token_id=0, **greedy
            )[:, 7:]
            tokens = decode.greedy(model, jnp.asarray(tgt), max_new_tokens=20, eos_id=None)
        else:
            expected = hf(
                input_ids=t(src),
                attention_mask=t(src_valid),
                decoder_input_ids=t(tgt),
                decoder_attention_mask=t(tgt_valid),
            ).logits.numpy()
            got = model(*map(jnp.asarray, (src, tgt, src_valid, tgt_valid)))
            hf_tokens = hf.generate(
                t(src), attention_mask=t(src_valid), forced_eos_token_id=None, **greedy
            )[:, 1:]
            tokens = decode.greedy(
                model,
                jnp.asarray(src),
                jnp.asarray(src_valid),
                max_new_tokens=20,
                bos_id=hf.config.decoder_start_token_id,
                eos_id=None,
            )
    diff = np.abs(np.asarray(got) - expected)[tgt_valid]
    return dict(
        logits_max_abs_diff=float(diff.max()),
        logits_max_abs=float(np.abs(expected).max()),
        greedy_20_equal=bool((np.asarray(tokens) == hf_tokens.numpy()).all()),
        parameters=sum(p.numel() for p in hf.parameters()),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results")
    parser.add_argument("--quick", action="store_true", help="the small configurations only")
    args = parser.parse_args()
    runs = SMALL | ({} if args.quick else LARGE)
    rows, start = [], time.perf_counter()
    print(f"{'configuration':<40} {'params':>11} {'max |diff|':>10} {'max |logit|':>11} greedy x20")
    for name, (kind, settings) in runs.items():
        r = dict(config=name, **case(kind, settings))
        rows.append(r)
        greedy = "equal" if r["greedy_20_equal"] else "DIFFERENT"
        print(
            f"{name:<40} {r['parameters']:>11,} {r['logits_max_abs_diff']:>10.1e} "
            f"{r['logits_max_abs']:>11.2f} {greedy}"
        )
    summary = dict(
        cases=len(rows),
        logits_max_abs_diff=max(r["logits_max_abs_diff"] for r in rows),
        all_greedy_equal=all(r["greedy_20_equal"] for r in rows),
        transformers=tf.__version__,
        torch=torch.__version__,
        jax=jax.__version__,
        seconds=round(time.perf_counter() - start, 1),
    )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_parity.json").write_text(json.dumps(dict(summary=summary, rows=rows), indent=2))
    cells = [
        [
            r["config"],
            f"{r['parameters']:,}",
            f"{r['logits_max_abs_diff']:.1e}",
            f"{r['logits_max_abs']:.2f}",
            "equal" if r["greedy_20_equal"] else "different",
        ]
        for r in rows
    ]
    columns = ["configuration", "parameters", "max abs logit diff", "max abs logit"]
    columns += ["greedy 20 tokens"]
    lines = ["# Hugging Face parity (float32, CPU)", "", *table(columns, cells, "lrrrl")]
    (out / "hf_parity.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
