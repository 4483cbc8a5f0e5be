"""The `jaxformer` command (also `python -m jaxformer`).

    jaxformer train --task dates --out runs/dates
    jaxformer train --config run.yaml --steps 500   # a run file, options over it
    jaxformer train --data-text book.txt --config configs/models/gpt2_small.yaml
    jaxformer train --mesh data=2,fsdp=2,tensor=2          # 8 devices, see "Scaling out"
    jaxformer train --init-from gpt2-folder/ --data-text notes.txt   # fine-tune Hugging Face
    jaxformer generate --checkpoint runs/dates --input "3 March 2001" [--beam 4]
    jaxformer prepare book.txt --out data/book     # token shards for train --data-shards

Plugins (`jaxformer.plugins`) add commands. Exit codes: 2 for bad input (a
`checks.InputError`, one line; JAXFORMER_TRACEBACK=1 for the traceback), 1 for a diverged
run, 130 for Ctrl-C and 128 + signal for SIGTERM/SIGHUP (both save a checkpoint first).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import pathlib
import shlex
import signal
import sys
import traceback
import typing
import warnings

from jaxformer.checks import (
    BadValue,
    InputError,
    InputWarning,
    check_int,
    command_line,
)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the command (exit code 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# The library's own commands and their one-line help; a parser is built only for the
# command that runs, as for a plugin's (`jaxformer.plugins`).
COMMANDS = {
    "train": "train a model",
    "generate": "decode with a trained model",
    "prepare": "text files into token shards",
}


def _parser(
    extensions: tuple = (), running: str | None = None
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `jaxformer` parser, and each command's parser by name. Every command is named
    with its one-line help; its options ("bench NAME", "sweep-report" and a plugin's other
    commands too) are built only for the command `running`: the others' modules stay
    unimported."""
    parser = _Parser(prog="jaxformer", description="Train and use Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for name, about in COMMANDS.items():
        if name == running:
            commands[name] = _command_parser(sub, name, about)
        else:
            commands[name] = sub.add_parser(name, help=about)
    for plugin in extensions:
        if running in plugin.COMMANDS:
            commands |= plugin.add_commands(sub)
        else:
            commands |= {
                name: sub.add_parser(name, help=about) for name, about in plugin.COMMANDS.items()
            }
    shown = [name for name in sub.choices if _joined(name, commands) is None]
    sub.metavar = "{" + ",".join(shown) + "}"
    return parser, commands


def _command_parser(sub, name: str, about: str) -> argparse.ArgumentParser:
    """The parser of the library's command `name`, with the options train and generate share."""
    if name == "prepare":
        from jaxformer.data import prepare

        return prepare.add_parser(sub)
    command = {"train": _train_parser, "generate": _generate_parser}[name](sub, about)
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
    return command


def _joined(name: str, commands) -> str | None:
    """The command as typed for a command a plugin named "sweep-report" ("sweep report",
    beside `sweep`), else None."""
    head, _, tail = name.partition("-")
    return f"{head} {tail}" if tail and name in commands and head in commands else None


def _train_parser(sub, about: str) -> argparse.ArgumentParser:
    from jaxformer.config import PRESETS, TransformerConfig
    from jaxformer.train.config import RunConfig

    t = sub.add_parser(
        "train",
        help=about,
        description="Train a Transformer (or, on --data-text, a decoder-only LM): the --config "
        "run file's model and run, with the options given here over it. Every RunConfig "
        "option and TransformerConfig field is an option.",
    )
    t.add_argument(
        "--config",
        metavar="FILE",
        help="a run file, YAML or JSON: model: {preset: NAME, FIELD: VALUE, ...} and run: "
        "{OPTION: VALUE, ...} (a run folder's config.json is one); a file of model fields "
        "alone is its model (see jaxformer.train.config.load_run)",
    )
    for group, options in RunConfig.groups().items():
        title = f"{group} (RunConfig.{group})"
        _add_fields(t.add_argument_group(title, options.__doc__), options)
    model = t.add_argument_group("model (TransformerConfig: the --preset, then its fields)")
    model.add_argument(
        "--preset",
        choices=PRESETS,
        default=argparse.SUPPRESS,
        help="(default: the run file's, else tiny)",
    )
    _add_fields(model, TransformerConfig, preset=TransformerConfig.tiny(259))
    t.add_argument("--resume", action="store_true", help="continue from --out's last checkpoint")
    t.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        metavar="S",
        help="train these seeds of the run in one process, each in <out>/seed<S> "
        "(see jaxformer.train.seeds)",
    )
    vmap_seeds_option(
        t,
        "with --seeds: on, one vmapped step for all seeds; off, each seed's step in turn "
        "(one compilation); auto (default): on with a GPU or TPU, off on a CPU",
    )
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
    return t


def _generate_parser(sub, about: str) -> argparse.ArgumentParser:
    g = sub.add_parser(
        "generate",
        help=about,
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
    return g


VMAP_SEEDS = {"auto": None, "on": True, "off": False}  # --vmap-seeds: the `vmapped` argument


def vmap_seeds_option(parser: argparse.ArgumentParser, help: str) -> None:
    """--vmap-seeds {auto,on,off} (read through VMAP_SEEDS)."""
    parser.add_argument(
        "--vmap-seeds",
        choices=tuple(VMAP_SEEDS),
        default="auto",
        help=help + " (on a CPU the vmapped step measured slower: docs/training.md)",
    )


def _add_fields(group, cls, *, preset=None) -> None:
    """One option per dataclass field: --field-name, its type, choices and help from the
    field, left out of the namespace unless given (so that the run file's value, else the
    default, stands). The help names the field's default, or `preset`'s value. Optional
    fields take the value "none", as do run options without a default
    (RunConfig.from_options derives theirs)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind, optional = _base_type(hints[f.name])
        help_text = f.metadata["help"]
        if preset is None:
            default = None if f.default is dataclasses.MISSING else f.default
            optional = optional or default is None
            help_text += "" if "default" in help_text else f" (default: {default})"
        else:
            help_text += f" (tiny: {getattr(preset, f.name)})"
        kw = dict(default=argparse.SUPPRESS, help=help_text.replace("%", "%%"))
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
    from jaxformer.config import TransformerConfig
    from jaxformer.train.config import RunConfig, load_run
    from jaxformer.train.loop import Terminated, TrainingDiverged
    from jaxformer.train.seeds import seed_runs, train_seeds

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
    if args.seeds is None and args.vmap_seeds != "auto":
        raise BadValue("--vmap-seeds says how --seeds train; give it with --seeds S [S ...]")
    given = vars(args)  # the options given: the others are left out (argparse.SUPPRESS)
    model_fields = ["preset", *(f.name for f in dataclasses.fields(TransformerConfig))]
    if given.get("init_from") and (flags := [n for n in model_fields if n in given]):
        named = ", ".join("--" + n.replace("_", "-") for n in flags)
        raise BadValue(f"{named}: the model is --init-from's; leave model options out")
    config, run = load_run(
        args.config,
        model={name: given[name] for name in model_fields if name in given},
        run={name: given[name] for name in RunConfig.options() if name in given},
    )
    runs = [run] if args.seeds is None else seed_runs(run, args.seeds)
    try:
        vmapped = VMAP_SEEDS[args.vmap_seeds]
        train_seeds(
            config, runs, resume=args.resume, progress=not args.no_progress, vmapped=vmapped
        )
    except TrainingDiverged as e:
        print(f"jaxformer train: {e}", file=sys.stderr)
        return 1
    except Terminated as e:
        return 128 + e.signum
    except KeyboardInterrupt:
        return 130
    return 0


def _generate(args) -> int:
    from jaxformer import decode
    from jaxformer.checkpoints import restore_model
    from jaxformer.files import read_json
    from jaxformer.models import Transformer
    from jaxformer.train.config import DataOptions

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
    batches = decode.generate_batches(
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
    return _print_outputs(batches, len(texts), args.input is None)


def _print_outputs(batches, total: int, from_stdin: bool) -> int:
    """Print each batch's outputs as it is decoded. Stopped (Ctrl-C, SIGTERM, SIGHUP), the
    lines printed stay, one line says how many and how to decode the rest, and the exit
    code is the signal's (130, 143, 129)."""
    from jaxformer.signals import Terminated, signals_held, stop_signals_raise

    done = 0
    try:
        with stop_signals_raise():
            batches = iter(batches)
            while True:
                with signals_held():  # raised inside jit's C++, a stop becomes its ValueError
                    batch = next(batches, None)
                if batch is None:
                    break
                for text in batch:
                    with signals_held():  # a line printed is a line counted
                        print(text.replace("\n", "\\n"), flush=True)
                        done += 1
    except KeyboardInterrupt as stop:
        why = f"terminated by {stop}" if isinstance(stop, Terminated) else "interrupted"
        rest = f"give it stdin from line {done + 1} on (tail -n +{done + 1})" if from_stdin else ""
        print(
            f"jaxformer generate: {why} after {done} of {total} outputs (printed)"
            + (f"; for the rest, {rest}" if rest else "; rerun it to decode the input"),
            file=sys.stderr,
            flush=True,
        )
        return 128 + stop.signum if isinstance(stop, Terminated) else 130
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
    """Keep XLA's large per-step CPU buffers in glibc's heap (one arena, no mmap or trim
    below 1 GiB), not mmapped and faulted in anew each step (docs/performance.md). Runs
    before JAX's CPU backend starts; a user's allocator or tuning is left alone."""
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


def _no_tpu_probe() -> None:
    """With libtpu installed (the tpu extra, for compiling TPU programs) on a host with no
    TPU, JAX's start would probe for one and print libtpu's warnings: JAX starts on the GPU
    or CPU instead. A TPU host (its /dev/accel* or /dev/vfio devices) and a user's own
    JAX_PLATFORMS are left alone."""
    import glob
    import importlib.util

    import jax

    tpu_host = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    if "JAX_PLATFORMS" in os.environ or tpu_host or importlib.util.find_spec("libtpu") is None:
        return
    jax.config.update("jax_platforms", "cuda,cpu")  # before JAX's backends start


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


def main(argv: list[str] | None = None, extensions: tuple | None = None) -> int:
    """The command; `extensions` are the plugin modules that add commands (default: every
    installed plugin that defines `add_commands`). A stop that no command took (Ctrl-C
    while it starts) is one line and the signal's exit code."""
    from jaxformer.signals import stops_kept

    argv = sys.argv[1:] if argv is None else argv
    try:
        with stops_kept():
            return _main(argv, extensions)
    except KeyboardInterrupt as stop:
        signum = getattr(stop, "signum", signal.SIGINT)
        again = shlex.join(["jaxformer", *argv])
        print(
            f"jaxformer: stopped by {signal.Signals(signum).name}; rerun `{again}`", file=sys.stderr
        )
        return 128 + signum


def _main(argv: list[str], extensions: tuple | None) -> int:
    _tune_glibc_malloc()
    if argv[:1] and argv[0] in COMMANDS:  # the lab's compile-check wants libtpu's devices
        _no_tpu_probe()
    if extensions is None:
        from jaxformer import plugins

        extensions = tuple(p for p in plugins.load() if hasattr(p, "COMMANDS"))
    named = {name for plugin in extensions for name in plugin.COMMANDS}
    if len(argv) > 1 and f"{argv[0]}-{argv[1]}" in named:  # "sweep report"
        argv = [f"{argv[0]}-{argv[1]}", *argv[2:]]
    parser, commands = _parser(extensions, argv[0] if argv else None)
    args, extras = parser.parse_known_args(argv)
    if extras:
        name = " ".join(filter(None, (args.command, getattr(args, "subcommand", None))))
        _unrecognized(commands[name], extras)
    # a plugin's command with commands of its own ("bench NAME") names the one chosen
    where = " ".join(filter(None, (args.command, getattr(args, "subcommand", None))))
    where = "jaxformer " + (_joined(where, commands) or where)  # the command as typed
    name = " ".join(filter(None, (args.command, getattr(args, "subcommand", None))))
    with command_line(_flags(commands[name])), warnings.catch_warnings():
        warnings.showwarning = _one_line_warning(where, warnings.showwarning)
        return _command(args, extensions, where)


def _one_line_warning(command: str, show):
    """warnings.showwarning that writes an InputWarning as one line naming the command."""

    def showwarning(message, category, *args, **kwargs):
        if issubclass(category, InputWarning):
            print(f"{command}: warning: {message}", file=sys.stderr, flush=True)
        else:
            show(message, category, *args, **kwargs)

    return showwarning


def _command(args, extensions: tuple, where: str) -> int:
    """Run the parsed command; bad input is one line and exit code 2."""
    try:
        if args.command == "prepare":
            from jaxformer.data import prepare

            return prepare.run(args)
        if args.command not in ("train", "generate"):
            return next(p.run(args) for p in extensions if args.command in p.COMMANDS)
        _use_compilation_cache(not args.no_compile_cache)
        import_variants(args.variants)
        if args.command == "train":
            return _train(args)
        return _generate(args)
    except InputError as e:  # anything else is a bug: its traceback
        if os.environ.get("JAXFORMER_TRACEBACK"):
            raise
        print(f"{where}: error: {e}", file=sys.stderr)
        return 2


def import_variants(sources: list[str]) -> None:
    """Import each --variants file or module (a sweep's variant_files); one that raises
    (or exits) is bad input, shown as its exception and its own frames (not the
    importing machinery's)."""
    from jaxformer.functional import registry

    for source in sources:
        try:
            registry.import_variants([source])
        except InputError:
            raise
        except (Exception, SystemExit) as e:
            frames = [f for f in traceback.extract_tb(e.__traceback__) if _users(f.filename)]
            shown = traceback.format_list(frames[-3:]) + traceback.format_exception_only(e)
            raise BadValue(
                f"--variants {source} raised on import:\n" + "".join(shown).rstrip()
            ) from e


def _users(filename: str) -> bool:
    """Whether a traceback frame's file is the user's code, not jaxformer's or Python's
    import machinery."""
    package = str(pathlib.Path(__file__).resolve().parent)
    return not filename.startswith("<") and not str(pathlib.Path(filename).resolve()).startswith(
        package + os.sep
    )


# Library arguments that a flag gives under another name (flag's dest -> argument).
_ALSO_NAMED = {
    "attention_impl": "implementation",
    "steps": "total_steps",
    "coordinator_timeout": "timeout_s",
    "beam": "beam_size",
}


def _flags(command: argparse.ArgumentParser) -> dict[str, str]:
    """The arguments a command's flags give, each with its flag (`checks.as_given` names
    them so): an option's dest, and the library argument it is passed as."""
    flags = {}
    for action in command._actions:
        if action.option_strings and action.dest != "help":
            positive = [o for o in action.option_strings if not o.startswith("--no-")]
            flag = max(positive or action.option_strings, key=len)
            flags[action.dest] = flags.get(action.dest, flag)
            if action.dest in _ALSO_NAMED:
                flags[_ALSO_NAMED[action.dest]] = flag
    return flags


def _unrecognized(command: argparse.ArgumentParser, extras: list[str]) -> None:
    """The command's own one-line error, with the closest option when there is one."""
    options = [o for action in command._actions for o in action.option_strings]
    close = difflib.get_close_matches(extras[0].split("=")[0], options, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    command.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


if __name__ == "__main__":
    sys.exit(main())
