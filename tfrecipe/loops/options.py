"""What every loop needs to know besides the model and data."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tfrecipe.perf.clock import InputClock


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """Args:
    epochs: passes over the training data (or over `steps_per_epoch` steps).
    steps_per_epoch: optimizer steps per epoch (the training data is endless).
    validation_freq: validate every N epochs.
    verbose: 0 silent, 1 a progress bar per epoch, 2 one line per epoch.
    steps_per_loop: training steps per `tf.function` call (custom loop).
    gradient_accumulation_steps: micro-batches per optimizer step (custom loop); steps per epoch
      and per loop count optimizer steps.
    initial_step: optimizer steps already done (a restored run): training continues in epoch
      initial_step // steps_per_epoch, at its step initial_step % steps_per_epoch.
    train_data_from: step -> the training data from that step on; loop=fit needs it to continue
      a run restored mid-epoch (its second `fit` starts at the next epoch's first step).
    input_clock: stamps the steps' wait on input (tfrecipe.perf.clock), or None.
    objective: `make() -> (loss, metrics)`: what the custom loops optimize and report (the
      task's, as the model was compiled: tfrecipe.models.build.objective); fit needs none.
    call_steps: the custom loop's `planned -> steps` for its next call, or None: a profiler's
      window (`tfrecipe.perf.profiler.StepProfiler.call_steps`) takes its steps one per call.
    epochs_per_call: fit on a held split: epochs per call (tfrecipe.loops.epoch_groups).
    """

    epochs: int
    steps_per_epoch: int
    validation_freq: int = 1
    verbose: int = 1
    steps_per_loop: int = 1
    gradient_accumulation_steps: int = 1
    initial_step: int = 0
    train_data_from: Callable[[int], Any] | None = None
    input_clock: InputClock | None = None
    objective: Callable[[], tuple[Any, Any]] | None = None
    call_steps: Callable[[int], int] | None = None
    epochs_per_call: int = 1
