"""`jaxformer prepare TEXT... --out DIR`: text files into token shards (`jaxformer.data.
shards`) for `jaxformer train --data-shards 'DIR/train_*.bin' --val-shards 'DIR/val_*.bin'`.

Each file's documents are its blank-line paragraphs (or its lines, in a text without blank
lines), one in ten held out by a hash of its text: `--data-text`'s rule, so the same text
trains on the same documents either way. The tokenizer is BPE learned from the training
documents, or a tokenizer.json given; DIR gets it, then train_000000.bin, ... and
val_000000.bin, ...: each document after an end-of-text token (the tokenizer's EOS), as
llm.c writes them, each shard ending with one too, and closed before a document that
would take it past --shard-tokens. A shard is written whole or not at all."""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from jaxformer.checks import BadValue, check_int
from jaxformer.data.datasets import held_out, read_text_lines, text_documents
from jaxformer.data.shards import write_shard
from jaxformer.data.tokenizers import FILENAME, BPETokenizer, Tokenizer, load_tokenizer

BATCH = 1024  # documents tokenized at a time


def add_parser(sub) -> argparse.ArgumentParser:
    """The `prepare` command's parser, added to the `jaxformer` command's subparsers."""
    about = __doc__.split("\n\n", 1)[1].replace("%", "%%")
    p = sub.add_parser("prepare", help="text files into token shards", description=about)
    p.add_argument("texts", nargs="+", metavar="TEXT", help="UTF-8 text files")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder the shards go to")
    p.add_argument("--tokenizer", metavar="FILE", help="a tokenizer.json (default: BPE learned)")
    p.add_argument("--bpe-vocab-size", type=int, help="the learned BPE's ids (default: by data)")
    p.add_argument("--eot-id", type=int, help="the end-of-text id of a Hugging Face --tokenizer")
    p.add_argument("--shard-tokens", type=int, default=10**8, help="at most (default 10**8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(command="prepare")
    return p


def run(args: argparse.Namespace) -> int:
    """Write the shards and tokenizer of `args` (add_parser's options)."""
    check_int("--shard-tokens", args.shard_tokens)
    if args.bpe_vocab_size is not None and args.tokenizer:
        raise BadValue("--bpe-vocab-size sizes a learned BPE; a --tokenizer file brings its own")
    out = pathlib.Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.glob("*.bin"))):
        raise BadValue(f"--out {out} is a file or already holds shards: choose a new folder")
    docs = [doc for path in args.texts for doc in _documents(path)]
    if len(docs) < 2:
        raise BadValue(f"{' '.join(args.texts)}: needs at least two documents, to hold one out")
    train, val = held_out(docs)
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer, args.eot_id)
    else:
        tokenizer = BPETokenizer.train(train, args.bpe_vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(out)
    for split, split_docs in (("train", train), ("val", val)):
        shards, tokens = write_shards(
            out, split, split_docs, tokenizer, args.shard_tokens, progress=not args.no_progress
        )
        print(f"{split}: {len(split_docs):,} documents, {tokens:,} tokens in {shards} shard(s)")
    print(f"wrote {out}/{FILENAME} ({tokenizer.vocab_size:,} ids) and the shards")
    return 0


def _documents(path: str) -> list[str]:
    return text_documents([line for _, line in read_text_lines(path)])


def write_shards(
    out: pathlib.Path,
    split: str,
    docs: list[str],
    tokenizer: Tokenizer,
    shard_tokens: int,
    *,
    progress: bool = True,
) -> tuple[int, int]:
    """Write `docs` as shards out/{split}_000000.bin, ...; (shards, tokens) written."""
    from tqdm import tqdm

    eot, held, size, written = tokenizer.eos_id, [], 0, [0, 0]
    encode = getattr(tokenizer, "encode_batch", lambda texts: [tokenizer.encode(t) for t in texts])

    def flush():
        tokens = np.concatenate([*held, [eot]])
        write_shard(out / f"{split}_{written[0]:06d}.bin", tokens, tokenizer.vocab_size)
        written[0], written[1] = written[0] + 1, written[1] + len(tokens)
        held.clear()

    bar = tqdm(total=len(docs), desc=f"{split} documents", disable=not progress, file=sys.stderr)
    for i in range(0, len(docs), BATCH):
        for ids in encode(docs[i : i + BATCH]):
            if held and size + len(ids) + 2 > shard_tokens:
                flush()
                size = 0
            held.append(np.asarray([eot, *ids], np.int64))
            size += len(ids) + 1
        bar.update(len(docs[i : i + BATCH]))
    bar.close()
    flush()
    return written[0], written[1]
