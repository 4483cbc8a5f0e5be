"""Training with optax: losses, schedules, optimizers (a registry, OPTIMIZERS), the train
and eval steps, the run's set-up (`set_up`) and the loop that runs them (`train`; k seeds
of a run in one process, vmapped or in turn: `train_seeds`), with periodic work as hooks
(`Hook`); a trained run's model and tokenizer back (`restore_model`)."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxformer.train.loop import Hook, StepContext, TrainingDiverged, train
    from jaxformer.train.losses import (
        LossSums,
        chunked_cross_entropy,
        cross_entropy,
        lm_head_choice,
    )
    from jaxformer.train.optim import (
        OPTIMIZERS,
        eval_params,
        make_optimizer,
        make_schedule,
        paper_schedule,
    )
    from jaxformer.train.run_folder import restore_model
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

# Each name imported at first use: `jaxformer.train.steps` alone imports no data, run
# folder or interop code.
_LAZY = {
    "Hook": "jaxformer.train.loop",
    "StepContext": "jaxformer.train.loop",
    "TrainingDiverged": "jaxformer.train.loop",
    "train": "jaxformer.train.loop",
    "LossSums": "jaxformer.train.losses",
    "chunked_cross_entropy": "jaxformer.train.losses",
    "cross_entropy": "jaxformer.train.losses",
    "lm_head_choice": "jaxformer.train.losses",
    "OPTIMIZERS": "jaxformer.train.optim",
    "eval_params": "jaxformer.train.optim",
    "make_optimizer": "jaxformer.train.optim",
    "make_schedule": "jaxformer.train.optim",
    "paper_schedule": "jaxformer.train.optim",
    "restore_model": "jaxformer.train.run_folder",
    "seed_runs": "jaxformer.train.seed_group",
    "train_seeds": "jaxformer.train.seed_group",
    "Setup": "jaxformer.train.setup",
    "set_up": "jaxformer.train.setup",
    "Terminated": "jaxformer.train.signals",
    "TrainState": "jaxformer.train.steps",
    "create_train_state": "jaxformer.train.steps",
    "make_eval_step": "jaxformer.train.steps",
    "make_train_step": "jaxformer.train.steps",
    "model_logits": "jaxformer.train.steps",
    "model_loss_sums": "jaxformer.train.steps",
    "state_layout": "jaxformer.train.steps",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxformer.train' has no attribute {name!r}")
