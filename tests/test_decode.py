"""Decoding: the KV cache against full forward passes, and greedy, sampling and beam search
against references computed from full forward passes (teacher forcing) or by brute force."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import decode
from jaxformer.data import ByteTokenizer
from jaxformer.data.datasets import pad_rows
from jaxformer.train import seeds as seed_axis
from tests import hf_tokenizers as hf

V = 20
N = 8  # new tokens in the decoding tests
POSITIONS = ["sinusoidal", "learned", "rope", "none"]
_MODELS = {}


def model(kind, position_embedding="sinusoidal"):
    """Tiny models (grouped-query attention, d_k != d_v) built once per (kind, positions)."""
    key = (kind, position_embedding)
    if key not in _MODELS:
        c = jf.TransformerConfig(
            vocab_size=V,
            num_encoder_layers=2,
            num_decoder_layers=2,
            d_model=32,
            d_ff=64,
            num_heads=4,
            num_kv_heads=2,
            d_k=6,
            d_v=10,
            max_len=32,
            position_embedding=position_embedding,
        )
        cls = jf.Transformer if kind == "transformer" else jf.DecoderLM
        _MODELS[key] = cls(c, rngs=nnx.Rngs(7))
    return _MODELS[key]


def padded(lengths, width, seed):
    """Random token rows (ids 3..V-1) of the given lengths, right-padded, and their mask."""
    tokens = np.random.default_rng(seed).integers(3, V, (len(lengths), width))
    valid = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
    return jnp.asarray(np.where(valid, tokens, 0), jnp.int32), jnp.asarray(valid)


# Sources / prompts of different lengths in one batch, including a prompt of length 1.
LENGTHS = {"transformer": [2, 6, 4], "lm": [1, 5, 3]}


def inputs(kind):
    return padded(LENGTHS[kind], max(LENGTHS[kind]), seed=1)


# --- the cache ------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", POSITIONS)
def test_lm_cached_logits_equal_the_full_forward_pass(positions):
    m = model("lm", positions)
    lengths = np.array(LENGTHS["lm"])
    T, n = lengths.max(), 6
    # Row b is the sequence full[b, :lengths[b] + n]: its prompt, then n more tokens.
    full = jnp.asarray(np.random.default_rng(2).integers(3, V, (3, T + n)), jnp.int32)
    want = m(full)  # causal, so positions < lengths[b] + n see only row b's sequence
    valid = jnp.arange(T)[None, :] < lengths[:, None]
    cache = m.init_cache(3, max_len=T + n)
    logits, cache = m.extend(jnp.where(valid, full[:, :T], 0), cache, valid)
    for b, length in enumerate(lengths):
        np.testing.assert_allclose(logits[b, :length], want[b, :length], atol=1e-5, rtol=0)
    rows = np.arange(3)
    for t in range(n):
        logits, cache = m.extend(full[rows, lengths + t][:, None], cache)
        np.testing.assert_allclose(logits[:, 0], want[rows, lengths + t], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(cache.lengths, lengths + n)


@pytest.mark.parametrize("positions", POSITIONS)
def test_transformer_cached_logits_equal_the_full_forward_pass(positions):
    m = model("transformer", positions)
    src, src_valid = inputs("transformer")
    tgt = jnp.asarray(np.random.default_rng(3).integers(3, V, (3, 7)), jnp.int32).at[:, 0].set(1)
    want = m(src, tgt, src_valid)
    for prefill in (1, 3):  # BOS alone, and a longer forced prefix
        cache = m.init_cache(src, src_valid, max_len=7)
        logits, cache = m.extend(tgt[:, :prefill], cache)
        np.testing.assert_allclose(logits, want[:, :prefill], atol=1e-5, rtol=0)
        for t in range(prefill, 7):
            logits, cache = m.extend(tgt[:, t : t + 1], cache)
            np.testing.assert_allclose(logits[:, 0], want[:, t], atol=1e-5, rtol=0)


def test_cache_holds_the_memory_projected_once():
    m = model("transformer")
    src, src_valid = inputs("transformer")
    cache = m.init_cache(src, src_valid, max_len=5)
    memory = m.encode(src, src_valid)
    layer = m.decoder.layers[1]
    np.testing.assert_allclose(
        cache.layers[1].cross_attn.k, jnp.einsum("bse,ekd->bskd", memory, layer.cross_attn.wk[...])
    )
    assert cache.layers[0].self_attn.k.shape == (3, 5, 2, 6)
    assert cache.layers[0].self_attn.v.shape == (3, 5, 2, 10)


def test_cache_length_is_checked():
    with pytest.raises(ValueError, match="max_len=33 positions exceeds the model's max_len=32"):
        model("lm").init_cache(2, max_len=33)
    model("lm", "rope").init_cache(2, max_len=33)  # no position table: no limit


# --- references from full forward passes ----------------------------------------------------


def forced_log_probs(kind, m, src, valid, out, bos_id=1):
    """log p(out[b, t] | everything before) [B, N] from one teacher-forced forward pass
    (an encoder-decoder's target starting from bos_id)."""
    B, n = out.shape
    if kind == "transformer":
        tgt_in = jnp.concatenate([jnp.full((B, 1), bos_id, jnp.int32), out[:, :-1]], axis=1)
        logits = m(src, tgt_in, valid)
    else:
        lengths = np.asarray(valid).sum(1)
        seq = np.zeros((B, src.shape[1] + n), np.int32)
        for b, length in enumerate(lengths):
            seq[b, :length] = np.asarray(src)[b, :length]
            seq[b, length : length + n] = np.asarray(out)[b]
        index = lengths[:, None] - 1 + np.arange(n)
        logits = jnp.take_along_axis(m(jnp.asarray(seq)), jnp.asarray(index)[:, :, None], axis=1)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return log_probs, jnp.take_along_axis(log_probs, out[:, :, None], axis=2)[:, :, 0]


def hypothesis_length(row, eos_id):
    """Tokens up to and including the first EOS (all of them without one)."""
    hits = np.flatnonzero(np.asarray(row) == eos_id)
    return int(hits[0]) + 1 if hits.size else len(row)


def gnmt_score(token_log_probs, length, alpha):
    return (
        float(np.sum(np.asarray(token_log_probs, np.float64)[:length]))
        / ((5.0 + length) / 6.0) ** alpha
    )


_EOS = {}


def eos_for(kind):
    """An EOS id that the untrained model emits in row 0 at step 3, so EOS paths run."""
    if kind not in _EOS:
        out = decode.greedy(model(kind), *inputs(kind), max_new_tokens=N, eos_id=None)
        _EOS[kind] = int(out[0, 2])
    return _EOS[kind]


# --- greedy and sampling --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["transformer", "lm"])
def test_greedy_is_the_argmax_of_a_full_forward_pass(kind):
    m, (src, valid), eos = model(kind), inputs(kind), eos_for(kind)
    out = decode.greedy(m, src, valid, max_new_tokens=N, eos_id=eos)
    log_probs, _ = forced_log_probs(kind, m, src, valid, out)
    for b in range(src.shape[0]):
        length = hypothesis_length(out[b], eos)
        np.testing.assert_array_equal(out[b, :length], jnp.argmax(log_probs[b, :length], -1))
        assert (np.asarray(out[b, length:]) == 0).all()  # PAD after EOS
    assert hypothesis_length(out[0], eos) <= 3  # EOS was emitted


@pytest.mark.parametrize("kind", ["transformer", "lm"])
def test_sampling_limits_and_seeds(kind):
    m, (src, valid), eos = model(kind), inputs(kind), eos_for(kind)
    greedy = decode.greedy(m, src, valid, max_new_tokens=N, eos_id=eos)
    kw = dict(max_new_tokens=N, eos_id=eos)
    cold = decode.sample(m, src, valid, rng=0, temperature=1e-6, **kw)
    np.testing.assert_array_equal(cold, greedy)
    np.testing.assert_array_equal(decode.sample(m, src, valid, rng=1, top_k=1, **kw), greedy)
    np.testing.assert_array_equal(decode.sample(m, src, valid, rng=1, top_p=1e-6, **kw), greedy)
    a = decode.sample(m, src, valid, rng=5, temperature=2.0, **kw)
    np.testing.assert_array_equal(a, decode.sample(m, src, valid, rng=5, temperature=2.0, **kw))
    assert not np.array_equal(a, decode.sample(m, src, valid, rng=6, temperature=2.0, **kw))


@pytest.mark.parametrize("kind", ["transformer", "lm"])
def test_sampled_tokens_lie_in_the_top_k_and_nucleus(kind):
    m, (src, valid) = model(kind), inputs(kind)
    for top_k, top_p in ((3, 1.0), (None, 0.5), (4, 0.7)):
        out = decode.sample(
            m, src, valid, max_new_tokens=N, eos_id=None, rng=3, top_k=top_k, top_p=top_p
        )
        log_probs, _ = forced_log_probs(kind, m, src, valid, out)
        probs = np.exp(np.asarray(log_probs, np.float64))
        for b, t in itertools.product(range(src.shape[0]), range(N)):
            keep = nucleus_reference(np.log(probs[b, t]), 1.0, top_k, top_p)
            assert keep[int(out[b, t])], (b, t, top_k, top_p)


def nucleus_reference(logits, temperature, top_k, top_p):
    """NumPy: the tokens top-k then top-p sampling may draw (True = kept)."""
    z = np.asarray(logits, np.float64) / temperature
    keep = np.ones(z.shape, bool)
    if top_k is not None:
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    p = np.where(keep, np.exp(z - z.max()), 0.0)
    p /= p.sum()
    # Token i stays iff the tokens strictly more probable than i hold mass < top_p.
    more_probable_mass = np.array([p[p > p[i]].sum() for i in range(len(p))])
    return keep & ((more_probable_mass < top_p) | (top_p >= 1.0))


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("top_k", [None, 1, 4])
def test_filter_logits_matches_numpy_nucleus(top_k, top_p):
    rng = np.random.default_rng(int(top_p * 100) + (top_k or 0))
    logits = rng.standard_normal((6, 30)) * 2.0
    logits[0, 5:9] = logits[0, 1]  # ties
    filtered = np.asarray(
        jax.jit(decode.filter_logits)(
            jnp.asarray(logits, jnp.float32), temperature=0.7, top_k=top_k, top_p=top_p
        )
    )
    for row, got in zip(logits, filtered, strict=True):
        want = nucleus_reference(row.astype(np.float32), 0.7, top_k, top_p)
        np.testing.assert_array_equal(np.isfinite(got), want)
        np.testing.assert_allclose(got[want], row[want] / 0.7, rtol=1e-6)


def test_sampling_frequencies_follow_the_renormalised_nucleus():
    logits = jnp.asarray(np.random.default_rng(0).standard_normal(12), jnp.float32)
    filtered = decode.filter_logits(logits, top_p=0.6)
    draws = jax.random.categorical(jax.random.PRNGKey(0), filtered, shape=(40_000,))
    keep = nucleus_reference(np.asarray(logits), 1.0, None, 0.6)
    p = np.where(keep, np.exp(np.asarray(logits, np.float64)), 0.0)
    freq = np.bincount(np.asarray(draws), minlength=12) / 40_000
    np.testing.assert_allclose(freq, p / p.sum(), atol=0.01)


# --- beam search ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["transformer", "lm"])
def test_beam_size_one_is_greedy(kind):
    m, (src, valid), eos = model(kind), inputs(kind), eos_for(kind)
    greedy = decode.greedy(m, src, valid, max_new_tokens=N, eos_id=eos)
    tokens, _ = decode.beam_search(m, src, valid, beam_size=1, max_new_tokens=N, eos_id=eos)
    np.testing.assert_array_equal(tokens[:, 0], greedy)


@pytest.mark.parametrize("kind", ["transformer", "lm"])
def test_beam_scores_are_right_and_never_worse_than_greedy(kind):
    m, (src, valid), eos = model(kind), inputs(kind), eos_for(kind)
    tokens, scores = decode.beam_search(m, src, valid, max_new_tokens=N, eos_id=eos)
    assert tokens.shape == (3, 4, N) and scores.shape == (3, 4)  # the paper's beam of 4
    assert (np.diff(np.asarray(scores), axis=1) <= 0).all()  # best first
    greedy = decode.greedy(m, src, valid, max_new_tokens=N, eos_id=eos)
    _, greedy_lp = forced_log_probs(kind, m, src, valid, greedy)
    for w in range(4):
        _, lp = forced_log_probs(kind, m, src, valid, tokens[:, w])
        for b in range(3):
            score = gnmt_score(lp[b], hypothesis_length(tokens[b, w], eos), 0.6)
            np.testing.assert_allclose(scores[b, w], score, rtol=1e-5, atol=1e-5)
    for b in range(3):
        g = gnmt_score(greedy_lp[b], hypothesis_length(greedy[b], eos), 0.6)
        assert float(scores[b, 0]) >= g - 1e-5


@pytest.mark.slow  # a trained run decoded three ways: 20 s of CI's quick suite
def test_decoding_starts_from_the_tokenizers_bos_and_pads_with_its_pad(tmp_path):
    tok = hf.seq2seq(tmp_path, alphabet="abcdefghijklmno")  # specials 16, 17, 18 < V = 20
    m, (src, valid) = model("transformer"), inputs("transformer")
    ids = dict(bos_id=tok.bos_id, eos_id=None, pad_id=tok.pad_id)
    out = decode.greedy(m, src, valid, max_new_tokens=N, **ids)
    log_probs, _ = forced_log_probs("transformer", m, src, valid, out, bos_id=tok.bos_id)
    np.testing.assert_array_equal(out, jnp.argmax(log_probs, -1))
    assert not np.array_equal(out, decode.greedy(m, src, valid, max_new_tokens=N, eos_id=None))
    cold = decode.sample(m, src, valid, max_new_tokens=N, rng=0, temperature=1e-6, **ids)
    np.testing.assert_array_equal(cold, out)
    tokens, scores = decode.beam_search(m, src, valid, beam_size=2, max_new_tokens=N, **ids)
    _, beam_lp = forced_log_probs("transformer", m, src, valid, tokens[:, 0], bos_id=tok.bos_id)
    for b in range(3):
        np.testing.assert_allclose(scores[b, 0], gnmt_score(beam_lp[b], N, 0.6), rtol=1e-5)
    # An EOS the model emits in row 0 at step 3: the rest of that row is the tokenizer's pad.
    eos = int(out[0, 2])
    stopped = decode.greedy(m, src, valid, max_new_tokens=N, **ids | {"eos_id": eos})
    length = hypothesis_length(stopped[0], eos)
    assert length <= 3 and (np.asarray(stopped[0, length:]) == tok.pad_id).all()


def test_generate_applies_interventions_as_each_search_does(tmp_path):
    """decode.generate(..., interventions=) gives what greedy, sample and beam_search give
    with the same interventions on the same padded rows, and not what they give without."""
    from jaxformer import capture

    tok = hf.seq2seq(tmp_path, alphabet="abcdefghijklmnop")  # V = 20 ids, as the model's
    m, texts = model("transformer"), ["abc", "defgh"]
    rows = [tok.encode(t) + [tok.eos_id] for t in texts]
    src, valid = pad_rows(rows, 16, tok.pad_id)  # generate's pad_multiple
    site = {"decoder/0/cross_attention/heads": capture.ablate_heads([0, 1, 2, 3])}
    ids = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
    key = jax.random.fold_in(jax.random.PRNGKey(0), 0)  # generate's for its first batch, seed 0
    searches = {
        "greedy": lambda **kw: decode.greedy(m, src, valid, max_new_tokens=N, **ids, **kw),
        "sample": lambda **kw: decode.sample(m, src, valid, max_new_tokens=N, rng=key, **ids, **kw),
        "beam": lambda **kw: decode.beam_search(m, src, valid, max_new_tokens=N, **ids, **kw)[0][
            :, 0
        ],
    }
    for strategy, search in searches.items():
        got = decode.generate(m, tok, texts, strategy, max_new_tokens=N, interventions=site)
        assert got == [tok.decode(row) for row in np.asarray(search(interventions=site))]
        plain = decode.generate(m, tok, texts, strategy, max_new_tokens=N)
        assert plain == [tok.decode(row) for row in np.asarray(search())]
    assert got != plain  # the source, cut off from the decoder, changes what comes out


@pytest.mark.slow  # tens of seconds of cold compiling in CI; make test-all runs it
def test_beam_default_length_is_the_input_length_plus_50():
    m = model("transformer", "rope")  # no position table, so nothing caps the paper's rule
    src, valid = padded([1, 3], 3, seed=4)
    tokens, scores = decode.beam_search(m, src, valid, beam_size=2, eos_id=None, pad_id=7)
    assert tokens.shape == (2, 2, 53)
    _, lp = forced_log_probs("transformer", m, src, valid, tokens[:, 0])
    for b, cap in enumerate([51, 53]):  # without EOS every hypothesis runs to its row's cap
        np.testing.assert_allclose(scores[b, 0], gnmt_score(lp[b], cap, 0.6), rtol=1e-5)
        assert (np.asarray(tokens[b, :, cap:]) == 7).all()  # then the filler, pad_id


def markov_step(tables):
    """A toy model: the next-token logits depend on the row and the last token."""

    def step(rows, tokens):
        return tables[rows, tokens], rows

    return step


def test_beam_search_wide_enough_is_exhaustive_search():
    Vt, n, W, eos, alpha = 4, 4, 64, 3, 0.6  # W = Vt^(n-1): nothing is ever pruned
    rng = np.random.default_rng(0)
    tables = jnp.asarray(rng.standard_normal((2, Vt, Vt)) * 2, jnp.float32)
    first = jnp.asarray(rng.standard_normal((2, Vt)) * 2, jnp.float32)
    row_max = np.array([4, 3])
    tokens, scores = jax.jit(
        lambda: decode.run_beam_search(
            markov_step(tables),
            jnp.repeat(jnp.arange(2), W),
            jnp.repeat(first, W, axis=0),
            beam_size=W,
            alpha=alpha,
            row_max_len=jnp.asarray(row_max),
            max_new_tokens=n,
            eos_id=eos,
        )
    )()
    lp_first = np.asarray(jax.nn.log_softmax(first), np.float64)
    lp_next = np.asarray(jax.nn.log_softmax(tables), np.float64)
    for b in range(2):
        found = {}
        for length in range(1, row_max[b] + 1):
            for seq in itertools.product(range(Vt), repeat=length):
                if eos in seq[:-1] or (length < row_max[b] and seq[-1] != eos):
                    continue  # not a finished hypothesis
                logp = lp_first[b, seq[0]] + sum(
                    lp_next[b, a, c] for a, c in itertools.pairwise(seq)
                )
                found[seq] = logp / ((5.0 + length) / 6.0) ** alpha
        best = sorted(found.items(), key=lambda kv: -kv[1])[:W]
        got_scores = np.asarray(scores[b])
        np.testing.assert_allclose(got_scores[: len(best)], [s for _, s in best], rtol=1e-5)
        assert np.isneginf(got_scores[len(best) :]).all()
        for (seq, _), row in zip(best, np.asarray(tokens[b]), strict=False):
            assert tuple(row[: len(seq)]) == seq and (row[len(seq) :] == 0).all()


def test_loops_stop_when_every_row_has_finished():
    calls = []

    def step(state, tokens):
        jax.debug.callback(lambda: calls.append(1))
        return jnp.zeros((tokens.shape[0], 5)).at[:, 2].set(9.0), state

    start = jnp.zeros((3, 5)).at[:, 4].set(9.0)  # first token 4, then EOS = 2
    out = jax.jit(
        lambda: decode.run_sampling(
            step,
            jnp.zeros(3),
            start,
            max_new_tokens=20,
            eos_id=2,
            choose=lambda logits, key: jnp.argmax(logits, -1),
            rng=jax.random.PRNGKey(0),
        )
    )()
    jax.effects_barrier()
    assert len(calls) == 1
    np.testing.assert_array_equal(out[:, :3], [[4, 2, 0]] * 3)
    calls.clear()
    tokens, _ = jax.jit(
        lambda: decode.run_beam_search(
            step,
            jnp.zeros(6),
            jnp.repeat(start, 2, axis=0),
            beam_size=2,
            alpha=0.6,
            row_max_len=jnp.array([20, 20, 20]),
            max_new_tokens=20,
            eos_id=2,
        )
    )()
    jax.effects_barrier()
    # Step 1 finishes the likeliest hypothesis; no live one can beat it after a few more.
    assert 1 <= len(calls) < 19
    np.testing.assert_array_equal(tokens[:, 0, :3], [[4, 2, 0]] * 3)


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m, s: decode.sample(m, s, max_new_tokens=2, temperature=0.0), ValueError, "temperature must be > 0"),
        (lambda m, s: decode.sample(m, s, max_new_tokens=2, temperature=-1.0), ValueError, "temperature must be > 0"),
        (lambda m, s: decode.sample(m, s, max_new_tokens=2, top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
        (lambda m, s: decode.sample(m, s, max_new_tokens=2, top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
        (lambda m, s: decode.sample(m, s, max_new_tokens=2, top_k=0), ValueError, "top_k must be >= 1, got 0"),
        (lambda m, s: decode.sample(m, s, max_new_tokens=2, top_k=21), ValueError, r"top_k must be <= 20 \(the vocabulary\), got 21"),
        (lambda m, s: decode.beam_search(m, s, beam_size=0), ValueError, "beam_size must be >= 1, got 0"),
        (lambda m, s: decode.beam_search(m, s, beam_size=21), ValueError, "exceeds the vocabulary"),
        (lambda m, s: decode.beam_search(m, s, alpha=-0.1), ValueError, "alpha must be >= 0, got -0.1"),
        (lambda m, s: decode.greedy(m, s, max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
        (lambda m, s: decode.greedy(m, s, max_new_tokens=33), ValueError, "does not fit the model's max_len=32"),
        (lambda m, s: decode.greedy(m, jnp.ones((1, 33), jnp.int32), max_new_tokens=1), ValueError, "length 33 > the model's max_len=32"),
        (lambda m, s: decode.greedy(m, s.astype(jnp.float32), max_new_tokens=1), TypeError, "must be an integer array of token ids"),
        (lambda m, s: decode.greedy(jf.Encoder(m.config, rngs=nnx.Rngs(0)), s, max_new_tokens=1), TypeError, "model must be a Transformer or DecoderLM, got Encoder"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("kind", ["transformer", "lm"])
def test_bad_input_is_named(kind, call, error, match):
    with pytest.raises(error, match=match):
        call(model(kind), jnp.ones((2, 3), jnp.int32))


def test_lm_prompts_must_be_right_padded_and_non_empty():
    m, src = model("lm"), jnp.ones((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="a prefix of each prompt"):
        decode.greedy(m, src, jnp.array([[True, False, True]] * 2), max_new_tokens=2)
    with pytest.raises(ValueError, match="every prompt needs >= 1 real token"):
        decode.greedy(m, src, jnp.array([[True, False, False], [False] * 3]), max_new_tokens=2)
    with pytest.raises(ValueError, match="does not fit"):  # prompt 3 + 30 new > max_len 32
        decode.greedy(m, src, max_new_tokens=31)


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_seeds_decodes_each_model_as_generate_does(beam):
    """k models of one structure in one vmapped program per batch, each batch padded to
    the widest of the k: every model's translations as its own `generate` gives them."""
    tok = ByteTokenizer()
    config = jf.TransformerConfig.tiny(tok.vocab_size)
    models = [jf.Transformer(config, rngs=nnx.Rngs(s)) for s in range(3)]
    texts = [[f"row {i} " + "xy" * ((i * (s + 2)) % 7) for i in range(11)] for s in range(3)]
    options = dict(beam_size=beam, alpha=0.6, max_new_tokens=12, batch_size=4, pad_multiple=8)
    together = decode.translate_seeds(
        nnx.split(models[0])[0],
        seed_axis.stack([nnx.state(m) for m in models]),
        tok,
        texts,
        **options,
        max_len=config.max_len,
    )
    strategy = "beam" if beam > 1 else "greedy"
    assert together == [
        decode.generate(m, tok, t, strategy, **options) for m, t in zip(models, texts, strict=True)
    ]
    with pytest.raises(ValueError, match="as many texts"):
        decode.translate_seeds(
            nnx.split(models[0])[0], None, tok, [["a"], []], **options, max_len=config.max_len
        )
