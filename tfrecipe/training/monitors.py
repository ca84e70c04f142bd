"""The callbacks every loop drives (history, throughput, the configured ones, W&B), and the
ones the run reads its results from."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from tfrecipe import rundir
from tfrecipe.callbacks import EpochHistory, Throughput, build_callbacks
from tfrecipe.config import schema
from tfrecipe.distribute import evaluator
from tfrecipe.distribute.strategy import device_kinds
from tfrecipe.perf.clock import InputClock, StepClock
from tfrecipe.perf.profiler import StepProfiler
from tfrecipe.tracking import WandbTracker
from tfrecipe.training.inputs import Inputs


@dataclasses.dataclass(frozen=True)
class Monitors:
    """The callbacks every loop drives, and the ones train() reads results from."""

    callbacks: list[keras.callbacks.Callback]
    history: EpochHistory
    throughput: Throughput
    tracker: WandbTracker | None
    step_clock: StepClock  # step times and input wait (tfrecipe.perf.clock)
    input_clock: InputClock | None  # what the loop stamps its steps with (None: it cannot)

    @property
    def tensorboard(self) -> bool:
        return any(isinstance(c, keras.callbacks.TensorBoard) for c in self.callbacks)

    @property
    def profile(self) -> dict[str, Any] | None:
        """The profiler window's analysis (`logger.tensorboard.profile_batch`), once it closed."""
        profilers = [c for c in self.callbacks if isinstance(c, StepProfiler)]
        if not profilers:
            return None
        profiler = profilers[0]
        if profiler.result is None:  # the window was never reached
            return {"error": f"the run ended after {profiler.calls_seen} calls, before call "
                    f"{profiler.first} (logger.tensorboard.profile_batch)"}  # fmt: skip
        return profiler.result


def build_monitors(
    run: schema.RunConfig,
    *,
    config: Mapping[str, Any],
    chief: bool,
    run_dir: Path,
    inputs: Inputs,
    global_batch: int,
    strategy: tf.distribute.Strategy,
    start_step: int = 0,
    resuming: bool = False,
) -> Monitors:
    """Args:
    config: the run's public config (secrets redacted), for W&B.
    chief: this process records the run (W&B); the others train into a scratch dir.
    strategy: the run's; the input clock keeps one sum per replica in its scope.
    """
    history = EpochHistory(run_dir)
    # A resumed run keeps the epochs it already finished (history.csv is the chief's).
    history.rows = rundir.read_history(run_dir)[: start_step // inputs.steps_per_epoch]
    throughput = Throughput(
        examples_per_step=global_batch * run.loop.gradient_accumulation_steps,
        examples_per_epoch=None if run.loop.steps_per_epoch else inputs.info.num_train,
    )
    # Parameter servers run their steps as closures on the workers: nothing to stamp here; with
    # op determinism on, TensorFlow refuses clock ops in a graph. TPUs compile the step whole,
    # with no clock op.
    stamped = (
        run.strategy.name != "parameter_server"
        and not run.deterministic
        and "TPU" not in device_kinds(strategy)
    )
    input_clock = InputClock(strategy) if stamped else None
    step_clock = StepClock(input_clock)
    callbacks = [
        history,
        throughput,
        step_clock,
        *build_callbacks(
            run.callbacks,
            run.logger,
            run_dir=run_dir,
            allowed_targets=run.allowed_targets,
            export_formats=run.export.formats,
            earlier_epochs=history.rows,  # a resumed checkpoint keeps their best
        ),
    ]
    if run.optimizer.ema:  # validation scores the averaged weights, training goes on raw
        callbacks.insert(0, keras.callbacks.SwapEMAWeights())
    if getattr(run.cluster, "evaluator", False):  # checkpoints for the sidecar evaluator
        callbacks += evaluator.checkpoint_callbacks(run_dir)
    # One W&B run per training run: the chief's (other workers train into a scratch dir).
    tracker = _start_tracking(run.logger, config, run_dir, resume=resuming) if chief else None
    if tracker is not None:
        callbacks += tracker.callbacks()
    return Monitors(callbacks, history, throughput, tracker, step_clock, input_clock)


def _start_tracking(
    logger: schema.Logger, config: Mapping[str, Any], run_dir: Path, *, resume: bool
) -> WandbTracker | None:
    """The W&B run, when `logger.wandb` is on (grouped by sweep in a multirun); a resumed
    training run continues the W&B run it began."""
    if logger.wandb is None:
        return None
    return WandbTracker(
        logger.wandb,
        config=copy.deepcopy(dict(config)),  # W&B's own copy
        run_dir=run_dir,
        sweep_group=_sweep_group(),
        resume=resume,
    )


def _sweep_group() -> str | None:
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return "-".join(Path(HydraConfig.get().sweep.dir).parts[-2:])
