"""Small real Hugging Face tokenizers (the `tokenizers` package), written to a
`tokenizer.json` with `Tokenizer.save` as a converted checkpoint's would be, with special
ids that are not jaxformer's 0, 1, 2."""

import pathlib
import string

import pytest

from jaxformer import data

LOWER = string.ascii_lowercase + string.digits + " +"
PRINTABLE = string.ascii_letters + string.digits + " ,-/+."


def char_level(path: pathlib.Path, alphabet: str, specials: list[str]) -> pathlib.Path:
    """A character-level WordLevel tokenizer.json: [UNK] = 0, the characters of `alphabet`
    at 1, 2, ..., then `specials` after them."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0} | {c: i + 1 for i, c in enumerate(alphabet)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), "isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens(specials)
    if "<s>" in specials:  # as BART's and Marian's do, so that `encode` must turn it off
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single="<s> $A </s>",
            special_tokens=[(s, tok.token_to_id(s)) for s in ("<s>", "</s>")],
        )
    tok.save(str(path))
    return path


def seq2seq(folder: pathlib.Path, alphabet: str = LOWER) -> data.HFTokenizer:
    """Three distinct specials at the end of the vocabulary: <s> (bos), </s> (eos), <pad>."""
    path = char_level(folder / "seq2seq.json", alphabet, ["<s>", "</s>", "<pad>"])
    n = len(alphabet)
    return data.HFTokenizer.from_file(path, bos_id=n + 1, eos_id=n + 2, pad_id=n + 3)


def gpt2_like(folder: pathlib.Path, alphabet: str = LOWER) -> data.HFTokenizer:
    """One <|endoftext|> for bos, eos and pad, as GPT-2 is used."""
    path = char_level(folder / "gpt2.json", alphabet, ["<|endoftext|>"])
    n = len(alphabet) + 1
    return data.HFTokenizer.from_file(path, bos_id=n, eos_id=n, pad_id=n)
