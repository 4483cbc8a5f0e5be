"""The base model of the LoRA result (docs/results/research.md, "LoRA against full
fine-tuning"): a GPT-2-shaped model built by transformers from a config (random weights,
nothing downloaded) with a character-level tokenizer.json, written as a Hugging Face
folder that `configs/sweeps/lora_vs_full.yaml` imports with init_from:

    PYTHONPATH=$PWD:$PWD/lab python experiments/lora_base.py runs/lora/gpt2-base
"""

import string
import sys

import tokenizers
import torch
import transformers

ALPHABET = string.printable[:95]  # letters, digits, punctuation and the space


def main(folder: str) -> None:
    vocab = {"[UNK]": 0} | {c: i + 1 for i, c in enumerate(ALPHABET)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), "isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens(["<|endoftext|>"])
    eot = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=128, n_embd=128, n_layer=2, n_head=4,
        bos_token_id=eot, eos_token_id=eot,
    )  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save(f"{folder}/tokenizer.json")
    print(
        f"{folder}: GPT-2 of {config.n_layer} layers, d {config.n_embd}, vocab {config.vocab_size}"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/lora/gpt2-base")
