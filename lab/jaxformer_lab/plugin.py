"""What the lab adds to the library (entry point "jaxformer.plugins"): the Bible datasets,
registered by name, and its commands, named here with their one-line help; a command's
parser and code (`jaxformer_lab.cli`) are imported only when that command runs."""

import itertools

from jaxformer.data import registry

# The lab's commands and their one-line help; "sweep-report" is typed "sweep report".
COMMANDS = {
    "sweep": "train variants x seeds and compare them",
    "sweep-report": "a sweep's tables as a results record",
    "sweep-calibrate": "the sweep's verdict rule's error rates by simulation",
    "train-ray": "train one run over several hosts of a Ray cluster",
    "bench": "benchmarks, each writing a results record",
    "docs": "render the docs' results sections from their files",
    "gpu-report": "the GPU tables, in resumable parts within a time budget",
    "compile-check": "compile the real programs for a TPU topology with no TPU present",
    "eval": "score a DecoderLM on lm-evaluation-harness tasks (local files)",
}


def add_commands(sub):
    """Add the lab's commands to the `jaxformer` subparsers; each parser by name."""
    from jaxformer_lab import cli

    return cli.add_commands(sub)


def run(args) -> int:
    """Run one of COMMANDS; its exit code."""
    from jaxformer_lab import cli

    return cli.run(args)


def _bible(name: str, attribute: str):
    from jaxformer_lab import bible

    return getattr(bible, attribute)(name)


# The Bible versions the lab's `data` extra installs (pythonbible-<version>).
VERSIONS = ("asv", "bbe", "kjv", "web", "wyc")


def bible_names(versions=VERSIONS) -> frozenset[str]:
    """Every dataset name of the Bibles: VER-lm, and SRC(+EXTRA...)-TGT in any order."""
    names = {f"{version}-lm" for version in versions}
    for target in versions:
        others = [v for v in versions if v != target]
        for k in range(1, len(others) + 1):
            names |= {"+".join(s) + f"-{target}" for s in itertools.permutations(others, k)}
    return frozenset(names)


registry.register(
    "bible",
    registry.Family(
        about="the Bibles: SRC-TGT, SRC+EXTRA-TGT or VER-lm, e.g. wyc-web, web-lm",
        names=bible_names(),
        check=lambda name: _bible(name, "parse_dataset"),
        load=lambda name: _bible(name, "load"),
    ),
)
