"""A callback that makes each training step last at least `seconds` (so that a signal SLURM sends
on its own schedule, e.g. a time limit's, finds the run still training on any machine).

    +callbacks.extra.slow._target_=helpers.slow_steps.SlowSteps +callbacks.extra.slow.seconds=0.5
    allowed_targets=[helpers]
"""

from __future__ import annotations

import os
import select
import signal
import socket
import time

import keras

from tfrecipe.fault.backup import current_step


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


class HoldForSignal(keras.callbacks.Callback):
    """Holds training after `steps` steps until this process gets a signal it handles (the
    preemption a test sends once it saw those steps in steps.csv), so that the signal finds the
    run mid-way however late a loaded machine delivers it: an event, not a per-step budget. A
    signal that came before the hold is kept (Python's wakeup fd, set when training begins), so
    it releases the hold at once; a run resumed past `steps` does not hold.

        +callbacks.extra.hold._target_=helpers.slow_steps.HoldForSignal
        +callbacks.extra.hold.steps=7 allowed_targets=[helpers]
    """

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps
        self._held = False

    def on_train_begin(self, logs=None):
        self._held = current_step(self.model) >= self.steps  # resumed past it
        self._read, write = socket.socketpair()
        write.setblocking(False)
        self._write = write
        self._previous = signal.set_wakeup_fd(write.fileno())

    def on_train_batch_end(self, batch, logs=None):
        if not self._held and current_step(self.model) >= self.steps:
            self._held = True
            select.select([self._read], [], [])

    def on_train_end(self, logs=None):
        signal.set_wakeup_fd(self._previous)
        self._read.close()
        self._write.close()


class HoldUntilReleased(keras.callbacks.Callback):
    """Holds training after `steps` steps until the file `release` exists (the test creates it
    once it has done what needed the run mid-way, e.g. killed another pod with SIGKILL, which no
    handler sees), so that the run is still training when the test acts however loaded the
    machine: an event, not a per-step budget. A run started after the release does not hold.

        +callbacks.extra.hold._target_=helpers.slow_steps.HoldUntilReleased
        +callbacks.extra.hold.steps=5 +callbacks.extra.hold.release=PATH allowed_targets=[helpers]
    """

    def __init__(self, steps: int, release: str):
        super().__init__()
        self.steps, self.release = steps, release
        self._held = False

    def on_train_begin(self, logs=None):
        self._held = os.path.exists(self.release)

    def on_train_batch_end(self, batch, logs=None):
        if not self._held and current_step(self.model) >= self.steps:
            self._held = True
            while not os.path.exists(self.release):
                time.sleep(0.05)
