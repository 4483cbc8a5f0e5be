"""BLEU and chrF through sacrebleu, beam-search evaluation, predictions.tsv and checkpoint
averaging at the end of a run."""

import json
import random
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import checkpoints, data, decode
from jaxformer.data.datasets import encode_pairs
from jaxformer.train import loop, setup
from jaxformer.train.evaluate import METRICS

REFERENCES = [
    "The cat sat on the mat.",
    "A dog, quickly running across the road!",
    "Hello world",
    "It's 3.5 km (about 2 miles) away.",
]
HYPOTHESES = [
    "The cat sat on a mat.",
    "The dog runs quickly across the road!",
    "hello world",
    "It is 3.5 km (2 miles) away.",
]


def test_bleu_and_chrf_equal_sacrebleus_command(tmp_path):
    (tmp_path / "ref.txt").write_text("".join(line + "\n" for line in REFERENCES))
    (tmp_path / "hyp.txt").write_text("".join(line + "\n" for line in HYPOTHESES))
    command = [sys.executable, "-m", "sacrebleu", "ref.txt", "-i", "hyp.txt"]
    result = subprocess.run(
        [*command, "-m", "bleu", "chrf", "-b", "-w", "4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    bleu, chrf = json.loads(result.stdout)
    assert 0 < bleu < 100 and 0 < chrf < 100
    assert METRICS["bleu"](HYPOTHESES, REFERENCES) == pytest.approx(bleu, abs=0.01)
    assert METRICS["chrf"](HYPOTHESES, REFERENCES) == pytest.approx(chrf, abs=0.01)


@pytest.fixture(scope="module")
def tsv_run(tmp_path_factory):
    """A 3-step run on a TSV file, checkpoints at every step, the last 3 averaged. Every
    pair fits in 16 tokens: one batch shape, few compilations."""
    tmp = tmp_path_factory.mktemp("bleu")
    rng, words = random.Random(0), "the cat dog sat on a mat ran to big red".split()
    lines = []
    for _ in range(120):
        src = " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
        lines.append(f"{src}\t{' '.join(reversed(src.split()))}\n")
    (tmp / "pairs.tsv").write_text("".join(lines))
    model = jf.TransformerConfig.tiny(
        259, num_encoder_layers=1, num_decoder_layers=1, d_model=16, num_heads=2, d_ff=32
    )
    run = jf.RunConfig.from_options(
        data_tsv=str(tmp / "pairs.tsv"),
        seq_len=16,
        steps=3,
        batch_size=8,
        log_every=1,
        eval_every=2,
        checkpoint_every=1,
        keep_checkpoints=3,
        average_checkpoints=3,
        eval_examples=10,
        out=str(tmp / "run"),
    )
    summary = loop.train(model, run, progress=False)
    return tmp / "run", summary


def test_a_tsv_run_reports_bleu_and_writes_predictions(tsv_run):
    out, summary = tsv_run
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "eval_loss" in r]
    assert [r["step"] for r in evals] == [2, 3, 3]
    assert evals[-1]["averaged_steps"] == [1, 2, 3]
    assert all({"bleu", "chrf", "exact_match"} <= set(r) for r in evals)
    saved = json.loads((out / "summary.json").read_text())
    assert saved["eval_beam"] == 4  # the paper's beam for BLEU-scored data
    assert 0 < saved["eval_seconds"] < saved["wall_seconds"]
    train_seconds = saved["wall_seconds"] - saved["eval_seconds"]  # each rounded to 0.01
    assert saved["train_seconds"] == pytest.approx(train_seconds, abs=0.015)
    assert saved["final_eval"] == {k: v for k, v in evals[1].items() if k != "step"}
    assert saved["averaged_steps"] == [1, 2, 3]
    for key in ("bleu", "chrf", "exact_match", "eval_nll"):  # the delivered model: the average
        assert saved[key] == saved["averaged_eval"][key] == evals[2][key]

    rows = [line.split("\t") for line in (out / "predictions.tsv").read_text().splitlines()]
    dev_pairs = data.TsvData(
        saved["run"]["data_tsv"], data.ByteTokenizer(), max_len=16, dev_size=10
    ).dev_pairs
    assert len(rows) == len(dev_pairs) and all(len(r) == 3 for r in rows)
    assert [(s, t) for s, t, _ in rows] == dev_pairs
    predictions, references = [p for *_, p in rows], [t for _, t, _ in rows]
    assert METRICS["bleu"](predictions, references) == pytest.approx(saved["bleu"])
    assert METRICS["chrf"](predictions, references) == pytest.approx(saved["chrf"])


def test_the_final_model_alone_is_scored_on_the_test_pairs(tsv_run, monkeypatch):
    """Pairs the data holds back for the final model (a Bible dataset's test books; here
    attached to the TSV run's data) are scored once, at the end, and only with
    final_test: test_* and "final_test" in summary.json and the last metrics record,
    their translations in test_predictions.tsv; predictions.tsv keeps the dev pairs'."""
    out, _ = tsv_run
    final = [("the cat", "cat the"), ("a big red dog", "dog red big a"), ("ran", "ran")]
    build = setup.build_data

    def with_final_test(run, tokenizer=None, **kw):
        tok, d = build(run, tokenizer, **kw)
        d.test_pairs = final
        return tok, d

    monkeypatch.setattr(setup, "build_data", with_final_test)
    config = json.loads((out / "config.json").read_text())
    model = jf.TransformerConfig.from_dict(config["model"])
    changes = {"steps": 2, "average_checkpoints": 1, "out": str(out.parent / "dev")}
    dev_only = loop.train(
        model, jf.RunConfig.from_options(**(config["run"] | changes)), progress=False
    )
    assert "final_test" not in dev_only and not any(k.startswith("test_") for k in dev_only)
    assert not (out.parent / "dev/test_predictions.tsv").exists()
    changes |= {"final_test": True, "out": str(out.parent / "final")}
    summary = loop.train(
        model, jf.RunConfig.from_options(**(config["run"] | changes)), progress=False
    )
    assert summary["final_test"] is True and summary["run"]["final_test"] is True
    folder = out.parent / "final"
    rows = [line.split("\t") for line in (folder / "test_predictions.tsv").read_text().splitlines()]
    assert [(s, t) for s, t, _ in rows] == final and summary["test_pairs"] == 3
    spent = summary["eval_seconds"] + summary["test_seconds"]  # the test scoring, apart
    assert summary["test_seconds"] > 0
    assert summary["train_seconds"] == pytest.approx(summary["wall_seconds"] - spent, abs=0.025)
    dev = (folder / "predictions.tsv").read_text()  # the same dev translations
    assert dev.count("\n") == 8 and dev == (out.parent / "dev/predictions.tsv").read_text()
    predictions = [p for *_, p in rows]
    for key in ("bleu", "chrf", "exact_match"):
        assert summary["test_" + key] == METRICS[key](predictions, [t for _, t in final])
    last = json.loads((out.parent / "final/metrics.jsonl").read_text().splitlines()[-1])
    assert last["test_bleu"] == summary["test_bleu"] and "eval_loss" not in last
    assert summary["bleu"] == summary["final_eval"]["bleu"]  # held-out figures unchanged


def test_averaged_parameters_are_the_mean_of_the_last_checkpoints(tsv_run):
    out, _ = tsv_run
    model, _ = checkpoints.restore_model(out)  # run folders with averaged/ give the average
    averaged = nnx.state(model)
    target = ocp.args.Composite(params=ocp.args.StandardRestore(averaged))
    with ocp.CheckpointManager(out / "checkpoints") as manager:
        assert sorted(manager.all_steps()) == [1, 2, 3]
        each = [manager.restore(step, args=target).params for step in (1, 2, 3)]
    hand = jax.tree.map(lambda *p: np.mean([np.asarray(x) for x in p], axis=0), *each)
    for got, want in zip(*map(jax.tree.leaves, (averaged, hand)), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(*map(jax.tree.leaves, (averaged, each[2])), strict=True)
    )


def test_beam_evaluation_is_beam_search_on_the_padded_batch(tsv_run):
    """decode.generate("beam") gives decode.beam_search's best hypotheses of the same
    batch, with one compilation for a full batch and a filled-up one."""
    out, summary = tsv_run
    model, tok = checkpoints.restore_model(out)
    tsv = data.TsvData(summary["run"]["data_tsv"], tok, max_len=16, dev_size=10)
    sources = [s for s, _ in tsv.dev_pairs]  # 10: a batch of 8 and one of 2 padded to 8
    compiled = decode._beam_jit._cache_size()
    options = dict(beam_size=4, alpha=0.6, max_new_tokens=tsv.tgt_len, batch_size=8)
    got = decode.generate(model, tok, sources, "beam", **options)
    assert decode._beam_jit._cache_size() <= compiled + 1

    batch = encode_pairs([(s, "") for s in sources[:8]], tok, tsv.src_len, tsv.tgt_len)
    tokens, _ = decode.beam_search(
        model,
        jnp.asarray(batch["src"]),
        jnp.asarray(batch["src_valid"]),
        beam_size=4,
        alpha=0.6,
        max_new_tokens=tsv.tgt_len,
    )
    assert got[:8] == [tok.decode(row) for row in np.asarray(tokens[:, 0])]
    rows = [line.split("\t") for line in (out / "predictions.tsv").read_text().splitlines()]
    assert got == [p for *_, p in rows]  # the run's final predictions: the averaged model's


def test_final_test_without_a_test_set_is_refused_before_training(tsv_run):
    out, _ = tsv_run
    config = json.loads((out / "config.json").read_text())
    run = jf.RunConfig.from_options(
        **(config["run"] | {"final_test": True, "out": str(out.parent / "no")})
    )
    with pytest.raises(ValueError, match="TsvData has none"):
        loop.train(jf.TransformerConfig.from_dict(config["model"]), run, progress=False)
    assert not (out.parent / "no").exists()
