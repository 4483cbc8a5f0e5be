import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxformer as jf
from jaxformer import decode


def test_greedy_matches_step_by_step_argmax():
    c = jf.TransformerConfig.tiny(20, d_model=32, num_heads=2, d_ff=64, max_len=32)
    model = jf.Transformer(c, rngs=nnx.Rngs(3))
    src = jnp.array([[5, 6, 7, 2, 0], [8, 9, 2, 0, 0]])
    valid = src != 0
    out = np.asarray(decode.greedy(model, src, valid, max_new_tokens=6, eos_id=2))
    memory = model.encode(src, valid)
    for b in range(2):
        prefix = [1]
        for t in range(6):
            logits = model.decode(jnp.array([prefix]), memory[b : b + 1], valid[b : b + 1])
            token = int(jnp.argmax(logits[0, -1]))
            assert out[b, t] == token
            prefix.append(token)
            if token == 2:
                assert (out[b, t + 1 :] == 0).all()
                break
