import json
import pathlib

import pytest

from jaxformer import RunConfig, TransformerConfig
from jaxformer.checks import BadValue
from jaxformer.config import TABLE3_ROWS
from jaxformer.train.config import (
    DataOptions,
    EvalOptions,
    OptimOptions,
    RuntimeOptions,
    load_run,
)


def test_paper_presets():
    base = TransformerConfig.paper_base(37000)
    assert (base.num_encoder_layers, base.d_model, base.d_ff, base.num_heads) == (6, 512, 2048, 8)
    assert (base.key_dim, base.value_dim, base.dropout_rate, base.label_smoothing) == (
        64,
        64,
        0.1,
        0.1,
    )
    assert base.norm_placement == "post" and base.position_embedding == "sinusoidal"
    assert base.share_embeddings and not base.use_final_norm
    big = TransformerConfig.paper_big(37000)
    assert (big.d_model, big.d_ff, big.num_heads, big.dropout_rate, big.key_dim) == (
        1024,
        4096,
        16,
        0.3,
        64,
    )
    tiny = TransformerConfig.tiny(300, dropout_rate=0.0)
    assert tiny.vocab_size == 300 and tiny.dropout_rate == 0.0


def test_table3_rows():
    assert TransformerConfig.table3("A1", 100).key_dim == 512
    assert TransformerConfig.table3("B1", 100).key_dim == 16
    assert TransformerConfig.table3("B1", 100).value_dim == 64
    assert TransformerConfig.table3("C4", 100).d_model == 256
    assert TransformerConfig.table3("E", 100).position_embedding == "learned"
    assert TransformerConfig.table3("D3", 100).label_smoothing == 0.0
    for row in TABLE3_ROWS:
        TransformerConfig.table3(row, 100)
    with pytest.raises(ValueError, match="unknown Table 3 row 'Z'"):
        TransformerConfig.table3("Z", 100)


def test_round_trip_and_unknown_keys():
    c = TransformerConfig.tiny(50, norm_placement="pre")
    assert TransformerConfig.from_dict(c.to_dict()) == c
    assert c.replace(d_ff=64).d_ff == 64
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['d_modle'\]; valid keys are"):
        TransformerConfig.from_dict({"vocab_size": 5, "d_modle": 8})


@pytest.mark.parametrize(
    "fields,error,match",
    [
        (dict(d_model=100, num_heads=8), ValueError, "d_model=100 is not divisible by num_heads=8"),
        (dict(num_kv_heads=3), ValueError, "num_heads=8 is not divisible by num_kv_heads=3"),
        (dict(d_model=0), ValueError, "d_model must be >= 1"),
        (dict(d_model=512.0), TypeError, "d_model must be an int"),
        (dict(vocab_size=True), TypeError, "vocab_size must be an int"),
        (dict(dropout_rate=1.0), ValueError, r"dropout_rate must be in \[0, 1\)"),
        (dict(label_smoothing=-0.1), ValueError, "label_smoothing must be in"),
        (dict(norm_placement="sandwich"), ValueError, "norm_placement must be one of"),
        (dict(activation="tanh"), ValueError, "activation must be one of"),
        (dict(position_embedding="alibi"), ValueError, "position_embedding must be one of"),
        (dict(dtype="float16"), ValueError, "dtype must be one of"),
        (dict(d_model=255, num_heads=5), ValueError, "sinusoidal positions need an even d_model"),
        (
            dict(position_embedding="rope", d_k=7, d_v=8),
            ValueError,
            "rotary embeddings need an even key head dim",
        ),
        (dict(d_model=100, num_heads=8, d_k=12, d_v=12), None, None),
    ],
)
def test_config_checks_itself(fields, error, match):
    fields = dict(vocab_size=fields.pop("vocab_size", 10)) | fields
    if error is None:
        TransformerConfig(**fields)
        return
    with pytest.raises(error, match=match):
        TransformerConfig(**fields)


# Every run option at its default by its flat name, as config.json's run section holds it
# and the sweep's config hash reads it: a new option is added here.
FLAT_DEFAULT_RUN = json.loads("""{
    "task": "dates", "data_tsv": null, "data_text": null, "dataset": null, "tokenizer": "byte",
    "init_from": null, "bpe_vocab_size": null, "seq_len": 128, "pad_multiple": 16,
    "shared_lengths": false, "batch_tokens": null, "data_shards": null, "val_shards": null,
    "eot_id": null, "pack": true,
    "steps": 1500, "batch_size": 64, "accum_steps": 1, "schedule": "cosine", "lr": null,
    "warmup_steps": null, "optimizer": "adam", "weight_decay": 0.0, "muon_lr_scale": null,
    "adam_lr_scale": null, "clip_norm": 1.0, "lora_rank": null, "lora_alpha": null,
    "lora_targets": null,
    "eval_every": 250, "log_every": 10, "checkpoint_every": 500, "keep_checkpoints": 3,
    "eval_examples": 1000, "eval_sample": 200, "final_test": false, "eval_beam": null,
    "eval_alpha": 0.6, "average_checkpoints": 1, "seed": 0, "out": "runs/dates",
    "profile": null, "mesh": null, "pmap": false, "log_internals": null, "tracker": "jsonl",
    "tracker_group": null, "tracker_job": null
}""")
# The settings a checkpoint's meta recorded before (then a hand-written list).
RESUME_KEYS = """task data_tsv data_text dataset data_shards val_shards eot_id pack tokenizer
    init_from bpe_vocab_size seq_len shared_lengths batch_tokens batch_size accum_steps
    schedule lr warmup_steps optimizer weight_decay muon_lr_scale adam_lr_scale clip_norm
    lora_rank lora_alpha lora_targets seed cosine_total_steps""".split()


def test_run_options_are_grouped_and_keep_their_flat_names():
    run = RunConfig.from_options()
    assert run.to_dict() == FLAT_DEFAULT_RUN
    assert sorted(RunConfig.options()) == sorted(FLAT_DEFAULT_RUN)
    assert RunConfig.from_options(**run.to_dict()) == run
    run = RunConfig.from_options(steps=7, eval_every=3, seq_len=64, seed=-2, mesh="data=1")
    assert (run.optim.steps, run.eval.eval_every, run.data.seq_len) == (7, 3, 64)
    assert (run.runtime.seed, run.runtime.mesh) == (-2, "data=1")
    changed = dict(steps=7, eval_every=3, seq_len=64, seed=-2, mesh="data=1")
    assert run.to_dict() == FLAT_DEFAULT_RUN | changed
    assert RunConfig.options()["clip_norm"] == "optim"
    assert RunConfig.from_options(clip_norm=None).optim.clip_norm is None  # none = no clipping


@pytest.mark.parametrize(
    "name, match",
    [
        ("stepz", "unknown run option 'stepz'; did you mean 'steps'?"),
        ("eval_evry", "unknown run option 'eval_evry'; did you mean 'eval_every'?"),
        ("zzz", "unknown run option 'zzz'; the options are \\['task', 'data_tsv'"),
    ],
)
def test_an_unknown_run_option_names_the_closest(name, match):
    with pytest.raises(BadValue, match=match):
        RunConfig.from_options(**{name: 5})


def test_defaults_that_depend_on_other_options():
    run = RunConfig.from_options(data_tsv="data/pairs.tsv")
    assert (run.data.task, run.data.tokenizer, run.runtime.out) == (None, "byte", "runs/pairs")
    run = RunConfig.from_options(dataset="toy-pairs", out=None)
    assert (run.data.tokenizer, run.runtime.out) == ("bpe", "runs/toy-pairs")
    fine_tune = RunConfig.from_options(dataset="toy-pairs", init_from="m")
    assert fine_tune.data.tokenizer == "byte"  # the model's: "byte" as resolved, no other
    assert RunConfig.from_options(**fine_tune.to_dict()) == fine_tune
    with pytest.raises(BadValue, match="a model given by init_from brings its tokenizer"):
        RunConfig.from_options(data_text="a.txt", init_from="m", tokenizer="bpe")
    with pytest.raises(BadValue, match="brings its tokenizer; leave bpe_vocab_size unset"):
        RunConfig.from_options(dataset="toy-pairs", init_from="m", bpe_vocab_size=2000)
    # Built from its groups, a RunConfig takes the source, tokenizer and folder as given.
    direct = RunConfig(
        data=DataOptions(task="sort", tokenizer="byte"),
        optim=OptimOptions(steps=60),
        runtime=RuntimeOptions(out="runs/sort"),
    )
    assert direct == RunConfig.from_options(task="sort", steps=60)
    with pytest.raises(
        BadValue, match="give one of task, data_tsv, data_text, dataset or data_shards, got"
    ):
        DataOptions(tokenizer="byte")
    with pytest.raises(TypeError, match="tokenizer"):
        DataOptions(task="sort")


def test_each_group_checks_its_own_options_and_run_config_the_rest():
    with pytest.raises(BadValue, match="batch_size=6 is not divisible by accum_steps=4"):
        OptimOptions(batch_size=6, accum_steps=4)
    with pytest.raises(BadValue, match="give a mesh or pmap, not both"):
        RuntimeOptions(out="x", mesh="data=1", pmap=True)
    with pytest.raises(BadValue, match="empty or reversed range"):
        RuntimeOptions(out="x", profile="5:5")
    with pytest.raises(BadValue, match="profile='2:50' goes past steps=20"):
        RunConfig.from_options(steps=20, profile="2:50")
    with pytest.raises(BadValue, match="average_checkpoints=4 needs keep_checkpoints >= 4"):
        RunConfig(
            data=DataOptions(task="sort", tokenizer="byte"),
            eval=EvalOptions(average_checkpoints=4),
            runtime=RuntimeOptions(out="x"),
        )


@pytest.mark.parametrize(
    "given, match",
    [
        (
            dict(task="copy"),
            "batch_tokens batches translation pairs: give data_tsv or a translation dataset",
        ),
        (dict(data_text="x.txt"), "batch_tokens batches translation pairs"),
        (dict(data_tsv="x.tsv", accum_steps=2), "batch_tokens=500 makes batches of varying rows"),
        (dict(data_tsv="x.tsv", pmap=True), "accum_steps, a mesh and pmap cannot split"),
        (dict(data_tsv="x.tsv", batch_tokens=0), "batch_tokens must be >= 1"),
    ],
)
def test_token_batches_need_pairs_and_one_unsplit_batch(given, match):
    with pytest.raises(BadValue, match=match):
        RunConfig.from_options(**({"batch_tokens": 500} | given))


def test_resume_settings_are_the_options_marked_resume():
    run = RunConfig.from_options(steps=300, lr=1e-3, seed=4)
    settings = run.resume_settings()
    assert list(settings) == RESUME_KEYS
    assert settings == {k: run.to_dict().get(k) for k in RESUME_KEYS[:-1]} | {
        "cosine_total_steps": 300
    }
    assert RunConfig.from_options(schedule="paper").resume_settings()["cosine_total_steps"] is None
    shared = RunConfig.from_options(shared_lengths=True).resume_settings()
    assert shared["shared_lengths"] is True  # a resume must match it
    tokens = RunConfig.from_options(data_tsv="x.tsv", batch_tokens=500).resume_settings()
    assert tokens["batch_tokens"] == 500 and settings["batch_tokens"] is None


RUN_FILE = """
model: {preset: paper_base, dropout_rate: 0.3}
run: {dataset: toy-pairs, steps: 2000}
"""


def test_a_run_file_holds_the_model_and_the_run_and_options_go_over_it(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(RUN_FILE)
    model, run = load_run(path)
    assert model == TransformerConfig.paper_base(259, dropout_rate=0.3)
    assert run == RunConfig.from_options(dataset="toy-pairs", steps=2000)
    model, run = load_run(path, model={"preset": "tiny", "d_ff": 256}, run={"steps": 10})
    assert model == TransformerConfig.tiny(259, dropout_rate=0.3, d_ff=256)
    assert (run.optim.steps, run.data.tokenizer) == (10, "bpe")
    assert load_run() == (TransformerConfig.tiny(259), RunConfig.from_options())


def test_a_model_file_is_the_model_of_a_run_file(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"d_model": 64, "num_heads": 2}))
    model, run = load_run(str(path))
    assert model == TransformerConfig.tiny(259, d_model=64, num_heads=2)
    assert run == RunConfig.from_options()


@pytest.mark.parametrize(
    "run",
    [
        dict(dataset="toy-pairs", steps=300, eval_beam=1),
        dict(data_text="a.txt", init_from="gpt2-folder"),  # its tokenizer resolves to "byte"
        dict(task="sort", seed=3, out="runs/x"),
    ],
)
def test_a_resolved_configuration_is_a_run_file_of_itself(run):
    """What a run folder's config.json (and a sweep's run.json) holds loads back to the
    same model and run: presets and derived defaults are not applied twice."""
    model, options = TransformerConfig.gpt2_small(300), RunConfig.from_options(**run)
    resolved = json.loads(json.dumps({"model": model.to_dict(), "run": options.to_dict()}))
    assert load_run(resolved) == (model, options)


@pytest.mark.parametrize(
    "text, match",
    [
        ("model: {}\nsteps: 3\n", r"run.yaml: unknown key\(s\) \['steps'\] beside model and run"),
        ("model: {d_modle: 3}\n", r"unknown model key\(s\) \['d_modle'\] \(did you mean 'd_model'"),
        ("steps: 3\n", r"\['steps'\] \('steps' is a run key: put it under run:\)"),
        ("run: {d_model: 3}\n", r"\('d_model' is a model key: put it under model:\)"),
        ("run: [steps]\n", r"run.yaml: run must be a mapping of run fields, got \['steps'\]"),
        ("model: {preset: huge}\n", r"run.yaml: preset must be one of \('tiny', "),
        ("run: {steps: 0}\n", r"run.yaml: steps must be >= 1, got 0"),
    ],
)
def test_a_bad_run_file_is_an_error_naming_the_file_and_the_valid_keys(tmp_path, text, match):
    (tmp_path / "run.yaml").write_text(text)
    with pytest.raises(BadValue, match=match):
        load_run(tmp_path / "run.yaml")


def test_the_command_takes_a_run_file_and_its_options_go_over_it(tmp_path, monkeypatch):
    from jaxformer.cli import main

    trained = []
    monkeypatch.setattr("jaxformer.train.loop.train", lambda *a, **k: trained.append(a))
    (tmp_path / "run.yaml").write_text(RUN_FILE)
    argv = ["train", "--config", str(tmp_path / "run.yaml"), "--preset", "tiny", "--steps", "7"]
    assert main([*argv, "--d-model", "64"]) == 0
    [(model, run)] = trained
    assert model == TransformerConfig.tiny(259, dropout_rate=0.3, d_model=64)
    assert run == RunConfig.from_options(dataset="toy-pairs", steps=7)


MODELS = sorted((pathlib.Path(__file__).resolve().parents[1] / "configs/models").glob("*.yaml"))


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_each_model_file_is_its_preset(path):
    model, _ = load_run(path)
    preset = getattr(TransformerConfig, path.stem)(model.vocab_size)
    assert model == preset


def test_the_model_files_are_the_presets():
    assert [p.stem for p in MODELS] == ["gpt2_small", "paper_base", "tiny"]
