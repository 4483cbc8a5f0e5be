"""The lm-eval model class (jaxformer_lab.lm_eval) against lm-eval's own Hugging Face
backend on one imported GPT-2-shaped checkpoint and the shipped local multiple-choice
task, and its three request kinds against direct computations with the model."""

import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxformer import decode
from jaxformer.checks import BadType, BadValue, MissingFile
from tests.hf_tokenizers import PRINTABLE, char_level

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "lm_eval_tasks"


lm_eval = pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from lm_eval.api.instance import Instance  # noqa: E402

from jaxformer.interop import hf  # noqa: E402
from jaxformer_lab.lm_eval import JaxformerLM, evaluate, scores  # noqa: E402

ALPHABET = PRINTABLE + "?:\n"
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A GPT-2-shaped Hugging Face folder: a tiny GPT2Config's random weights and a
    character-level tokenizer, saved as transformers saves them (nothing downloaded)."""
    folder = tmp_path_factory.mktemp("lm_eval") / "gpt2"
    folder.mkdir()
    path = char_level(folder / "tokenizer.json", ALPHABET, [EOT])
    eot = len(ALPHABET) + 1
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path), eos_token=EOT, bos_token=EOT, unk_token="[UNK]"
    )
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=eot + 1, n_positions=96, n_embd=32, n_layer=2, n_head=4,
        initializer_range=0.3, bos_token_id=eot, eos_token_id=eot,
    )  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def loaded(folder):
    return hf.load(folder)


def _hf_backend(folder):
    """lm-eval's Hugging Face backend (its HFLM) over the folder's model and tokenizer, as
    transformers loads them. HFLM's module imports accelerate, which it uses only to place
    or launch; where accelerate is not installed, a stand-in that raises if used serves."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        import types

        def unused(*args, **kwargs):
            raise AssertionError("lm-eval used accelerate here")

        stand_in = types.ModuleType("accelerate")
        stand_in.Accelerator = stand_in.InitProcessGroupKwargs = unused
        stand_in.find_executable_batch_size = stand_in.utils = types.ModuleType("accelerate.utils")
        stand_in.find_executable_batch_size, stand_in.utils.get_max_memory = unused, unused
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "accelerate", stand_in)
            patch.setitem(sys.modules, "accelerate.utils", stand_in.utils)
            from lm_eval.models.huggingface import HFLM
    from lm_eval.models.huggingface import HFLM

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=8)


def _choice_scores(results) -> dict[tuple[int, int], float]:
    samples = results["samples"]["tiny_facts"]
    return {(s["doc_id"], i): r[0][0] for s in samples for i, r in enumerate(s["resps"])}


@pytest.mark.slow
def test_loglikelihoods_and_accuracy_equal_lm_evals_hugging_face_backend(folder, loaded):
    ours = evaluate(*loaded, ["tiny_facts"], include_path=TASKS, batch_size=8)
    manager = lm_eval.tasks.TaskManager(include_path=str(TASKS))
    from jaxformer_lab.lm_eval import _local

    theirs = lm_eval.simple_evaluate(
        model=_hf_backend(folder),
        tasks=[_local(manager, "tiny_facts")],
        task_manager=manager,
    )
    a, b = _choice_scores(ours), _choice_scores(theirs)
    assert len(a) == 24 * 4 and a.keys() == b.keys()
    worst = max(abs(a[k] - b[k]) for k in a)
    assert worst <= 1e-4, worst
    assert ours["results"]["tiny_facts"]["acc,none"] == theirs["results"]["tiny_facts"]["acc,none"]
    assert (
        ours["results"]["tiny_facts"]["acc_norm,none"]
        == (theirs["results"]["tiny_facts"]["acc_norm,none"])
    )
    assert set(scores(ours)) >= {"tiny_facts/acc", "tiny_facts/acc_norm"}


def _log_probs(model, inputs: list[int]) -> np.ndarray:
    """log p(next | inputs[:t + 1]) [T, V] of one unpadded row, in NumPy."""
    logits = np.asarray(model(np.asarray([inputs], np.int32))[0], np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _rolling_reference(model, tokens: list[int], bos: int) -> float:
    """The sum of every token's log-prob: chunks of max_len predicted tokens, each read
    from the max_len tokens (BOS first) that precede its last one."""
    L, u, total = model.config.max_len, [bos, *tokens], 0.0
    for s in range(0, len(tokens), L):
        e = min(s + L, len(tokens))
        lo = max(0, e - L)
        lp = _log_probs(model, u[lo:e])
        targets = u[lo + 1 : e + 1]
        total += sum(lp[i, targets[i]] for i in range(len(targets) - (e - s), len(targets)))
    return total


@pytest.mark.parametrize("jit", [True, False])
def test_loglikelihood_rolling_is_the_sum_of_token_log_probs(loaded, jit):
    model, tokenizer = loaded
    lm = JaxformerLM(model, tokenizer, batch_size=2)
    texts = ["Question: What is two plus two?", "The quick brown fox. " * 10, "a"]
    with jax.disable_jit(not jit):
        got = lm.loglikelihood_rolling(
            [Instance("loglikelihood_rolling", {}, (t,), 0) for t in texts]
        )
    want = [_rolling_reference(model, tokenizer.encode(t), tokenizer.bos_id) for t in texts]
    assert len(tokenizer.encode(texts[1])) > 2 * model.config.max_len  # three windows
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_loglikelihood_is_the_continuations_log_prob_and_greedy_flag(loaded):
    model, tokenizer = loaded
    lm = JaxformerLM(model, tokenizer, batch_size=3)
    pairs = [("Question: Which", " planet"), ("Hi", " there you"), ("", "abc")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, 0) for p in pairs])
    for (context, continuation), (ll, is_greedy) in zip(pairs, got, strict=True):
        ctx = tokenizer.encode(context) if context else [tokenizer.bos_id]
        cont = tokenizer.encode(continuation)
        whole = ctx + cont
        lp = _log_probs(model, whole[:-1])[len(ctx) - 1 :]
        assert ll == pytest.approx(sum(lp[i, c] for i, c in enumerate(cont)), abs=1e-4)
        assert is_greedy == all(lp[i].argmax() == c for i, c in enumerate(cont))


def test_generate_until_is_greedy_decoding_cut_at_the_stop_sequence(loaded):
    model, tokenizer = loaded
    lm = JaxformerLM(model, tokenizer, batch_size=2, max_gen_toks=30)
    prompts, n = ["Question: What", "Hi", "The capital of France is"], 12
    full = []
    for p in prompts:
        row = np.asarray([tokenizer.encode(p)], np.int32)
        ids = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
        tokens = decode.greedy(model, row, max_new_tokens=n, **ids)
        full.append(tokenizer.decode(np.asarray(tokens[0]).tolist()))
    assert all(len(text) >= 4 for text in full), full  # a stop sequence inside each
    stops = [text[3] for text in full]
    requests = [
        Instance("generate_until", {}, (p, {"until": [s], "max_gen_toks": n}), 0)
        for p, s in zip(prompts, stops, strict=True)
    ]
    got = lm.generate_until(requests)
    assert got == [text[: text.index(s)] for text, s in zip(full, stops, strict=True)]
    assert all(len(g) <= 3 < len(t) for g, t in zip(got, full, strict=True))
    # No stop sequence: max_gen_toks alone ends it (greedy's first n tokens are the same).
    uncut = lm.generate_until([Instance("generate_until", {}, (prompts[0], {"until": []}), 0)])
    assert uncut[0].startswith(full[0]) and len(uncut[0]) > len(full[0])


def test_bad_inputs_are_one_line(loaded, tmp_path):
    model, tokenizer = loaded
    from jaxformer.config import TransformerConfig
    from jaxformer.models import Transformer

    seq2seq = Transformer(TransformerConfig.tiny(40), rngs=__import__("flax").nnx.Rngs(0))
    with pytest.raises(BadType, match="model"):
        JaxformerLM(seq2seq, tokenizer)
    with pytest.raises(BadValue, match="batch_size must be a positive integer, got 'auto'"):
        JaxformerLM(model, tokenizer, batch_size="auto")
    lm = JaxformerLM(model, tokenizer)
    with pytest.raises(BadValue, match="greedily"):
        lm.generate_until([Instance("generate_until", {}, ("Hi", {"do_sample": True}), 0)])
    with pytest.raises(MissingFile, match="no such folder"):
        evaluate(model, tokenizer, ["tiny_facts"], include_path=tmp_path / "none")
    with pytest.raises(BadValue, match=r"no task \['nope'\] in"):
        evaluate(model, tokenizer, ["nope"], include_path=TASKS)


@pytest.mark.slow
def test_the_command_prints_the_table_and_writes_results(folder, tmp_path):
    out = tmp_path / "results.json"
    args = [str(folder), "--tasks", "tiny_facts", "--include-path", str(TASKS)]
    args += ["--limit", "6", "--batch-size", "4", "--output", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "jaxformer", "eval", *args], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tiny_facts" in done.stdout.splitlines()[2] and "acc" in done.stdout
    saved = json.loads(out.read_text())
    assert len(saved["samples"]["tiny_facts"]) == 6
    bad = subprocess.run(
        [sys.executable, "-m", "jaxformer", "eval", str(tmp_path / "none"), "--tasks", "x"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.slow
def test_a_training_run_scores_its_tasks_into_metrics_jsonl(tmp_path):
    """`during_training`'s hook scores the tasks at its steps and the end; the logged score
    is the one `evaluate` gives the checkpoint of that step."""
    import jaxformer as jf
    from jaxformer.checkpoints import restore_model
    from jaxformer.train import train
    from jaxformer_lab.lm_eval import during_training

    text = tmp_path / "book.txt"
    text.write_text("\n\n".join(f"Question: what is {i}? Answer: {i}" for i in range(60)))
    run = jf.RunConfig.from_options(
        data_text=str(text), out=str(tmp_path / "lm"), seq_len=32, steps=2, batch_size=4
    )
    hook = during_training(["tiny_facts"], str(TASKS), every=2, limit=6)
    train(jf.TransformerConfig.tiny(1), run, progress=False, hooks=[hook])
    rows = [
        json.loads(line) for line in (tmp_path / "lm" / "metrics.jsonl").read_text().splitlines()
    ]
    logged = next(r for r in rows if "lm_eval/tiny_facts/acc" in r)
    assert logged["step"] == 2
    results = evaluate(*restore_model(tmp_path / "lm"), ["tiny_facts"], include_path=TASKS, limit=6)
    again = scores(results)
    assert {k: logged[f"lm_eval/{k}"] for k in again} == again
    assert len(results["samples"]["tiny_facts"]) == 6
