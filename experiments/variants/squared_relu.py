"""Squared ReLU feed-forward activation, relu(h)^2 (So et al., 2021, "Primer"): one line
that Primer's search found to speed up language-model training.

    jaxformer train --variants experiments/variants/squared_relu.py --activation squared_relu
"""

import jax
import jax.numpy as jnp

from jaxformer import functional as F


@F.ACTIVATIONS.register("squared_relu")
def squared_relu(h):
    return jnp.square(jax.nn.relu(h))
