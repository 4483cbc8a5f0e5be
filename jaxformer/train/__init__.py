"""Training with optax: losses, schedules, optimizers, the train and eval steps, and the
loop that runs them (`train`)."""

from jaxformer.train.loop import TrainingDiverged, train
from jaxformer.train.losses import LossSums, chunked_cross_entropy, cross_entropy, lm_head_choice
from jaxformer.train.optim import make_optimizer, make_schedule, paper_schedule
from jaxformer.train.steps import (
    TrainState,
    create_train_state,
    make_eval_step,
    make_train_step,
    model_logits,
    model_loss_sums,
)
