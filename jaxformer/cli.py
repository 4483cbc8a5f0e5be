"""The `jaxformer` command (also `python -m jaxformer`).

    jaxformer train --task dates --out runs/dates
    jaxformer train --data-tsv pairs.tsv --preset paper_base --steps 100000
    jaxformer train --data-text book.txt --config lm.yaml
    jaxformer train --mesh data=2,fsdp=2,tensor=2          # 8 devices, see "Scaling out"
    jaxformer train --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0 --mesh data=-1
    jaxformer generate --checkpoint runs/dates --input "3 March 2001" [--beam 4]

Bad input (a missing file, a malformed TSV, an unknown config key, steps <= 0, a mesh
that does not fit the devices, an unreachable coordinator, ...) is reported in one line
with exit code 2 (set JAXFORMER_TRACEBACK=1 for the traceback); a
diverged run exits with 1; Ctrl-C saves a checkpoint and exits with 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

PRESETS = ("tiny", "paper_base", "paper_big")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    from jaxformer.config import REMAT
    from jaxformer.data.tasks import TASKS
    from jaxformer.train.optim import OPTIMIZERS, SCHEDULES

    parser = argparse.ArgumentParser(prog="jaxformer", description="Train and use Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "train",
        help="train a model",
        description="Train a Transformer (or, on --data-text, a decoder-only LM).",
    )
    data = t.add_mutually_exclusive_group()
    data.add_argument("--task", choices=TASKS, help="a synthetic task (default: dates)")
    data.add_argument("--data-tsv", metavar="FILE", help="source<TAB>target lines")
    data.add_argument("--data-text", metavar="FILE", help="plain text, for a decoder-only LM")
    t.add_argument("--preset", choices=PRESETS, default="tiny", help="model size (default: tiny)")
    t.add_argument("--config", metavar="FILE", help="JSON or YAML of TransformerConfig fields")
    t.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype")
    t.add_argument(
        "--remat", choices=REMAT, help="recompute layers in the backward pass (saves memory)"
    )
    t.add_argument(
        "--scan-layers", action="store_true", help="stacked layers in one scan (faster compile)"
    )
    t.add_argument("--tokenizer", choices=("byte", "bpe"), default="byte")
    t.add_argument("--bpe-vocab", type=_positive_int, default=8000, metavar="N")
    t.add_argument(
        "--seq-len", type=_positive_int, default=128, metavar="N", help="packed LM row length"
    )
    t.add_argument("--steps", type=_positive_int, default=1500)
    t.add_argument("--batch-size", type=_positive_int, default=64)
    t.add_argument("--accum-steps", type=_positive_int, default=1, help="gradient accumulation")
    t.add_argument("--schedule", choices=SCHEDULES, default="cosine")
    t.add_argument(
        "--lr",
        type=_positive_float,
        help="peak lr, default 3e-3 (for --schedule paper: a multiplier, default 1)",
    )
    t.add_argument(
        "--warmup-steps",
        type=int,
        metavar="N",
        help="default: 10%% of --steps (cosine), 4000 (paper)",
    )
    t.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--clip-norm", type=_positive_float, default=1.0)
    t.add_argument("--eval-every", type=_positive_int, default=250, metavar="N")
    t.add_argument("--log-every", type=_positive_int, default=10, metavar="N")
    t.add_argument("--checkpoint-every", type=_positive_int, default=500, metavar="N")
    t.add_argument("--keep-checkpoints", type=_positive_int, default=3, metavar="K")
    t.add_argument("--eval-examples", type=_positive_int, default=1000, metavar="N")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", default=None, metavar="DIR", help="run folder (default: runs/<task>)")
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --out, if there is one",
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    par = t.add_argument_group("parallelism (see README, 'Scaling out')")
    layout = par.add_mutually_exclusive_group()
    layout.add_argument(
        "--mesh",
        metavar="SPEC",
        help="device mesh, e.g. data=2,fsdp=2,tensor=2 (one size may be -1: the rest)",
    )
    layout.add_argument(
        "--pmap", action="store_true", help="data parallel with jax.pmap (one process)"
    )
    par.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="process 0's address, to train as one of several processes ('auto' on TPU pods, SLURM)",
    )
    par.add_argument("--num-processes", type=_positive_int, metavar="N")
    par.add_argument("--process-id", type=int, metavar="I", help="0 .. N-1")
    par.add_argument(
        "--coordinator-timeout",
        type=_positive_int,
        default=120,
        metavar="S",
        help="seconds to wait for all processes to join (default: 120)",
    )

    g = sub.add_parser(
        "generate",
        help="decode with a trained model",
        description="Translate (Transformer) or continue (DecoderLM) each input line with the "
        "model of a `jaxformer train --out` folder; prints one output line per input line "
        "(newlines in an output are written as \\n). Greedy unless --beam or sampling "
        "options are given.",
    )
    g.add_argument("--checkpoint", required=True, metavar="DIR", help="a training run folder")
    g.add_argument("--input", metavar="TEXT", help="one input (default: each line of stdin)")
    g.add_argument("--beam", type=int, metavar="N", help="beam search with N beams (paper: 4)")
    g.add_argument("--alpha", type=float, metavar="A", help="length penalty (default 0.6)")
    g.add_argument("--temperature", type=float, metavar="T", help="sample at temperature T")
    g.add_argument("--top-k", type=int, metavar="K", help="sample from the K likeliest tokens")
    g.add_argument("--top-p", type=float, metavar="P", help="sample from the nucleus of mass P")
    g.add_argument("--seed", type=int, default=0, help="sampling seed")
    g.add_argument(
        "--max-new-tokens",
        type=int,
        metavar="N",
        help="default: the input's length + 50 (the paper), within the model's max_len",
    )
    g.add_argument("--batch-size", type=_positive_int, default=32, metavar="B")
    return parser


def load_config_file(path: str) -> dict:
    """Config fields from a JSON or YAML file (a mapping)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{path}: no such config file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            fields = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML ({e})") from None
    else:
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(fields, dict):
        raise ValueError(
            f"{path}: expected a mapping of config fields, got {type(fields).__name__}"
        )
    return fields


def _train(args) -> int:
    from jaxformer.config import TransformerConfig
    from jaxformer.train.loop import RunConfig, TrainingDiverged, train

    if args.coordinator:
        from jaxformer import parallel

        parallel.initialize(
            args.coordinator,
            args.num_processes,
            args.process_id,
            timeout_s=args.coordinator_timeout,
        )
    elif args.num_processes is not None or args.process_id is not None:
        raise ValueError("--num-processes and --process-id need --coordinator HOST:PORT")
    task = None if (args.data_tsv or args.data_text) else (args.task or "dates")
    # Byte tokenizer vocabulary; replaced by the tokenizer's own size before training.
    config = getattr(TransformerConfig, args.preset)(259)
    if args.config:
        config = config.replace(**_checked_fields(load_config_file(args.config), args.config))
    if args.dtype:
        config = config.replace(dtype=args.dtype)
    if args.remat:
        config = config.replace(remat=args.remat)
    if args.scan_layers:
        config = config.replace(scan_layers=True)
    run = RunConfig(
        task=task,
        data_tsv=args.data_tsv,
        data_text=args.data_text,
        tokenizer=args.tokenizer,
        bpe_vocab_size=args.bpe_vocab,
        seq_len=args.seq_len,
        steps=args.steps,
        batch_size=args.batch_size,
        accum_steps=args.accum_steps,
        schedule=args.schedule,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        optimizer=args.optimizer,
        weight_decay=args.weight_decay,
        clip_norm=args.clip_norm,
        eval_every=args.eval_every,
        log_every=args.log_every,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        eval_examples=args.eval_examples,
        seed=args.seed,
        mesh=args.mesh,
        pmap=args.pmap,
        out=args.out or f"runs/{task or pathlib.Path(args.data_tsv or args.data_text).stem}",
    )
    try:
        train(config, run, resume=args.resume, progress=not args.no_progress)
    except TrainingDiverged as e:
        print(f"jaxformer train: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _generate(args) -> int:
    import jax
    import numpy as np

    from jaxformer import decode
    from jaxformer.data.tokenizers import EOS_ID, PAD_ID
    from jaxformer.models import Transformer
    from jaxformer.train.checkpoint import restore_model

    sampling = any(x is not None for x in (args.temperature, args.top_k, args.top_p))
    beam = args.beam is not None or args.alpha is not None
    if sampling and beam:
        raise ValueError(
            "choose beam search (--beam, --alpha) or sampling (--temperature, --top-k, "
            "--top-p), not both"
        )
    temperature = 1.0 if args.temperature is None else args.temperature
    top_p = 1.0 if args.top_p is None else args.top_p
    beam_size = 4 if args.beam is None else args.beam
    alpha = 0.6 if args.alpha is None else args.alpha
    if sampling:
        decode.check_sampling_options(temperature, args.top_k, top_p)
    if beam:
        decode.check_beam_options(beam_size, alpha)
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")

    model, tokenizer = restore_model(args.checkpoint)
    seq2seq = isinstance(model, Transformer)
    max_len = model.config.max_len
    lines = [args.input] if args.input is not None else sys.stdin.read().splitlines()
    if not lines:
        raise ValueError("no input: give --input TEXT or lines on stdin")
    inputs = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            raise ValueError(f"input line {i} is empty")
        ids = tokenizer.encode(line) + ([EOS_ID] if seq2seq else [])  # as in training
        if len(ids) > max_len:
            raise ValueError(
                f"input line {i} has {len(ids)} tokens, more than the model's max_len={max_len}"
            )
        inputs.append(ids)

    for start in range(0, len(inputs), args.batch_size):
        chunk = inputs[start : start + args.batch_size]
        longest = max(map(len, chunk))
        # Sources padded to a multiple of 16 (fewer compilations); prompts to the longest,
        # which leaves the most room for the continuation.
        width = min(-(-longest // 16) * 16, max_len) if seq2seq else longest
        B = len(chunk)
        src = np.full((B, width), PAD_ID, np.int32)
        for row, ids in enumerate(chunk):
            src[row, : len(ids)] = ids
        valid = src != PAD_ID
        if beam:
            tokens, _ = decode.beam_search(
                model, src, valid, beam_size=beam_size, alpha=alpha,
                max_new_tokens=args.max_new_tokens,
            )  # fmt: skip
            tokens = np.asarray(tokens[:, 0])
        else:
            capacity = max_len if seq2seq else max_len - width + 1
            n = args.max_new_tokens or min(longest + decode.PAPER_EXTRA_LENGTH, capacity)
            if sampling:
                key = jax.random.fold_in(jax.random.PRNGKey(args.seed), start)
                tokens = decode.sample(
                    model, src, valid, max_new_tokens=n, rng=key, temperature=temperature,
                    top_k=args.top_k, top_p=top_p,
                )  # fmt: skip
            else:
                tokens = decode.greedy(model, src, valid, max_new_tokens=n)
            tokens = np.asarray(tokens)
            if args.max_new_tokens is None:  # each row's own input length + 50
                caps = [len(ids) + decode.PAPER_EXTRA_LENGTH for ids in chunk]
                tokens = [row[:cap] for row, cap in zip(tokens, caps, strict=True)]
        for row in tokens:
            print(tokenizer.decode(row).replace("\n", "\\n"), flush=True)
    return 0


def _checked_fields(fields: dict, path: str) -> dict:
    from jaxformer.config import TransformerConfig

    valid = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(fields) - valid)
    if unknown:
        raise ValueError(f"{path}: unknown config key(s) {unknown}; valid keys are {sorted(valid)}")
    return fields


def _use_compilation_cache() -> None:
    """Keep compiled programs in ~/.cache/jaxformer/jax (unless JAX_COMPILATION_CACHE_DIR
    says otherwise), so a second run or a resume starts in seconds."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    import jax

    jax.config.update(
        "jax_compilation_cache_dir", str(pathlib.Path.home() / ".cache" / "jaxformer" / "jax")
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _use_compilation_cache()
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "generate":
            return _generate(args)
    except (ValueError, TypeError, FileNotFoundError, ImportError, ConnectionError) as e:
        if os.environ.get("JAXFORMER_TRACEBACK"):
            raise
        print(f"jaxformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
