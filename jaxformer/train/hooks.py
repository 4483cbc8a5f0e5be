"""Periodic work in the training loop: a `Hook` runs its action every N steps, given a
`StepContext` (the step, its state and metrics, the run folder, the run's set-up).

`train` runs its hooks in this order: the in-run evaluation (every `eval_every` steps),
the checkpoint (every `checkpoint_every` steps, and the last step), the hooks it is given,
in their order, and the final evaluation (the last step only). A NaN loss stops the run
before any hook sees its state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from flax import nnx

from jaxformer.checks import BadType, check_bool, check_instance, check_int
from jaxformer.train.run_folder import RunFolder
from jaxformer.train.setup import Setup
from jaxformer.train.steps import TrainState


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What a hook is given after step `step` (the number of steps done: 1 after the first).

    state    the TrainState after that step, valid during the call only (the next step
             donates its buffers): keep what you need (`jax.device_get`)
    metrics  that step's train record as logged; {} in a run resumed at its last step
    folder   the run folder: `folder.log(record)` appends to metrics.jsonl
    setup    the run's `Setup`: run config, data, tokenizer, model config, placement
    say      prints a line on process 0, unless progress=False
    """

    step: int
    state: TrainState
    metrics: dict[str, float]
    folder: RunFolder
    setup: Setup
    say: Callable[[str], None]

    def model(self) -> nnx.Module:
        """The model with the state's parameters (one copy of them, on the device)."""
        return nnx.merge(self.setup.graphdef, self.setup.placement.one_copy(self.state.params))


@dataclasses.dataclass(frozen=True)
class Hook:
    """`action(context)` after steps every, 2 * every, ... before the run's last step, and
    after the last step only when `at_end` (every=3 over 10 steps: 3, 6, 9, and 10 with
    at_end). `name` names the hook in messages.

    A hook that raises stops the run with its error, after saving the last step done.
    """

    every: int
    action: Callable[[StepContext], None]
    name: str
    at_end: bool = False

    def __post_init__(self):
        check_instance("a hook's name", self.name, str)
        check_int(f"hook {self.name!r}: every", self.every)
        if not callable(self.action):
            raise BadType(
                f"hook {self.name!r}: action must be callable (a function of the "
                f"StepContext), got {type(self.action).__name__}"
            )
        check_bool(f"hook {self.name!r}: at_end", self.at_end)

    def due(self, step: int, last: int) -> bool:
        """Whether the hook runs after step `step` of a run of `last` steps."""
        return self.at_end if step == last else step % self.every == 0


class HookRunner:
    """A run's hooks, in the order they run, for a run of `last` steps; `running` is the
    hook running (None between hooks), which a stopped run names."""

    def __init__(self, hooks: list[Hook], last: int):
        self.hooks, self.last, self.running = hooks, last, None

    def due(self, step: int) -> list[Hook]:
        """The hooks that run after step `step`, in order (after the last: the at_end ones)."""
        return [hook for hook in self.hooks if hook.due(step, self.last)]

    def run(self, hooks: list[Hook], context: StepContext) -> None:
        """Each of `hooks` (in order) on `context`."""
        for hook in hooks:
            self.running = hook
            hook.action(context)
        self.running = None


def check_hooks(hooks) -> None:
    """A list or tuple of Hooks."""
    check_instance("hooks", hooks, (list, tuple))
    for i, hook in enumerate(hooks):
        check_instance(f"hooks[{i}]", hook, Hook)
