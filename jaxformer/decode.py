"""Autoregressive decoding with a KV cache: greedy, sampling and beam search, and
`generate`, the one text -> text path (the `generate` command and evaluation use it).

`src_tokens` [B, S] are a `Transformer`'s sources (the encoder and the cross-attention
keys and values run once) or a `DecoderLM`'s right-padded prompts [B, T]; `src_valid`
marks the real tokens; each prompt row keeps its own positions 0, 1, ... in the cache.
The prompt is prefilled in one call, then `model.extend` writes one token per step in one
`lax.while_loop`. Outputs hold only the generated tokens: each row up to and including its
first EOS, then `pad_id` filler. `run_sampling` and `run_beam_search` take any step function
`step(state, tokens [B]) -> (logits [B, V], state)`."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.checks import (
    BadValue,
    as_given,
    check_instance,
    check_int,
    check_int_array,
    check_number,
    check_rank,
    check_shape,
    is_int,
)
from jaxformer.data.datasets import pad_rows
from jaxformer.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from jaxformer.functional import sites
from jaxformer.models import DecoderLM, Transformer

Step = Callable[[Any, jax.Array], tuple[jax.Array, Any]]

PAPER_EXTRA_LENGTH = 50  # maximum output length = input length + 50 (section 6.1)


def greedy(
    model: Transformer | DecoderLM,
    src_tokens: jax.Array,
    src_valid: jax.Array | None = None,
    *,
    max_new_tokens: int,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    pad_id: int = PAD_ID,
    interventions: dict[str, Callable] | None = None,
) -> jax.Array:
    """The argmax token at every step: src [B, S] (or prompts) -> tokens [B, max_new_tokens].

    interventions: {site: function of its value} applied in every forward pass (prefill and
    each step; see jaxformer.capture), here and in `sample` and `beam_search`."""
    n = _check_common(model, src_tokens, src_valid, max_new_tokens)
    graphdef, state = nnx.split(model)
    ids, changes = _ids(bos_id, eos_id, pad_id, model.config.vocab_size), _static(interventions)
    return _sample_jit(graphdef, state, src_tokens, src_valid, ids, None, n, changes)


def sample(
    model: Transformer | DecoderLM,
    src_tokens: jax.Array,
    src_valid: jax.Array | None = None,
    *,
    max_new_tokens: int,
    rng: jax.Array | int = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    pad_id: int = PAD_ID,
    interventions: dict[str, Callable] | None = None,
) -> jax.Array:
    """Ancestral sampling: src [B, S] (or prompts) -> tokens [B, max_new_tokens], each step
    drawn from the logits `filter_logits` leaves; `rng` is a key or an int seed."""
    n = _check_common(model, src_tokens, src_valid, max_new_tokens)
    V = model.config.vocab_size
    check_sampling_options(temperature, top_k, top_p, vocab_size=V)
    key = jax.random.PRNGKey(rng) if is_int(rng) else rng
    # Traced, so that one compiled loop serves every temperature, top_k and top_p.
    filters = (
        jnp.float32(temperature),
        jnp.int32(V if top_k is None else top_k),
        jnp.float32(top_p),
    )
    graphdef, state = nnx.split(model)
    ids, changes = _ids(bos_id, eos_id, pad_id, V), _static(interventions)
    return _sample_jit(graphdef, state, src_tokens, src_valid, ids, (key, filters), n, changes)


def beam_search(
    model: Transformer | DecoderLM,
    src_tokens: jax.Array,
    src_valid: jax.Array | None = None,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_new_tokens: int | None = None,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    pad_id: int = PAD_ID,
    interventions: dict[str, Callable] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Beam search with the GNMT length penalty, the paper's beam 4 and alpha 0.6: tokens
    [B, beam_size, N] and scores [B, beam_size], best first; a pool entry never filled has
    score -inf and `pad_id` tokens.

    A hypothesis of n tokens (EOS included) and log-probability L scores
    L / ((5 + n) / 6) ** alpha. Finished hypotheses move to a per-row pool of the best
    `beam_size`; the search stops when no live one can still enter it. A row's maximum
    length is its input's length + 50, or `max_new_tokens` when given."""
    _check_model(model, src_tokens, src_valid)
    check_beam_options(beam_size, alpha, vocab_size=model.config.vocab_size)
    input_lens = np.asarray(_valid_or_all(src_tokens, src_valid).sum(axis=1))
    if max_new_tokens is None:
        n = min(src_tokens.shape[1] + PAPER_EXTRA_LENGTH, _capacity(model, src_tokens))
        row_max = np.minimum(input_lens + PAPER_EXTRA_LENGTH, n)
    else:
        n = _check_common(model, src_tokens, src_valid, max_new_tokens)
        row_max = np.full_like(input_lens, n)
    graphdef, state = nnx.split(model)
    return _beam_jit(
        graphdef,
        state,
        src_tokens,
        src_valid,
        jnp.asarray(row_max, jnp.int32),
        jnp.float32(alpha),
        _ids(bos_id, eos_id, pad_id, model.config.vocab_size),
        n,
        beam_size,
        _static(interventions),
    )


STRATEGIES = ("greedy", "sample", "beam")


def generate(model, tokenizer, texts: list[str], strategy: str = "greedy", **options) -> list[str]:
    """The decoded continuation of each text, as one list: `generate_batches`' outputs
    (the same arguments and options)."""
    batches = generate_batches(model, tokenizer, texts, strategy, **options)
    return [text for batch in batches for text in batch]


def generate_batches(
    model: Transformer | DecoderLM,
    tokenizer,
    texts: list[str],
    strategy: str = "greedy",
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    seed: int = 0,
    max_new_tokens: int | None = None,
    batch_size: int = 32,
    pad_multiple: int = 16,
    interventions: dict[str, Callable] | None = None,
) -> Iterator[list[str]]:
    """The decoded continuation of each text (a `Transformer`'s translation of the text's
    tokens + EOS, or a `DecoderLM`'s of the prompt) by `strategy` with its options, yielded
    a batch of `batch_size` at a time. Each output holds at most its input's length + 50
    tokens, or `max_new_tokens`; sampling is reproducible from `seed`."""
    check_instance("model", model, (Transformer, DecoderLM))
    if strategy not in STRATEGIES:
        raise BadValue(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    check_int("batch_size", batch_size)
    check_int("pad_multiple", pad_multiple)
    if max_new_tokens is not None:
        check_int("max_new_tokens", max_new_tokens)
    seq2seq, max_len = isinstance(model, Transformer), model.config.max_len
    rows = [tokenizer.encode(t) + ([tokenizer.eos_id] if seq2seq else []) for t in texts]
    common = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    common["interventions"] = interventions
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        fill = batch_size - len(chunk) if len(rows) > batch_size else 0
        longest = max(map(len, chunk))
        width = min(-(-longest // pad_multiple) * pad_multiple, max_len) if seq2seq else longest
        src, valid = pad_rows(chunk + chunk[:1] * fill, width, tokenizer.pad_id)
        if strategy == "beam":
            options = dict(beam_size=beam_size, alpha=alpha, max_new_tokens=max_new_tokens)
            tokens = np.asarray(beam_search(model, src, valid, **options, **common)[0][:, 0])
        else:
            n = max_new_tokens or min(longest + PAPER_EXTRA_LENGTH, _capacity(model, src))
            if strategy == "sample":
                key = jax.random.fold_in(jax.random.PRNGKey(seed), start)
                options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
                tokens = sample(model, src, valid, max_new_tokens=n, rng=key, **options, **common)
            else:
                tokens = greedy(model, src, valid, max_new_tokens=n, **common)
            tokens = np.asarray(tokens)
            if max_new_tokens is None:  # each row's own input length + 50
                caps = [len(r) + PAPER_EXTRA_LENGTH for r in chunk]
                tokens = [row[:cap] for row, cap in zip(tokens, caps, strict=False)]
        yield [tokenizer.decode(row) for row in tokens[: len(chunk)]]


def translate_seeds(
    graphdef: nnx.GraphDef,
    params,
    tokenizer,
    texts: list[list[str]],
    *,
    beam_size: int,
    alpha: float,
    max_new_tokens: int,
    batch_size: int,
    pad_multiple: int,
    max_len: int,
) -> list[list[str]]:
    """`generate` for k encoder-decoders of one structure, one vmapped program a batch:
    `params` stacked on a leading axis (of `graphdef`), `texts[i]` model i's sources (as
    many for each), greedy for beam_size 1, else beam search; model i's batch is padded to
    the widest of the k (masked, as padding is)."""
    if len({len(t) for t in texts}) != 1:
        raise BadValue(f"each model needs as many texts, got {[len(t) for t in texts]}")
    check_int("max_new_tokens", max_new_tokens)
    rows = [[tokenizer.encode(t) + [tokenizer.eos_id] for t in ts] for ts in texts]
    ids = (jnp.int32(tokenizer.bos_id), jnp.int32(tokenizer.eos_id), jnp.int32(tokenizer.pad_id))
    out = [[] for _ in texts]
    for start in range(0, len(rows[0]), batch_size):
        chunks = [r[start : start + batch_size] for r in rows]
        fill = batch_size - len(chunks[0]) if len(rows[0]) > batch_size else 0
        longest = max(len(row) for chunk in chunks for row in chunk)
        width = min(-(-longest // pad_multiple) * pad_multiple, max_len)
        padded = [pad_rows(c + c[:1] * fill, width, tokenizer.pad_id) for c in chunks]
        src, valid = (np.stack(arrays) for arrays in zip(*padded, strict=True))
        if beam_size > 1:
            args = (jnp.float32(alpha), ids, max_new_tokens, beam_size)
            tokens = np.asarray(_beam_seeds(graphdef, params, src, valid, *args)[0][:, :, 0])
        else:
            tokens = np.asarray(_greedy_seeds(graphdef, params, src, valid, ids, max_new_tokens))
        for i, chunk in enumerate(chunks):
            out[i] += [tokenizer.decode(row) for row in tokens[i, : len(chunk)]]
    return out


def filter_logits(
    logits: jax.Array,
    *,
    temperature: float | jax.Array = 1.0,
    top_k: int | jax.Array | None = None,
    top_p: float | jax.Array = 1.0,
) -> jax.Array:
    """logits [..., V] / temperature in float32, -inf outside the top k and the nucleus; the
    arguments may be traced scalars. top_k keeps every token whose logit is >= the k-th
    largest; the nucleus (after top_k) keeps the fewest most probable tokens that reach
    mass top_p, and ties with the last."""
    logits = logits.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)
    desc = -jnp.sort(-logits, axis=-1)
    if top_k is not None:
        kth = jnp.take(desc, jnp.asarray(top_k) - 1, axis=-1)[..., None]
        logits = jnp.where(logits >= kth, logits, -jnp.inf)
        desc = jnp.where(desc >= kth, desc, -jnp.inf)
    desc_probs = jax.nn.softmax(desc, axis=-1)
    mass_before = jnp.cumsum(desc_probs, axis=-1) - desc_probs
    # Compared as logits, which are exact copies, so the boundary token is kept exactly.
    cutoff = jnp.min(jnp.where(mass_before < top_p, desc, jnp.inf), axis=-1, keepdims=True)
    return jnp.where((logits >= cutoff) | (jnp.asarray(top_p) >= 1.0), logits, -jnp.inf)


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT's ((5 + length) / 6) ** alpha (Wu et al., 2016)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def run_sampling(
    step: Step,
    state: Any,
    logits: jax.Array,
    *,
    max_new_tokens: int,
    eos_id: int,
    choose: Callable[[jax.Array, jax.Array], jax.Array],
    rng: jax.Array,
    pad_id: int = PAD_ID,
) -> jax.Array:
    """Pick a token per row with `choose(logits [B, V], key) -> tokens [B]` and feed it
    back through `step`, until max_new_tokens or every row's EOS; `logits` [B, V] predict
    the first. Returns tokens [B, max_new_tokens], `pad_id` after a row's EOS."""
    B = logits.shape[0]
    out = jnp.full((B, max_new_tokens), pad_id, jnp.int32)

    def pick(t, logits, out, done):
        token = choose(logits, jax.random.fold_in(rng, t)).astype(jnp.int32)
        token = jnp.where(done, pad_id, token)
        return out.at[:, t].set(token), done | (token == eos_id)

    def cond(carry):
        t, _, _, done = carry
        return (t < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        t, state, out, done = carry
        logits, state = step(state, out[:, t - 1])
        return (t + 1, state, *pick(t, logits, out, done))

    out, done = pick(0, logits, out, jnp.zeros((B,), bool))
    _, _, out, _ = jax.lax.while_loop(cond, body, (1, state, out, done))
    return out


def run_beam_search(
    step: Step,
    state: Any,
    logits: jax.Array,
    *,
    beam_size: int,
    alpha: float,
    row_max_len: jax.Array,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int = PAD_ID,
) -> tuple[jax.Array, jax.Array]:
    """`beam_search` over a step function: `state`'s leaves and `logits` [B * W, V] hold
    each row W times (at b * W ... b * W + W - 1); row_max_len [B] <= max_new_tokens.
    Returns tokens [B, W, max_new_tokens] and scores [B, W], best first."""
    W, N = beam_size, max_new_tokens
    BW, V = logits.shape
    B = BW // W
    neg_inf = jnp.float32(-jnp.inf)
    alive = (
        jnp.full((B, W), neg_inf).at[:, 0].set(0.0),  # log-probs (-inf: no live hypothesis)
        jnp.full((B, W, N), pad_id, jnp.int32),
    )
    pool = (jnp.full((B, W), neg_inf), jnp.full((B, W, N), pad_id, jnp.int32))

    def expand(t, logits, state, alive, pool):
        log_probs, seqs = alive
        scores = log_probs[:, :, None] + jax.nn.log_softmax(logits.reshape(B, W, V), axis=-1)
        log_probs, index = jax.lax.top_k(scores.reshape(B, W * V), W)
        parent, token = index // V, (index % V).astype(jnp.int32)
        seqs = jnp.take_along_axis(seqs, parent[:, :, None], axis=1).at[:, :, t].set(token)
        state = jax.tree.map(lambda x: x[(jnp.arange(B)[:, None] * W + parent).reshape(-1)], state)
        ends = jnp.isfinite(log_probs) & ((token == eos_id) | (t + 1 >= row_max_len[:, None]))
        finished = jnp.where(ends, log_probs / length_penalty(t + 1, alpha), neg_inf)
        pool_scores, keep = jax.lax.top_k(jnp.concatenate([pool[0], finished], axis=1), W)
        pool_seqs = jnp.take_along_axis(
            jnp.concatenate([pool[1], seqs], axis=1), keep[:, :, None], axis=1
        )
        return state, (jnp.where(ends, neg_inf, log_probs), seqs), (pool_scores, pool_seqs)

    def cond(carry):
        t, _, (log_probs, _), (pool_scores, _) = carry
        # A live hypothesis can at best keep its log-prob and reach the longest length.
        best_live = jnp.max(log_probs, axis=1) / length_penalty(row_max_len, alpha)
        row_open = jnp.isfinite(best_live) & (best_live > pool_scores[:, -1])
        return (t < N) & jnp.any(row_open)

    def body(carry):
        t, state, alive, pool = carry
        logits, state = step(state, alive[1][:, :, t - 1].reshape(-1))
        return (t + 1, *expand(t, logits, state, alive, pool))

    carry = (1, *expand(0, logits, state, alive, pool))
    _, _, _, (pool_scores, pool_seqs) = jax.lax.while_loop(cond, body, carry)
    return pool_seqs, pool_scores


# --- model plumbing -------------------------------------------------------------------------


def _prefill(model, src, src_valid, cache_len: int, bos_id: int):
    """Logits [B, V] for the first new token and the cache after the prompt."""
    B = src.shape[0]
    if isinstance(model, Transformer):
        cache = model.init_cache(src, src_valid, max_len=cache_len)
        logits, cache = model.extend(jnp.full((B, 1), bos_id, jnp.int32), cache)
        return logits[:, 0], cache
    cache = model.init_cache(B, max_len=cache_len)
    logits, cache = model.extend(src, cache, src_valid)
    return logits[jnp.arange(B), cache.lengths - 1], cache


def _cached_step(model) -> Step:
    def step(cache, tokens):
        logits, cache = model.extend(tokens[:, None], cache)
        return logits[:, 0], cache

    return step


def _cache_len(model, src, n: int) -> int:
    """Slots for every token fed: BOS + n - 1 outputs, or prompt + n - 1 outputs."""
    return n if isinstance(model, Transformer) else src.shape[1] + n - 1


def _ids(bos_id: int, eos_id: int | None, pad_id: int, vocab_size: int) -> tuple[jax.Array, ...]:
    """(bos_id, eos_id, pad_id), checked against the vocabulary; eos_id None (never stop
    early) becomes -1, which no token equals. Traced, so one compiled loop serves any ids."""
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if name == "eos_id" and value is None:
            continue
        check_int(name, value, minimum=None)
        if not 0 <= value < vocab_size:
            raise BadValue(f"{name}={value} is outside the vocabulary [0, {vocab_size})")
    return jnp.int32(bos_id), jnp.int32(-1 if eos_id is None else eos_id), jnp.int32(pad_id)


def _static(interventions) -> tuple:
    """Interventions as a static argument of the compiled searches: (site, fn) pairs, so a
    search with other interventions (or none) is traced anew, never taken from the cache."""
    check_instance("interventions", interventions or {}, dict)
    return tuple(sorted((interventions or {}).items(), key=lambda item: item[0]))


@contextlib.contextmanager
def _intervening(changes: tuple):
    """Trace within a recording that applies `changes`; the unknown sites are named."""
    if not changes:
        yield
        return
    with sites.recording((), dict(changes)) as rec:
        yield
    rec.check()


@functools.partial(jax.jit, static_argnums=(0, 6, 7))
def _sample_jit(graphdef, state, src, src_valid, ids, sampling, n, changes):
    """Greedy when `sampling` is None, else sampling = (key, (temperature, top_k, top_p))."""
    model = nnx.merge(graphdef, state)
    bos_id, eos_id, pad_id = ids
    if sampling is None:
        key, choose = jax.random.PRNGKey(0), lambda logits, _: jnp.argmax(logits, axis=-1)
    else:
        key, (temperature, top_k, top_p) = sampling

        def choose(logits, key):
            filtered = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
            return jax.random.categorical(key, filtered, axis=-1)

    with _intervening(changes):
        logits, cache = _prefill(model, src, src_valid, _cache_len(model, src, n), bos_id)
        return run_sampling(
            _cached_step(model),
            cache,
            logits,
            max_new_tokens=n,
            eos_id=eos_id,
            choose=choose,
            rng=key,
            pad_id=pad_id,
        )


@functools.partial(jax.jit, static_argnums=(0, 7, 8, 9))
def _beam_jit(graphdef, state, src, src_valid, row_max, alpha, ids, n, beam_size, changes):
    model = nnx.merge(graphdef, state)
    bos_id, eos_id, pad_id = ids
    with _intervening(changes):
        logits, cache = _prefill(model, src, src_valid, _cache_len(model, src, n), bos_id)
        cache, logits = jax.tree.map(lambda x: jnp.repeat(x, beam_size, axis=0), (cache, logits))
        return run_beam_search(
            _cached_step(model),
            cache,
            logits,
            beam_size=beam_size,
            alpha=alpha,
            row_max_len=row_max,
            max_new_tokens=n,
            eos_id=eos_id,
            pad_id=pad_id,
        )


@functools.partial(jax.jit, static_argnums=(0, 5))
def _greedy_seeds(graphdef, params, src, src_valid, ids, n):
    """Greedy search of k models (params stacked) over their batches src [k, B, S]."""

    def one(p, s, v):
        return _sample_jit(graphdef, p, s, v, ids, None, n, ())

    return jax.vmap(one)(params, src, src_valid)


@functools.partial(jax.jit, static_argnums=(0, 6, 7))
def _beam_seeds(graphdef, params, src, src_valid, alpha, ids, n, beam_size):
    """Beam search of k models (params stacked) over src [k, B, S], every row to n."""
    row_max = jnp.full(src.shape[1], n, jnp.int32)

    def one(p, s, v):
        return _beam_jit(graphdef, p, s, v, row_max, alpha, ids, n, beam_size, ())

    return jax.vmap(one)(params, src, src_valid)


# --- argument checks ------------------------------------------------------------------------


def _check_model(model, src, src_valid) -> None:
    check_instance("model", model, (Transformer, DecoderLM))
    name = "src_tokens" if isinstance(model, Transformer) else "prompt (src_tokens)"
    check_rank(name, src, 2, "[B, S]")
    check_int_array(name, src)
    if src_valid is not None:
        check_shape("src_valid", src_valid, np.shape(src), "src_tokens' [B, S]")
    c = model.config
    if c.position_table and src.shape[1] > c.max_len:
        raise BadValue(
            f"{name} has length {src.shape[1]} > the model's {as_given('max_len', c.max_len)}; "
            "shorten the input or use a model with a longer position table"
        )
    if isinstance(model, DecoderLM):
        valid = np.asarray(_valid_or_all(src, src_valid), bool)
        lengths = valid.sum(axis=1)
        if (lengths < 1).any():
            raise BadValue(f"every prompt needs >= 1 real token; rows {np.where(lengths < 1)[0]}")
        if (valid != (np.arange(valid.shape[1]) < lengths[:, None])).any():
            raise BadValue("src_valid must mark a prefix of each prompt (right padding)")


def _check_common(model, src, src_valid, max_new_tokens) -> int:
    _check_model(model, src, src_valid)
    check_int("max_new_tokens", max_new_tokens)
    max_new_tokens = int(max_new_tokens)
    capacity = _capacity(model, src)
    if max_new_tokens > capacity:
        raise BadValue(
            f"{as_given('max_new_tokens', max_new_tokens)} does not fit the model's "
            f"{as_given('max_len', model.config.max_len)} position table (at most {capacity} here)"
        )
    return max_new_tokens


def _capacity(model, src) -> int:
    """The most new tokens whose positions fit the model's position table."""
    c = model.config
    if not c.position_table:
        return np.iinfo(np.int32).max
    # Positions fed: BOS at 0 and outputs 1 .. n-1; or the prompt and outputs up to T + n - 2.
    return c.max_len if isinstance(model, Transformer) else c.max_len - src.shape[1] + 1


def check_sampling_options(temperature, top_k, top_p, *, vocab_size: int | None = None) -> None:
    """Raise unless temperature > 0, top_k in [1, vocab_size] (or None) and top_p in (0, 1]."""
    check_number("temperature", temperature, "(0, inf)")
    if top_k is not None:
        check_int("top_k", top_k)
        if vocab_size is not None and top_k > vocab_size:
            raise BadValue(f"top_k must be <= {vocab_size} (the vocabulary), got {top_k}")
    check_number("top_p", top_p, "(0, 1]")


def check_beam_options(beam_size, alpha, *, vocab_size: int | None = None) -> None:
    """Raise unless 1 <= beam_size <= vocab_size and alpha >= 0."""
    check_int("beam_size", beam_size)
    if vocab_size is not None and beam_size > vocab_size:
        raise BadValue(f"beam_size={beam_size} exceeds the vocabulary size {vocab_size}")
    check_number("alpha", alpha, "[0, inf)")


def _valid_or_all(src, src_valid):
    return np.ones(np.shape(src), bool) if src_valid is None else np.asarray(src_valid)
