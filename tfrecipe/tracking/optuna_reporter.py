"""The Keras side of an Optuna sweep's trial (tracking.optuna_trial): the chief reports
`sweep.objective` after every validation and stops at that epoch's end when the pruner says so."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import keras

from tfrecipe.tracking.optuna_trial import PRUNED_ATTR, TrialHandle, make_pruner, open_storage

log = logging.getLogger("tfrecipe")


class TrialReporter(keras.callbacks.Callback):
    """Reports `objective` after every epoch that validated, as the trial's intermediate value
    at step = epochs trained; stops training at this epoch's end when the pruner says so (not
    after the last epoch: a trial that trained to its end completed, and may win)."""

    reads_logs_only = True  # may watch a group of epochs in one call (loops.epoch_groups)

    def __init__(self, handle: TrialHandle, objective: str, epochs: int | None = None):
        super().__init__()
        import optuna

        storage = open_storage(handle.storage)
        study = optuna.load_study(
            study_name=handle.study_name, storage=storage, pruner=make_pruner(handle.pruner)
        )
        self.trial = optuna.trial.Trial(study, handle.trial_id)
        self.objective, self.epochs = objective, epochs
        self.pruned_at_epoch: int | None = None

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.objective)
        if value is None or not math.isfinite(float(value)):
            return  # not validated this epoch (loop.validation_freq), or a NaN: nothing to judge
        self.trial.report(float(value), step=epoch + 1)
        if epoch + 1 != self.epochs and self.trial.should_prune():
            self.pruned_at_epoch = epoch + 1
            self.trial.set_user_attr(PRUNED_ATTR, epoch + 1)
            log.info(
                "pruned: trial %d stops after epoch %d (%s=%.4g)",
                self.trial.number,
                epoch + 1,
                self.objective,
                value,
            )
            self.model.stop_training = True


def reporters(config: Mapping[str, Any], *, chief: bool) -> list[keras.callbacks.Callback]:
    """The trial reporter of an Optuna sweep's job (on the chief: it validates for the run);
    none outside one."""
    handle = TrialHandle.of_this_process()
    if handle is None or not chief:
        return []
    objective = str((config.get("sweep") or {}).get("objective", "val_loss"))
    return [TrialReporter(handle, objective, (config.get("loop") or {}).get("epochs"))]


def pruned_at(callbacks: Sequence[keras.callbacks.Callback]) -> int | None:
    """The epoch a trial reporter among `callbacks` stopped training at (None: not pruned)."""
    for callback in callbacks:
        if isinstance(callback, TrialReporter) and callback.pruned_at_epoch is not None:
            return callback.pruned_at_epoch
    return None
