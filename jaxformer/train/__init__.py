"""Training with optax: schedules, optimizers (a registry, OPTIMIZERS), the train and eval
steps, the run's set-up (`set_up`) and the loop that runs them (`train`; k seeds of a run
in one process, vmapped or in turn: `train_seeds`), with periodic work as hooks (`Hook`);
a trained run's model and tokenizer back (`restore_model`)."""

import importlib

# Each name imported at first use: `jaxformer.train.steps` alone imports no data, run
# folder or interop code.
_MODULES = {
    "jaxformer.train.loop": "Hook StepContext TrainingDiverged train",
    "jaxformer.train.optim": "OPTIMIZERS eval_params make_optimizer make_schedule paper_schedule",
    "jaxformer.train.seeds": "seed_runs train_seeds",
    "jaxformer.train.setup": "Setup set_up",
    "jaxformer.train.steps": "TrainState create_train_state lm_head_choice make_eval_step "
    "make_train_step model_logits model_loss_sums state_layout",
    "jaxformer.checkpoints": "restore_model",
    "jaxformer.signals": "Terminated",
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names.split()}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxformer.train' has no attribute {name!r}")
