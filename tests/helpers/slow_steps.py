"""A callback that makes each training step last at least `seconds` (so that a signal SLURM sends
on its own schedule, e.g. a time limit's, finds the run still training on any machine).

    +callbacks.extra.slow._target_=helpers.slow_steps.SlowSteps +callbacks.extra.slow.seconds=0.5
    allowed_targets=[helpers]
"""

from __future__ import annotations

import time

import keras


class SlowSteps(keras.callbacks.Callback):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


class SlowEpochs(keras.callbacks.Callback):
    """Makes each epoch last `seconds` longer (scripts/bench_sweeps.py: one trial much slower
    than the rest, whatever the steps per call)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_epoch_end(self, epoch, logs=None):
        time.sleep(self.seconds)
