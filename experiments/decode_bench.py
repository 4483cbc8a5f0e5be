"""Decoding speed: the KV cache against recomputing the whole prefix at every step.

    python experiments/decode_bench.py [--quick] [--out results]

Both sides run the same compiled search loops of `jaxformer.decode` (greedy and beam 4)
on the same encoder-decoder; only the step differs:

- cached: `model.extend` feeds the new token through the decoder once, reading the
  keys and values of earlier tokens from the cache (the library's decoding);
- recompute: the decoder runs over the whole target buffer [B, N] at every step and
  the logits at the current position are kept (a compiled loop cannot grow its
  shapes, so this is what decoding without a cache costs there; it is how
  `decode.greedy` worked before the cache).

Every row decodes exactly N tokens (EOS is disabled), timed after compilation as the
fastest of three runs (the least disturbed by other load), cached and recomputed runs
interleaved. Tokens/s counts the B * N
output tokens (for beam search: of the best hypotheses). Writes
results/decode_bench.json; the last line printed is a JSON summary whose `speedup` is
the smallest cached/recompute ratio at the longest output length.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxformer as jf
from jaxformer import decode


def cached_step(model: jf.Transformer):
    """The library's step: state = the model's DecodeCache."""

    def step(cache, tokens):
        logits, cache = model.extend(tokens[:, None], cache)
        return logits[:, 0], cache

    return step


def recompute_step(model: jf.Transformer):
    """A cache-free step: state = (target buffer [B, N] from BOS, position [B], memory, mask)."""

    def step(state, tokens):
        buffer, position, memory, src_valid = state
        rows = jnp.arange(buffer.shape[0])
        buffer = buffer.at[rows, position + 1].set(tokens)
        logits = model.decode(buffer, memory, src_valid)[rows, position + 1]
        return logits, (buffer, position + 1, memory, src_valid)

    return step


def make_runner(graphdef, state, method: str, cached: bool, n: int, beam: int):
    """A compiled function (src, src_valid) -> output tokens, for one case."""

    @jax.jit
    def run(src, src_valid):
        model = nnx.merge(graphdef, state)
        B = src.shape[0]
        eos = jnp.int32(-1)  # never emitted: every row decodes all n tokens
        if cached:
            cache = model.init_cache(src, src_valid, max_len=n)
            logits, cache = model.extend(jnp.ones((B, 1), jnp.int32), cache)
            step, carry, logits = cached_step(model), cache, logits[:, 0]
        else:
            memory = model.encode(src, src_valid)
            buffer = jnp.zeros((B, n), jnp.int32).at[:, 0].set(1)
            logits = model.decode(buffer, memory, src_valid)[:, 0]
            step = recompute_step(model)
            carry = (buffer, jnp.zeros((B,), jnp.int32), memory, src_valid)
        if method == "greedy":
            return decode.run_sampling(
                step,
                carry,
                logits,
                max_new_tokens=n,
                eos_id=eos,
                choose=lambda logits, key: jnp.argmax(logits, axis=-1),
                rng=jax.random.PRNGKey(0),
            )
        carry, logits = jax.tree.map(lambda x: jnp.repeat(x, beam, axis=0), (carry, logits))
        tokens, _ = decode.run_beam_search(
            step,
            carry,
            logits,
            beam_size=beam,
            alpha=0.6,
            row_max_len=jnp.full((B,), n, jnp.int32),
            max_new_tokens=n,
            eos_id=eos,
        )
        return tokens[:, 0]

    return run


def timed(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="output lengths 16 and 64")
    parser.add_argument("--out", default="results")
    args = parser.parse_args()

    lengths = (16, 64) if args.quick else (64, 256)
    repeats = 3
    batch, src_len, beam = 4, 16, 4
    config = jf.TransformerConfig.tiny(259, max_len=max(lengths))  # byte vocabulary
    model = jf.Transformer(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(3, 259, (batch, src_len)), jnp.int32)
    src_valid = jnp.ones((batch, src_len), bool)

    cases = []
    for method in ("greedy", f"beam{beam}"):
        for n in lengths:
            runs = {c: make_runner(graphdef, state, method, c, n, beam) for c in (True, False)}
            outputs = {c: runs[c](src, src_valid) for c in runs}  # compile
            same = bool(np.array_equal(outputs[True], outputs[False]))
            times = {True: [], False: []}
            for _ in range(repeats):
                for c in (True, False):
                    times[c].append(timed(runs[c], src, src_valid))
            t_cached, t_recompute = (min(times[c]) for c in (True, False))
            case = dict(
                method=method,
                new_tokens=n,
                cached_tokens_per_s=round(batch * n / t_cached, 1),
                recompute_tokens_per_s=round(batch * n / t_recompute, 1),
                speedup=round(t_recompute / t_cached, 2),
                same_tokens=same,
            )
            print(case, flush=True)
            cases.append(case)

    longest = max(lengths)
    summary = dict(
        speedup=min(c["speedup"] for c in cases if c["new_tokens"] == longest),
        at_new_tokens=longest,
        cases=cases,
        setup=dict(
            model="TransformerConfig.tiny(259): 2+2 layers, d_model=128, h=4, d_ff=512",
            batch=batch,
            src_len=src_len,
            beam=beam,
            repeats=repeats,
            quick=args.quick,
            backend=jax.default_backend(),
            device=str(jax.devices()[0].device_kind),
            machine=platform.machine(),
            jax=jax.__version__,
        ),
    )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_bench.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
