"""Training with optax: losses, schedules, optimizers, train and eval steps."""

from jaxformer.train.losses import LossSums, cross_entropy
from jaxformer.train.optim import make_optimizer, make_schedule, paper_schedule
from jaxformer.train.steps import (
    TrainState,
    create_train_state,
    make_eval_step,
    make_train_step,
    model_logits,
)

__all__ = [
    "LossSums",
    "TrainState",
    "create_train_state",
    "cross_entropy",
    "make_eval_step",
    "make_optimizer",
    "make_schedule",
    "make_train_step",
    "model_logits",
    "paper_schedule",
]
