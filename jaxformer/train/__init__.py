"""Training with optax: losses, schedules, optimizers, the train and eval steps, the
run's set-up (`set_up`) and the loop that runs them (`train`; k seeds of a run in one
process, vmapped or in turn: `train_seeds`), with periodic work as hooks (`Hook`); a trained run's
model and tokenizer back (`restore_model`)."""

from jaxformer.train.checkpoint import restore_model
from jaxformer.train.hooks import Hook, StepContext
from jaxformer.train.loop import TrainingDiverged, train
from jaxformer.train.losses import LossSums, chunked_cross_entropy, cross_entropy, lm_head_choice
from jaxformer.train.optim import make_optimizer, make_schedule, paper_schedule
from jaxformer.train.seed_group import seed_runs, train_seeds
from jaxformer.train.setup import Setup, set_up
from jaxformer.train.signals import Terminated
from jaxformer.train.steps import (
    TrainState,
    create_train_state,
    make_eval_step,
    make_train_step,
    model_logits,
    model_loss_sums,
    state_layout,
)
