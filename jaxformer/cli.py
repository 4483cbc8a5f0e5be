"""The `jaxformer` command (also `python -m jaxformer`).

    jaxformer train --task dates --out runs/dates
    jaxformer train --data-tsv pairs.tsv --preset paper_base --steps 100000
    jaxformer train --data-text book.txt --config lm.yaml

Bad input (a missing file, a malformed TSV, an unknown config key, steps <= 0, ...) is
reported in one line with exit code 2 (set JAXFORMER_TRACEBACK=1 for the traceback); a
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
    t.add_argument("--tokenizer", choices=("byte", "bpe"), default="byte")
    t.add_argument("--bpe-vocab", type=_positive_int, default=8000, metavar="N")
    t.add_argument(
        "--seq-len", type=_positive_int, default=128, metavar="N", help="packed LM row length"
    )
    t.add_argument("--steps", type=_positive_int, default=1500)
    t.add_argument("--batch-size", type=_positive_int, default=64)
    t.add_argument("--accum-steps", type=_positive_int, default=1, help="gradient accumulation")
    t.add_argument("--schedule", choices=SCHEDULES, default="cosine")
    t.add_argument("--lr", type=_positive_float, help="peak lr (a multiplier for --schedule paper)")
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
        "--resume", action="store_true", help="continue from the latest checkpoint in --out"
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def load_config_file(path: str) -> dict:
    """Config fields from a JSON or YAML file (a mapping)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{path}: no such config file")
    text = p.read_text()
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

    task = None if (args.data_tsv or args.data_text) else (args.task or "dates")
    # Byte tokenizer vocabulary; replaced by the tokenizer's own size before training.
    config = getattr(TransformerConfig, args.preset)(259)
    if args.config:
        config = config.replace(**_checked_fields(load_config_file(args.config), args.config))
    if args.dtype:
        config = config.replace(dtype=args.dtype)
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
        lr=args.lr if args.lr is not None else (None if args.schedule == "paper" else 3e-3),
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


def _checked_fields(fields: dict, path: str) -> dict:
    from jaxformer.config import TransformerConfig

    valid = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(fields) - valid)
    if unknown:
        raise ValueError(f"{path}: unknown config key(s) {unknown}; valid keys are {sorted(valid)}")
    return fields


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        if os.environ.get("JAXFORMER_TRACEBACK"):
            raise
        print(f"jaxformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
