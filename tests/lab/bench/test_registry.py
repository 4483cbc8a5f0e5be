"""jaxformer_lab.bench.registry and `jaxformer bench`: every benchmark's options are its
command's options, the recorded command gives the options back, bad options are refused
at the boundary naming the option (one line and exit 2 from the command), and a record goes
to --out (a folder's record.json for xla-vs-eager). A run through the command:
test_decode_speed.py."""

import dataclasses
import shlex

import pytest

from jaxformer import cli
from jaxformer.checks import InputError
from jaxformer_lab import plugin
from jaxformer_lab.bench import BENCHMARKS, registry

NAMES = (
    "attention",
    "batch-shapes",
    "compile-time",
    "copy-baseline",
    "decode",
    "first-hour",
    "gpt2-peers",
    "internals-overhead",
    "jax-versions",
    "lm-throughput",
    "make-train",
    "optimizer-step",
    "paper-params",
    "parity",
    "profile",
    "ray-sweep",
    "seeds-vmapped",
    "shard-loader",
    "speedrun-levers",
    "sweep-jobs",
    "tracker-overhead",
    "train-step",
    "xla-vs-eager",
)


def parse(words: list[str]):
    """The options `jaxformer bench NAME ...` gives."""
    parser, _ = cli._parser((plugin,), "bench")
    args = parser.parse_args(["bench", *words])
    return registry.options_from(args, BENCHMARKS[args.subcommand].options)


def test_every_benchmark_is_registered_with_frozen_typed_options():
    assert sorted(BENCHMARKS.names) == sorted(NAMES)
    for name in NAMES:
        benchmark = BENCHMARKS[name]
        options = benchmark.options()
        assert dataclasses.is_dataclass(options) and benchmark.help.endswith(".")
        with pytest.raises(dataclasses.FrozenInstanceError):
            options.out = "x.json"
        assert all(f.metadata["help"] for f in dataclasses.fields(options))
        assert registry.command(name, options) == f"jaxformer bench {name}"
        assert parse([name]) == options


@pytest.mark.parametrize(
    "words",
    [
        ["lm-throughput", "--quick", "--batch", "4", "--remat", "dots", "--xla-flags", "--a b"],
        ["compile-time", "--layers", "1", "3", "--parts", "depth", "--out", "r/c.json"],
        ["gpt2-peers", "--rounds", "6", "--torch-mode", "eager", "--ready-timeout", "9.5"],
        ["xla-vs-eager", "--parts", "host", "layer", "--note", "a 'quoted' note", "--no-torch"],
        ["attention", "--lengths", "256", "--max-gib", "0.5"],
        ["profile", "--model", "gpt2", "--quick", "--steps", "3"],
        ["parity", "--parts", "hf", "--quick"],
        ["batch-shapes", "--pad-multiples", "16", "64", "--steps", "10"],
        ["paper-params", "--vocab", "37000", "--rows", "base", "big"],
        ["copy-baseline", "--datasets", "asv-web"],
        ["seeds-vmapped", "--tasks", "dates", "--seeds", "1", "8", "--shared-lengths"],
        ["internals-overhead", "--every", "25", "--rounds", "8"],
        ["speedrun-levers", "--rounds", "7", "--batches", "3"],
        ["optimizer-step", "--batches", "8", "64", "--cheap-ns-steps", "4"],
    ],
)
def test_the_recorded_command_gives_back_the_options(words):
    options = parse(words)
    recorded = shlex.split(registry.command(words[0], options))
    assert recorded[:3] == ["jaxformer", "bench", words[0]]
    assert parse(recorded[2:]) == options


def test_the_default_out_is_not_recorded():
    options = BENCHMARKS["decode"].options(out="results/decode.json", quick=True)
    assert registry.command("decode", options) == "jaxformer bench decode --quick"
    assert options.record_path().as_posix() == "results/decode.json"
    lab = BENCHMARKS["xla-vs-eager"].options()  # a folder, as before the registry
    assert lab.record_path().as_posix() == "results/xla_vs_eager/record.json"


@pytest.mark.parametrize(
    "name, fields, message",
    [
        ("decode", dict(out="results/decode"), "--out must be a .json path"),
        ("decode", dict(rounds=5), "--rounds must be >= 6"),
        ("lm-throughput", dict(batch=0), "--batch must be >= 1, got 0"),
        ("gpt2-peers", dict(ready_timeout=0.0), "--ready-timeout must be > 0"),
        ("profile", dict(trace="t.json.gz"), "--trace and --hlo go together"),
        ("compile-time", dict(layers=(2, 0)), "--layers must be >= 1"),
        ("xla-vs-eager", dict(time_limit=-1.0), "--time-limit must be > 0"),
        ("seeds-vmapped", dict(seeds=(8, 0)), "every --seeds value >= 1"),
        ("seeds-vmapped", dict(tasks=("copy",)), "--tasks must be of"),
        ("internals-overhead", dict(every=1), "--every must be >= 2"),
        ("speedrun-levers", dict(rounds=3), "--rounds must be >= 6"),
        ("sweep-jobs", dict(jobs=(2, 1)), "every --jobs value must be >= 2"),
        ("sweep-jobs", dict(config="nowhere.yaml"), "--config nowhere.yaml: no such run file"),
    ],
)
def test_bad_options_are_refused_naming_the_option(name, fields, message):
    with pytest.raises(InputError, match=message):
        BENCHMARKS[name].options(**fields)


def test_the_command_lists_the_benchmarks_and_refuses_unknown_options(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in NAMES)
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "decode", "--quik"])
    assert done.value.code == 2 and "did you mean --quick?" in capsys.readouterr().err
    assert cli.main(["bench", "decode", "--out", "x.txt"]) == 2
    assert "jaxformer bench decode: error: --out must be a .json path" in capsys.readouterr().err
    assert cli.main(["bench", "lm-throughput", "--model-file", "no.yaml"]) == 2
    err = capsys.readouterr().err
    assert "jaxformer bench lm-throughput: error: --model-file no.yaml: no such file" in err


def test_a_registry_refuses_options_it_cannot_turn_into_a_command():
    @dataclasses.dataclass(frozen=True)
    class NoOut:  # not derived from registry.Options: no --out
        pass

    @dataclasses.dataclass(frozen=True)
    class OnByDefault(registry.Options):
        fast: bool = registry.setting(True, "no way to turn it off")

    benchmarks = registry.Registry()
    with pytest.raises(TypeError, match="frozen Options dataclass"):
        benchmarks.register("a", NoOut)
    with pytest.raises(ValueError, match="a flag's default must be False"):
        benchmarks.register("b", OnByDefault)
    benchmarks.register("c", registry.Options)(lambda options: None)
    with pytest.raises(ValueError, match="already registered"):
        benchmarks.register("c", registry.Options)(lambda options: None)
    with pytest.raises(ValueError, match=r"benchmark must be one of \('c',\)"):
        benchmarks["d"]
