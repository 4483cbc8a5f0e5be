"""The `jaxformer` command."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxformer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="train a model (arrives with the training issue)")
    args = parser.parse_args(argv)
    if args.command == "train":
        print("jaxformer train: training arrives with the training issue; the model code is ready.")
    return 0
