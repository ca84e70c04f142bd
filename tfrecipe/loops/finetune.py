"""Two-phase fine-tuning (`loop.finetune`): train what the model leaves trainable (a head on a
frozen backbone) for `unfreeze_at_epoch` epochs, then unfreeze and go on at a lower rate.

The switch, at step `unfreeze_at_epoch x steps_per_epoch`:
  unfreeze (every layer, or those `unfreeze` matches; BatchNormalization layers stay frozen, so
  they keep running in inference mode as the Keras fine-tuning guide says) -> a new optimizer,
  as configured, at its learning rate x `learning_rate_factor` -> recompile (Keras 3 traces the
  train step over the trainable variables it had: fit's train function and the custom loop's
  `tf.function` must be made again) -> the new optimizer is built for the new trainable set
  (fresh slots for every variable) and counts on from the switch step.

The two phases are two calls of the configured loop (`TwoPhaseLoop`); the callbacks see one
training run. A backup holds the optimizer of its phase: one taken at or before the switch step
(phase one ends with the epoch-end backup, before the switch) holds phase one's, a later one
phase two's. A run resumed past the switch therefore switches before it restores
(`TwoPhases.resume_in_phase_two`), so the restore finds the optimizer it saved.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import optim
from tfrecipe.errors import ConfigError
from tfrecipe.loops import Loop
from tfrecipe.loops.fit import OneTrainingRun
from tfrecipe.loops.options import LoopOptions
from tfrecipe.models.freeze import frozen_layers, param_counts, unfreeze

log = logging.getLogger("tfrecipe")


@dataclasses.dataclass(frozen=True)
class Unfreezing:
    """`loop.finetune`: when to switch, how far the rate drops, what unfreezes (None: all)."""

    unfreeze_at_epoch: int
    learning_rate_factor: float = 0.1
    unfreeze: str | None = None


def trainable_params(model: keras.Model) -> int:
    return param_counts(model)["trainable"]


def checkpoint_step(path: str) -> int | None:
    """The optimizer step a backup holds, read without restoring it (None when unreadable).
    A float16 run's LossScaleOptimizer counts in its inner optimizer."""
    try:
        reader = tf.train.load_checkpoint(path)
    except Exception:  # a damaged backup: the restore reports it and tries the one before
        return None
    for key in ("optimizer/inner_optimizer/_iterations", "optimizer/_iterations"):
        name = f"{key}/.ATTRIBUTES/VARIABLE_VALUE"
        if reader.has_tensor(name):
            return int(reader.get_tensor(name))
    return None


class TwoPhases:
    """The switch of one run from phase one to phase two, and its record for summary.json.

    Args:
      model: the compiled model, built under its strategy's scope.
      schedule: `loop.finetune`.
      steps_per_epoch: the loop's optimizer steps per epoch.
      new_optimizer: makes the optimizer as configured (at the run's rate), under the scope.
      compile_with: compiles the model with an optimizer, as the run compiled it, under the scope.

    Raises:
      ConfigError: nothing would unfreeze (no frozen layer, or none `schedule.unfreeze` matches).
    """

    def __init__(
        self,
        model: keras.Model,
        schedule: Unfreezing,
        *,
        steps_per_epoch: int,
        new_optimizer: Callable[[], keras.optimizers.Optimizer],
        compile_with: Callable[[keras.optimizers.Optimizer], None],
    ):
        if not frozen_layers(model, schedule.unfreeze):
            raise ConfigError(_nothing_to_unfreeze(model, schedule))
        self.model = model
        self.schedule = schedule
        self.switch_step = schedule.unfreeze_at_epoch * steps_per_epoch
        self._new_optimizer = new_optimizer
        self._compile_with = compile_with
        self.switched = False
        # summary.json "finetune": the switch once it happened (also in an earlier attempt).
        self.record: dict[str, Any] = {
            "unfreeze_at_epoch": schedule.unfreeze_at_epoch,
            "unfroze_at_step": None,
            "learning_rate": None,
            "trainable_params": {"before": trainable_params(model), "after": None},
        }

    def resume_in_phase_two(self, checkpoints: list[str]) -> None:
        """Switches now when the backup a resumed run restores (the newest of `checkpoints`)
        was taken after the switch: its optimizer is phase two's."""
        step = checkpoint_step(checkpoints[0]) if checkpoints else None
        if step is not None and step > self.switch_step:
            self.switch(resuming=True)

    def switch(self, *, resuming: bool = False) -> None:
        """Unfreezes, and trains on with a new optimizer at the lowered rate from this step."""
        model, schedule = self.model, self.schedule
        step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        before = trainable_params(model)
        unfrozen = unfreeze(model, schedule.unfreeze)
        optimizer = self._new_optimizer()
        base = optim.base_learning_rate(optimizer)
        optim.set_scaled_learning_rate(optimizer, base, schedule.learning_rate_factor)
        self._compile_with(optimizer)  # also drops fit's traced train function
        optim.build_optimizer_variables(
            model
        )  # fresh slots for the new trainable set, before any restore
        model.optimizer.iterations.assign(step)  # a resumed run's restore sets its own
        self.switched = True
        learning_rate = optim.current_learning_rate(model.optimizer)
        self.record.update(
            unfroze_at_step=self.switch_step,
            learning_rate=learning_rate,
            trainable_params={**self.record["trainable_params"], "after": trainable_params(model)},
        )
        log.info(
            "fine-tuning: %s %d layers at step %d (epoch %d): trainable parameters %d -> %d; "
            "learning rate x%g = %.4g with a new optimizer",
            "resuming with" if resuming else "unfroze",
            len(unfrozen),
            self.switch_step,
            schedule.unfreeze_at_epoch,
            before,
            trainable_params(model),
            schedule.learning_rate_factor,
            learning_rate,
        )


def _nothing_to_unfreeze(model: keras.Model, schedule: Unfreezing) -> str:
    key = f"loop.finetune.unfreeze_at_epoch={schedule.unfreeze_at_epoch}"
    if schedule.unfreeze is None or not frozen_layers(model):
        return (
            f"{key}: the model {model.name} has no frozen layer to unfreeze (BatchNormalization "
            "layers stay frozen); freeze part of it (e.g. model.freeze) or set "
            "loop.finetune.unfreeze_at_epoch=null"
        )
    names = frozen_layers(model)
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    return (
        f"loop.finetune.unfreeze={schedule.unfreeze}: matches no frozen layer of the model "
        f"{model.name}; frozen layers: {shown}"
    )


class _OneRun(OneTrainingRun):
    """The callbacks see one run of all the epochs (each phase's loop gives its own count)."""

    def __init__(self, callbacks: list[keras.callbacks.Callback], model, *, epochs: int):
        super().__init__(callbacks, model, last=False)
        self.epochs = epochs

    def set_params(self, params):
        super().set_params({**params, "epochs": self.epochs})


@dataclasses.dataclass(frozen=True)
class TwoPhaseLoop:
    """A `Loop` that runs `loop` up to the switch, switches, and runs it on to the end.

    Args:
      loop: the configured loop (fit or custom).
      phases: the run's switch.
      on_switch: what else must follow the new optimizer (the backup's checkpoint).
    """

    loop: Loop
    phases: TwoPhases
    on_switch: Callable[[], None]

    def run(
        self, model: keras.Model, train_data, validation_data, *, options: LoopOptions, callbacks
    ) -> None:
        if self.phases.switched:  # resumed in phase two
            self.loop.run(model, train_data, validation_data, options=options, callbacks=callbacks)
            return
        switch_step = self.phases.switch_step
        relay = _OneRun(callbacks, model, epochs=options.epochs)
        if options.initial_step < switch_step:
            phase_one = dataclasses.replace(options, epochs=self.phases.schedule.unfreeze_at_epoch)
            self.loop.run(model, train_data, validation_data, options=phase_one, callbacks=[relay])
            if model.stop_training:  # early stopping, a NaN loss: no phase two
                relay.end()
                return
            # fit iterates its data afresh on each call: phase two reads on from the switch step
            train_data = options.train_data_from(switch_step)
        self.phases.switch()
        self.on_switch()
        relay.last = True
        phase_two = dataclasses.replace(
            options, initial_step=max(options.initial_step, switch_step)
        )
        self.loop.run(model, train_data, validation_data, options=phase_two, callbacks=[relay])

    def evaluate(
        self, model: keras.Model, data, steps: int | None = None, *, objective=None
    ) -> dict[str, float]:
        return self.loop.evaluate(model, data, steps, objective=objective)
