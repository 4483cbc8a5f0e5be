"""The `jaxformer` command (also `python -m jaxformer`).

    jaxformer train --task dates --out runs/dates
    jaxformer train --data-tsv pairs.tsv --preset paper_base --steps 100000
    jaxformer train --data-text book.txt --config lm.yaml
    jaxformer train --mesh data=2,fsdp=2,tensor=2          # 8 devices, see "Scaling out"
    jaxformer train --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0 --mesh data=-1
    jaxformer train --init-from gpt2-folder/ --data-text notes.txt   # fine-tune Hugging Face
    jaxformer generate --checkpoint runs/dates --input "3 March 2001" [--beam 4]
    jaxformer generate --checkpoint gpt2-folder/ --input "Once upon a time"
    jaxformer sweep sweep.yaml [--jobs 2]      # variants x seeds, with a verdict
    jaxformer bench decode --quick             # a benchmark: results/decode.json

Bad input (a missing file, a malformed TSV, an unknown config key, steps <= 0, a mesh
that does not fit the devices, an unreachable coordinator, ...: a `checks.InputError`) is
reported in one line with exit code 2 (set JAXFORMER_TRACEBACK=1 for the traceback); any
other exception is a bug and shows its traceback; a warning about input used in part (a
torn last line of a run's metrics.jsonl) is one line. A diverged run exits with 1. Ctrl-C
saves a checkpoint and exits with 130; SIGTERM and SIGHUP do the same and exit with
128 + the signal's number (143 and 129), as a process killed by them would report.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import pathlib
import sys
import typing
import warnings

from jaxformer.checks import BadValue, InputError, InputWarning, command_line


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the command (exit code 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from jaxformer.bench import BENCHMARKS
    from jaxformer.bench.registry import add_options
    from jaxformer.config import PRESETS, RunConfig, TransformerConfig

    parser = _Parser(prog="jaxformer", description="Train and use Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "train",
        help="train a model",
        description="Train a Transformer (or, on --data-text, a decoder-only LM). Every "
        "RunConfig option and TransformerConfig field is an option.",
    )
    for group, options in RunConfig.groups().items():
        title = f"{group} (RunConfig.{group})"
        _add_fields(t.add_argument_group(title, options.__doc__), options, keep_defaults=True)
    model = t.add_argument_group(
        "model (TransformerConfig; default: the --preset, then the --config file)"
    )
    model.add_argument("--preset", choices=PRESETS, default="tiny", help="(default: tiny)")
    model.add_argument("--config", metavar="FILE", help="JSON or YAML of TransformerConfig fields")
    _add_fields(model, TransformerConfig, keep_defaults=False)
    t.add_argument("--resume", action="store_true", help="continue from --out's last checkpoint")
    t.add_argument(
        "--no-progress",
        action="store_true",
        help="print nothing but errors and warnings (the run folder holds every result)",
    )
    par = t.add_argument_group("several processes (see docs/scaling.md)")
    par.add_argument(
        "--coordinator", metavar="HOST:PORT", help="process 0's address ('auto' on TPU pods, SLURM)"
    )
    par.add_argument("--num-processes", type=int, metavar="N")
    par.add_argument("--process-id", type=int, metavar="I", help="0 .. N-1")
    par.add_argument(
        "--coordinator-timeout", type=int, default=120, metavar="SECONDS", help="(default: 120)"
    )

    g = sub.add_parser(
        "generate",
        help="decode with a trained model",
        description="Translate (Transformer) or continue (DecoderLM) each input line with the "
        "model of a `jaxformer train --out` folder; prints one output line per input line "
        "(newlines in an output are written as \\n). Greedy unless --beam or sampling "
        "options are given.",
    )
    g.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="a training run folder, or a Hugging Face model folder",
    )
    g.add_argument("--input", metavar="TEXT", help="one input (default: each line of stdin)")
    g.add_argument("--beam", type=int, metavar="N", help="beam search with N beams (paper: 4)")
    g.add_argument("--alpha", type=float, metavar="A", help="length penalty (default 0.6)")
    g.add_argument("--temperature", type=float, metavar="T", help="sample at temperature T")
    g.add_argument("--top-k", type=int, metavar="K", help="sample from the K likeliest tokens")
    g.add_argument("--top-p", type=float, metavar="P", help="sample from the nucleus of mass P")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    g.add_argument(
        "--max-new-tokens",
        type=int,
        metavar="N",
        help="default: the input's length + 50 (the paper), within the model's max_len",
    )
    g.add_argument("--batch-size", type=int, default=32, metavar="B", help="inputs (default: 32)")
    for command in (t, g):
        command.add_argument(
            "--variants",
            action="append",
            default=[],
            metavar="FILE.py",
            help="a Python file (or module) that registers your own activations, norms or "
            "attention kernels (jaxformer.functional.ACTIVATIONS.register, ...); repeatable",
        )
        command.add_argument(
            "--no-compile-cache",
            action="store_true",
            help="do not keep compiled programs in $XDG_CACHE_HOME/jaxformer/jax (~/.cache)",
        )
    w = sub.add_parser(
        "sweep",
        help="train variants x seeds and compare them",
        description="Run every (variant, seed) of a sweep spec as a `jaxformer train` run in "
        "its own folder (finished runs are kept, others resume), then write results.md, "
        "results.json and curves.png: mean and 95% CI over seeds, and against the baseline, "
        "seed by seed on dev, the seed-paired t-test and the crossed two-level bootstrap, "
        "both Holm-adjusted over every comparison reported, and a verdict. See "
        "jaxformer.sweep.spec for the spec.",
    )
    w.add_argument("spec", metavar="SPEC", help="YAML or JSON: base, variants, seeds, ...")
    w.add_argument("--out", metavar="DIR", help="the sweep's folder (default: the spec's out)")
    w.add_argument(
        "--jobs", type=int, metavar="N", help="runs at once (default: one per GPU, or 1)"
    )
    w.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of the spec's base (a YAML value: 3, 0.1, true); repeatable",
    )
    w.add_argument(
        "--rerun-changed",
        action="store_true",
        help="empty and rerun each run whose folder was made by another configuration "
        "(without it the sweep refuses, naming the run)",
    )
    w.add_argument(
        "--retry-failed", action="store_true", help="empty and rerun failed and diverged runs"
    )
    b = sub.add_parser(
        "bench",
        help="benchmarks, each writing a results record",
        description="Benchmarks (jaxformer.bench): each times through jaxformer.bench.stats "
        "and writes a record (jaxformer.results) to --out, default results/NAME.json, with "
        "the command that reproduces it. `jaxformer bench NAME --help` lists its options.",
    )
    benchmarks = b.add_subparsers(dest="benchmark", required=True, metavar="NAME")
    commands = {"train": t, "generate": g, "sweep": w, "bench": b}
    for name in sorted(BENCHMARKS.names):
        help = BENCHMARKS[name].help
        n = benchmarks.add_parser(name, help=help, description=help)
        add_options(n, BENCHMARKS[name].options, name)
        commands[f"bench {name}"] = n
    return parser, commands


def _add_fields(group, cls, *, keep_defaults: bool) -> None:
    """One option per dataclass field: --field-name, its type, choices and help from the
    field; the field's default (or, with keep_defaults=False, none: the option is left
    out of the namespace unless given). Optional fields take the value "none", as do
    fields without a default (RunConfig.from_options derives theirs)."""
    from jaxformer.config import TransformerConfig

    hints, tiny = typing.get_type_hints(cls), TransformerConfig.tiny(259)
    for f in dataclasses.fields(cls):
        kind, optional = _base_type(hints[f.name])
        help_text = f.metadata["help"]
        if keep_defaults:
            default = None if f.default is dataclasses.MISSING else f.default
            optional = optional or default is None
            help_text += "" if "default" in help_text else f" (default: {default})"
        else:  # left out unless given, so that the preset's value stands
            default = argparse.SUPPRESS
            help_text += f" (tiny: {getattr(tiny, f.name)})"
        kw = dict(default=default, help=help_text.replace("%", "%%"))
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = _value_parser(kind, optional)
            kw["choices"] = f.metadata["choices"]
            kw["metavar"] = None if kw["choices"] else kind.__name__.upper()
        group.add_argument("--" + f.name.replace("_", "-"), **kw)


def _base_type(hint) -> tuple[type, bool]:
    """(the type, whether None is allowed) of an annotation such as `int | None`."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return (args[0], True) if args else (hint, False)


def _value_parser(kind: type, optional: bool):
    def parse(text: str):
        if optional and text.lower() == "none":
            return None
        return kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


def _train(args) -> int:
    from jaxformer.config import RunConfig
    from jaxformer.train.loop import Terminated, TrainingDiverged, train

    if args.coordinator:
        from jaxformer import parallel

        parallel.initialize(
            args.coordinator,
            args.num_processes,
            args.process_id,
            timeout_s=args.coordinator_timeout,
        )
    elif args.num_processes is not None or args.process_id is not None:
        raise BadValue("--num-processes and --process-id need --coordinator HOST:PORT")
    run = RunConfig.from_options(**{name: getattr(args, name) for name in RunConfig.options()})
    try:
        train(_model_config(args), run, resume=args.resume, progress=not args.no_progress)
    except TrainingDiverged as e:
        print(f"jaxformer train: {e}", file=sys.stderr)
        return 1
    except Terminated as e:
        return 128 + e.signum
    except KeyboardInterrupt:
        return 130
    return 0


def _model_config(args):
    """The --preset, with the --config file's fields, then the model options given."""
    from jaxformer.config import TransformerConfig, load_config_file
    from jaxformer.data.tokenizers import ByteTokenizer

    # The byte vocabulary; training raises it to the tokenizer's when that is larger.
    config = getattr(TransformerConfig, args.preset)(ByteTokenizer.vocab_size)
    if args.config:
        fields = load_config_file(args.config)  # its errors name the file
        try:
            config = config.replace(**fields)
        except InputError as e:
            raise type(e)(f"{args.config}: {e}") from None
    names = [f.name for f in dataclasses.fields(TransformerConfig) if hasattr(args, f.name)]
    return config.replace(**{name: getattr(args, name) for name in names})


def _generate(args) -> int:
    from jaxformer import decode
    from jaxformer.checks import check_int
    from jaxformer.config import DataOptions
    from jaxformer.models import Transformer
    from jaxformer.train.checkpoint import restore_model
    from jaxformer.train.run_folder import read_json

    sampling = any(x is not None for x in (args.temperature, args.top_k, args.top_p))
    beam = args.beam is not None or args.alpha is not None
    if sampling and beam:
        raise BadValue(
            "choose beam search (--beam, --alpha) or sampling (--temperature, --top-k, "
            "--top-p), not both"
        )
    check_int("--batch-size", args.batch_size)
    if args.max_new_tokens is not None:
        check_int("--max-new-tokens", args.max_new_tokens)
    given = dict(
        beam_size=args.beam,
        alpha=args.alpha,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
    )
    options = {k: v for k, v in given.items() if v is not None}

    model, tokenizer = restore_model(args.checkpoint)
    seq2seq = isinstance(model, Transformer)
    texts = _read_inputs(args.input, tokenizer, seq2seq, model.config.max_len)
    config = pathlib.Path(args.checkpoint) / "config.json"
    run = read_json(config).get("run", {}) if config.is_file() else {}
    pad_multiple = run.get("pad_multiple", DataOptions.pad_multiple)  # the run's, else default
    outputs = decode.generate(
        model,
        tokenizer,
        texts,
        "beam" if beam else "sample" if sampling else "greedy",
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        pad_multiple=pad_multiple,
        **options,
    )
    for text in outputs:
        print(text.replace("\n", "\\n"), flush=True)
    return 0


def _read_inputs(text: str | None, tokenizer, seq2seq: bool, max_len: int) -> list[str]:
    """`text` or each stdin line, stripped of surrounding spaces; each must fit the model
    with the tokenizer's EOS after a source, as in training."""
    lines = [text] if text is not None else sys.stdin.read().splitlines()
    if not lines:
        raise BadValue("no input: give --input TEXT or lines on stdin")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            raise BadValue(f"input line {i} is empty")
        n = len(tokenizer.encode(line.strip())) + seq2seq
        if n > max_len:
            raise BadValue(
                f"input line {i} has {n} tokens, more than the model's max_len={max_len}"
            )
    return [line.strip() for line in lines]


def _tune_glibc_malloc() -> None:
    """Keep XLA's large per-step CPU buffers in glibc's heap. By default each worker
    thread's arena caps at 64 MiB, so a step's ~100 MiB of temporaries is a fresh mmap
    every step, faulted in page by page (a third of a CPU run's time went to system time).
    One arena, and no mmap or trim below 1 GiB, reuses the memory as tcmalloc would.
    Must run before JAX starts its CPU backend; Linux with glibc only; an allocator or
    tuning the user chose (LD_PRELOAD, MALLOC_*, GLIBC_TUNABLES) is left alone."""
    import ctypes

    tuned = any(k.startswith("MALLOC_") for k in os.environ)
    if tuned or {"LD_PRELOAD", "GLIBC_TUNABLES"} & set(os.environ):
        return
    try:
        if not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"):
            return
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, ValueError, AttributeError):
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    for param, value in ((-8, 1), (-3, 1 << 30), (-1, 1 << 30)):  # ARENA_MAX, MMAP_, TRIM_THRESHOLD
        mallopt(param, value)


def _use_compilation_cache(enabled: bool) -> None:
    """Keep compiled programs in $XDG_CACHE_HOME/jaxformer/jax (~/.cache by default; JAX's
    own JAX_COMPILATION_CACHE_DIR takes precedence), so a second run or a resume skips
    XLA's compilation; --no-compile-cache turns it off."""
    import jax

    if not enabled:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    jax.config.update("jax_compilation_cache_dir", str(cache / "jaxformer" / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def main(argv: list[str] | None = None) -> int:
    _tune_glibc_malloc()
    parser, commands = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        name = args.command + (f" {args.benchmark}" if args.command == "bench" else "")
        _unrecognized(commands[name], extras)
    with command_line(), warnings.catch_warnings():
        warnings.showwarning = _one_line_warning(args.command, warnings.showwarning)
        return _command(args)


def _one_line_warning(command: str, show):
    """warnings.showwarning that writes an InputWarning as one line naming the command."""

    def showwarning(message, category, *args, **kwargs):
        if issubclass(category, InputWarning):
            print(f"jaxformer {command}: warning: {message}", file=sys.stderr, flush=True)
        else:
            show(message, category, *args, **kwargs)

    return showwarning


def _command(args) -> int:
    """Run the parsed command; bad input is one line and exit code 2."""
    try:
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "bench":
            return _bench(args)
        _use_compilation_cache(not args.no_compile_cache)
        from jaxformer.functional.registry import import_variants

        import_variants(args.variants)
        if args.command == "train":
            return _train(args)
        return _generate(args)
    except InputError as e:  # anything else is a bug: its traceback
        if os.environ.get("JAXFORMER_TRACEBACK"):
            raise
        print(f"jaxformer {args.command}: error: {e}", file=sys.stderr)
        return 2


def _bench(args) -> int:
    from jaxformer.bench import BENCHMARKS, registry

    options = registry.options_from(args, BENCHMARKS[args.benchmark].options)
    try:
        registry.run(args.benchmark, options)
    except registry.Stopped as e:
        print(f"jaxformer bench {args.benchmark}: {e}", file=sys.stderr)
        return e.code
    return 0


def _sweep(args) -> int:
    from jaxformer import sweep

    if args.jobs is not None and args.jobs < 1:
        raise BadValue(f"--jobs must be >= 1, got {args.jobs}")
    spec = sweep.Spec.load(args.spec, out=args.out, overrides=tuple(args.set))
    try:
        sweep.run(
            spec, jobs=args.jobs, rerun_changed=args.rerun_changed, retry_failed=args.retry_failed
        )
    except KeyboardInterrupt:
        print("jaxformer sweep: interrupted; run the same command to continue", file=sys.stderr)
        return 130
    print((spec.out / "results.md").read_text())
    print(f"results in {spec.out}/: results.md results.json curves.png")
    return 0


def _unrecognized(command: argparse.ArgumentParser, extras: list[str]) -> None:
    """The command's own one-line error, with the closest option when there is one."""
    options = [o for action in command._actions for o in action.option_strings]
    close = difflib.get_close_matches(extras[0].split("=")[0], options, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    command.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


if __name__ == "__main__":
    sys.exit(main())
