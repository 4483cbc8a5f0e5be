"""`jaxformer bench decode`: decoding speed with the KV cache against recomputing the
whole prefix at every step.

Both sides run the same compiled search loops of `jaxformer.decode` (greedy and beam 4)
on the same encoder-decoder (TransformerConfig.tiny, byte vocabulary); only the step
differs:

- cached: `model.extend` feeds the new token through the decoder once, reading the keys
  and values of earlier tokens from the cache (the library's decoding);
- recompute: the decoder runs over the whole target buffer [B, N] at every step and the
  logits at the current position are kept.

Every row decodes exactly N tokens (EOS disabled); the two sides run in interleaved rounds
(stats): tokens/s of the B * N output tokens from each median, and the speed-up as the
median of the per-round ratios with its 95% interval (docs/decoding.md, "Speed")."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.checks import BadValue
from jaxformer_lab.bench import stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

BATCH, SRC_LEN, BEAM, VOCAB = 4, 16, 4, 259  # VOCAB: the byte tokenizer's


@dataclasses.dataclass(frozen=True)
class DecodeOptions(Options):
    quick: bool = setting(False, "output lengths 16 and 32 (default 64 and 256)")
    rounds: int = setting(6, "interleaved rounds per case, >= 6")

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.rounds, int) or self.rounds < 6:
            raise BadValue(f"--rounds must be >= 6 for a 95% interval, got {self.rounds}")


@BENCHMARKS.register("decode", DecodeOptions)
def run(options: DecodeOptions) -> Record:
    """Decoding with the KV cache against recomputing the prefix at every step."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxformer.config import TransformerConfig
    from jaxformer.models import Transformer

    lengths = (16, 32) if options.quick else (64, 256)
    config = TransformerConfig.tiny(VOCAB, max_len=max(lengths))
    graphdef, state = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(3, VOCAB, (BATCH, SRC_LEN)), jnp.int32)
    src_valid = jnp.ones((BATCH, SRC_LEN), bool)
    cases = []
    for method in ("greedy", f"beam{BEAM}"):
        for n in lengths:
            cases.append(case(graphdef, state, method, n, (src, src_valid), options.rounds))
            say(f"{method} {n} tokens: speed-up {cases[-1]['speedup']['median']:.1f}x")
    longest = [c["speedup"]["median"] for c in cases if c["new_tokens"] == max(lengths)]
    headline = dict(speedup=round(min(longest), 2), at_new_tokens=max(lengths))
    setup = dict(batch=BATCH, src_len=SRC_LEN, beam=BEAM, rounds=options.rounds)
    data = dict(cases=cases, setup=setup, headline=headline)
    return capture([table(cases, options.rounds)], data=data)


def case(graphdef, state, method: str, n: int, inputs: tuple, rounds: int) -> dict:
    """One search at one length, cached and recomputed, timed in interleaved rounds."""
    import jax

    runs = {c: make_runner(graphdef, state, method, c, n) for c in ("cached", "recompute")}
    outputs = {c: fn(*inputs) for c, fn in runs.items()}  # compiles
    calls = {c: (lambda fn=fn: jax.block_until_ready(fn(*inputs))) for c, fn in runs.items()}
    times = stats.time_interleaved(calls, rounds, warmup=1)
    tokens = BATCH * n
    return dict(
        method=method,
        new_tokens=n,
        cached_tokens_per_s=tokens / stats.median_ci(times["cached"])["median"],
        recompute_tokens_per_s=tokens / stats.median_ci(times["recompute"])["median"],
        speedup=stats.paired_ratio(times["recompute"], times["cached"]),
        same_tokens=bool(np.array_equal(outputs["cached"], outputs["recompute"])),
        seconds=times,
    )


def cached_step(model):
    """The library's step: state = the model's DecodeCache."""

    def step(cache, tokens):
        logits, cache = model.extend(tokens[:, None], cache)
        return logits[:, 0], cache

    return step


def recompute_step(model):
    """A cache-free step: state = (target buffer [B, N] from BOS, position [B], memory, mask)."""
    import jax.numpy as jnp

    def step(state, tokens):
        buffer, position, memory, src_valid = state
        rows = jnp.arange(buffer.shape[0])
        buffer = buffer.at[rows, position + 1].set(tokens)
        logits = model.decode(buffer, memory, src_valid)[rows, position + 1]
        return logits, (buffer, position + 1, memory, src_valid)

    return step


def start(model, src, src_valid, cached: bool, n: int):
    """(step, its first state, the logits of the first token) after BOS."""
    import jax.numpy as jnp

    B = src.shape[0]
    if cached:
        cache = model.init_cache(src, src_valid, max_len=n)
        logits, cache = model.extend(jnp.ones((B, 1), jnp.int32), cache)
        return cached_step(model), cache, logits[:, 0]
    memory = model.encode(src, src_valid)
    buffer = jnp.zeros((B, n), jnp.int32).at[:, 0].set(1)
    logits = model.decode(buffer, memory, src_valid)[:, 0]
    carry = (buffer, jnp.zeros((B,), jnp.int32), memory, src_valid)
    return recompute_step(model), carry, logits


def make_runner(graphdef, state, method: str, side: str, n: int):
    """A compiled function (src, src_valid) -> output tokens, for one case."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxformer import decode

    @jax.jit
    def run(src, src_valid):
        model = nnx.merge(graphdef, state)
        step, carry, logits = start(model, src, src_valid, side == "cached", n)
        eos = jnp.int32(-1)  # never emitted: every row decodes all n tokens
        if method == "greedy":
            choose = lambda logits, key: jnp.argmax(logits, axis=-1)  # noqa: E731
            return decode.run_sampling(
                step,
                carry,
                logits,
                max_new_tokens=n,
                eos_id=eos,
                choose=choose,
                rng=jax.random.PRNGKey(0),
            )
        carry, logits = jax.tree.map(lambda x: jnp.repeat(x, BEAM, axis=0), (carry, logits))
        row_max_len = jnp.full((src.shape[0],), n, jnp.int32)
        tokens, _ = decode.run_beam_search(
            step,
            carry,
            logits,
            beam_size=BEAM,
            alpha=0.6,
            row_max_len=row_max_len,
            max_new_tokens=n,
            eos_id=eos,
        )
        return tokens[:, 0]

    return run


def table(cases: list[dict], rounds: int) -> Table:
    """A row per search and length: tokens/s with and without the cache, and the speed-up."""
    rows = [
        [
            "greedy" if c["method"] == "greedy" else f"beam {BEAM}",
            c["new_tokens"],
            f"{c['cached_tokens_per_s']:,.0f}",
            f"{c['recompute_tokens_per_s']:,.0f}",
            f"{c['speedup']['median']:.1f}x [{c['speedup']['low']:.1f}, {c['speedup']['high']:.1f}]",
            "yes" if c["same_tokens"] else "no",
        ]
        for c in cases
    ]
    caption = (
        f"The tiny model (2+2 layers, d_model 128), {BATCH} sources of {SRC_LEN} tokens, every "
        f"row decoding the full length; medians over {rounds} interleaved rounds, the speed-up "
        "the median of the per-round ratios with its 95% interval:"
    )
    columns = ["search", "new tokens", "cached tokens/s", "recompute tokens/s", "speedup [95%]"]
    return Table(columns + ["same tokens"], rows, "lrrrrl", caption=caption)
