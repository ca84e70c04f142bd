"""The callbacks every loop drives (history, throughput, the configured ones, the trackers:
W&B, MLflow, TensorBoard's HParams), and the ones the run reads its results from."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from tfrecipe.callbacks import EpochHistory, Throughput, build_callbacks
from tfrecipe.config import schema
from tfrecipe.config.plan import RunPlan
from tfrecipe.distribute import evaluator
from tfrecipe.distribute.strategy import device_kinds
from tfrecipe.fault.watchdog import StallWatchdog
from tfrecipe.perf.clock import InputClock, StepClock
from tfrecipe.perf.profiler import StepProfiler
from tfrecipe.rundir import RunFiles
from tfrecipe.tracking import Tracker, optuna_reporter
from tfrecipe.training.context import Built, RunContext


@dataclasses.dataclass(frozen=True)
class Monitors:
    """The callbacks every loop drives, and the ones train() reads results from."""

    callbacks: list[keras.callbacks.Callback]
    history: EpochHistory
    throughput: Throughput
    trackers: list[Tracker]
    step_clock: StepClock  # step times and input wait (tfrecipe.perf.clock)
    input_clock: InputClock | None  # what the loop stamps its steps with (None: it cannot)

    watchdog: StallWatchdog | None = None

    @property
    def tensorboard(self) -> bool:
        return any(isinstance(c, keras.callbacks.TensorBoard) for c in self.callbacks)

    @property
    def profiler(self) -> StepProfiler | None:
        """The profiler window (`logger.tensorboard.profile_batch`), where one is asked for."""
        return next((c for c in self.callbacks if isinstance(c, StepProfiler)), None)

    @property
    def profile(self) -> dict[str, Any] | None:
        """The profiler window's analysis, once it closed."""
        profiler = self.profiler
        if profiler is None:
            return None
        if profiler.result is None:  # the window was never reached
            return {
                "error": f"the run ended after {profiler.steps_seen} steps, before step "
                f"{profiler.first} (logger.tensorboard.profile_batch)"
            }
        return profiler.result


@dataclasses.dataclass(frozen=True, kw_only=True)
class MonitorOptions:
    """What the monitors read of the config besides `callbacks` and `logger`."""

    export_formats: Collection[str]  # `export.formats`: periodic exports write those they can
    averaged_weights: bool  # `optimizer.ema`: validation scores the averaged weights
    sidecar_evaluator: bool  # `cluster.evaluator`: per-epoch checkpoints for it
    epoch_is_a_pass: bool  # no `loop.steps_per_epoch`: an epoch reads the training split once


def build_monitors(
    ctx: RunContext,
    built: Built,
    spec: schema.Callbacks,
    logger: schema.Logger,
    knobs: MonitorOptions,
    watchdog: StallWatchdog | None = None,
) -> Monitors:
    """The callbacks (`spec`) and trackers (`logger`) of the run `ctx` says; the chief records
    the run (W&B, MLflow), the others train into a scratch dir. `watchdog`: the progress
    watchdog (tfrecipe.fault.watchdog), when it is on."""
    plan, run_dir, inputs, start_step = ctx.plan, ctx.home.path, built.data, built.start_step
    history = EpochHistory(ctx.home)
    # A resumed run keeps the epochs it already finished (history.csv is the chief's: every
    # worker's early stopping counts them alike).
    chiefs = RunFiles(ctx.home.shared)
    history.rows = chiefs.history()[: start_step // inputs.steps_per_epoch]
    throughput = Throughput(
        examples_per_step=built.global_batch * plan.gradient_accumulation_steps,
        examples_per_epoch=inputs.info.num_train if knobs.epoch_is_a_pass else None,
    )
    input_clock = _input_clock(plan, built.strategy, deterministic=ctx.deterministic)
    step_clock = StepClock(input_clock)
    callbacks = [
        history,
        throughput,
        step_clock,
        *build_callbacks(
            spec,
            logger,
            home=ctx.home,
            grants=ctx.grants,
            export_formats=knobs.export_formats,
            earlier_epochs=history.rows,  # a resumed checkpoint keeps their best
            chiefs=chiefs,
        ),
    ]
    if knobs.averaged_weights:  # validation scores the averaged weights, training goes on raw
        callbacks.insert(0, keras.callbacks.SwapEMAWeights())
    if watchdog is not None:  # first: a step counts as done before any other callback runs
        callbacks.insert(0, watchdog)
    if knobs.sidecar_evaluator:  # checkpoints for the sidecar evaluator
        callbacks += evaluator.checkpoint_callbacks(ctx.home)
    # One tracked run per training run: the chief's (other workers train into a scratch dir).
    resuming = built.resumed is not None
    trackers = (
        _start_tracking(logger, ctx.config, run_dir, history, resume=resuming) if ctx.chief else []
    )
    for tracker in trackers:
        callbacks += tracker.callbacks()
    callbacks += optuna_reporter.reporters(ctx.config, chief=ctx.chief)  # an Optuna trial: last
    return Monitors(callbacks, history, throughput, trackers, step_clock, input_clock, watchdog)


def _input_clock(
    plan: RunPlan, strategy: tf.distribute.Strategy, *, deterministic: bool
) -> InputClock | None:
    """What the loop stamps its steps with. Parameter servers run their steps as closures on the
    workers: nothing to stamp here; with op determinism on, TensorFlow refuses clock ops in a
    graph. TPUs compile the step whole, with no clock op."""
    if plan.parameter_servers or deterministic or "TPU" in device_kinds(strategy):
        return None
    return InputClock(strategy)


def _start_tracking(
    logger: schema.Logger,
    config: Mapping[str, Any],
    run_dir: Path,
    history: EpochHistory,
    *,
    resume: bool,
) -> list[Tracker]:
    """The trackers `logger` switches on: W&B (grouped by sweep in a multirun), MLflow (a child
    of the sweep's parent run), TensorBoard's HParams; a resumed training run continues the W&B
    and MLflow runs it began."""
    trackers: list[Tracker] = []
    sweep_dir = _sweep_dir()
    if logger.wandb is not None:
        from tfrecipe.tracking.wandb_run import WandbTracker

        group = "-".join(sweep_dir.parts[-2:]) if sweep_dir else None
        trackers.append(
            WandbTracker(
                logger.wandb,
                config=copy.deepcopy(dict(config)),  # W&B's own copy
                run_dir=run_dir,
                sweep_group=group,
                resume=resume,
            )
        )
    if logger.mlflow is not None:
        from tfrecipe.tracking.mlflow_run import MlflowTracker

        trackers.append(
            MlflowTracker(
                logger.mlflow,
                config=config,
                run_dir=run_dir,
                history=lambda: history.rows,  # each epoch's row, as history.csv has it
                sweep_dir=sweep_dir,
                resume=resume,
            )
        )
    if logger.tensorboard is not None:
        from tfrecipe.tracking.hparams import HParamsTracker, hyperparameters

        overrides = list(HydraConfig.get().overrides.task) if sweep_dir else None
        trial = run_dir.name if sweep_dir else "/".join(run_dir.parts[-2:])
        hparams = hyperparameters(config, overrides)
        trackers.append(HParamsTracker(run_dir=run_dir, hparams=hparams, trial=trial))
    return trackers


def _sweep_dir() -> Path | None:
    """The sweep's directory when this run is a job of a multirun."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(HydraConfig.get().sweep.dir).absolute()
