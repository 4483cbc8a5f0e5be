"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of
an interpolation of momentum and gradient, optax.lion, registered as an optimizer of your
own in one file.

    jaxformer train --variants experiments/variants/lion.py --optimizer lion --lr 3e-4

The contract (jaxformer.train.OPTIMIZERS): fn(schedule, *, b1, b2, eps, weight_decay),
the run's schedule and Adam's hyperparameters, -> an optax.GradientTransformation.
"""

import optax

from jaxformer.train import OPTIMIZERS


@OPTIMIZERS.register("lion")
def lion(schedule, *, b1, b2, eps, weight_decay):
    del b2, eps  # Lion's second beta is its own (0.99, the paper's), and it divides by nothing
    return optax.lion(schedule, b1=b1, b2=0.99, weight_decay=weight_decay)
