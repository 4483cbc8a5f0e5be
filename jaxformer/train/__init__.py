"""Training with optax: schedules, optimizers (a registry, OPTIMIZERS), the train and eval
steps, the run's set-up (`set_up`) and the loop that runs them (`train`; k seeds of a run
in one process, vmapped or in turn: `train_seeds`), with periodic work as hooks (`Hook`);
a trained run's model and tokenizer back (`restore_model`)."""

import importlib

# Each name imported at first use: `jaxformer.train.steps` alone imports no data, run
# folder or interop code.
_LAZY = {
    "Hook": "jaxformer.train.loop",
    "StepContext": "jaxformer.train.loop",
    "TrainingDiverged": "jaxformer.train.loop",
    "train": "jaxformer.train.loop",
    "lm_head_choice": "jaxformer.train.steps",
    "OPTIMIZERS": "jaxformer.train.optim",
    "eval_params": "jaxformer.train.optim",
    "make_optimizer": "jaxformer.train.optim",
    "make_schedule": "jaxformer.train.optim",
    "paper_schedule": "jaxformer.train.optim",
    "restore_model": "jaxformer.train.checkpoints",
    "seed_runs": "jaxformer.train.seeds",
    "train_seeds": "jaxformer.train.seeds",
    "Setup": "jaxformer.train.setup",
    "set_up": "jaxformer.train.setup",
    "Terminated": "jaxformer.signals",
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
