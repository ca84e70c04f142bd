"""The loop that trains a run, as the plan picks it (fit, custom, parameter servers' custom
loop), driven from a backup again after each rollback; then the test split and the exports;
and how training ended, recorded (summary.json, the trackers) however it ends."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keras

from tfrecipe import optim, tasks
from tfrecipe.callbacks import progress_verbosity
from tfrecipe.config import schema
from tfrecipe.config.plan import RunPlan
from tfrecipe.data import table_stream
from tfrecipe.data.pipeline import PipelineOptions
from tfrecipe.errors import DataError
from tfrecipe.fault import backup
from tfrecipe.fault.preemption import Preempted
from tfrecipe.loops import custom, epoch_groups, finetune, fit, parameter_server
from tfrecipe.loops.options import LoopOptions
from tfrecipe.models import export as exports
from tfrecipe.models.freeze import param_counts
from tfrecipe.outcome import TrainingError
from tfrecipe.perf import report
from tfrecipe.tracking import optuna_reporter
from tfrecipe.training import baselines, lr_find, performance
from tfrecipe.training.context import Built, RunContext
from tfrecipe.training.inputs import Inputs
from tfrecipe.training.monitors import Monitors
from tfrecipe.training.protection import Protection
from tfrecipe.training.summary import RunSummary

log = logging.getLogger("tfrecipe")

# The loop of each of the plan's loop kinds.
_LOOPS = {"fit": fit, "custom": custom, "parameter_server": parameter_server}


def loop_of(plan: RunPlan):
    """The loop that trains a run (parameter servers: their ClusterCoordinator loop)."""
    return _LOOPS[plan.loop]


def options(
    spec: schema.Loop,
    *,
    objective: Callable[[], tuple[Any, Any]],
    progress: bool,
    inputs: Inputs,
    steps_per_call: int,
    monitors: Monitors,
) -> LoopOptions:
    """The loop's options (`objective`: the task's, `models.build.objective`; `progress`:
    `callbacks.progress.enabled`; `monitors`: the input clock, and a profiler's window, which
    the custom loop takes one step per call)."""
    profiler = monitors.profiler
    return LoopOptions(
        epochs=spec.epochs,
        steps_per_epoch=inputs.steps_per_epoch,
        validation_freq=spec.validation_freq,
        verbose=progress_verbosity(spec.verbose, enabled=progress),
        steps_per_loop=steps_per_call,
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        train_data_from=inputs.train_from,
        input_clock=monitors.input_clock,
        objective=objective,
        call_steps=profiler.call_steps if profiler is not None else None,
    )


def with_epoch_groups(
    options: LoopOptions,
    ctx: RunContext,
    built: Built,
    monitors: Monitors,
    protected: Protection,
    summary: RunSummary,
) -> LoopOptions:
    """`options` with the epochs per call `batching.epochs_per_call` gets under the run's
    callbacks (tfrecipe.loops.epoch_groups); summary.json's `epochs_per_call` says how many and
    why."""
    setting = built.batches.batching.epochs_per_call
    callbacks = [*monitors.callbacks, *protected.callbacks]  # as train_model runs them
    compiled = summary["resident"]["xla"] == "loop"  # one XLA program a call: longer calls
    count, why = epoch_groups.choose(
        setting, callbacks, built.data, options, loop=ctx.plan.loop, compiled=compiled
    )
    summary.update(epochs_per_call={"epochs": count, "why": why})
    return dataclasses.replace(options, epochs_per_call=count)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exporting:
    """What exporting a trained model needs: `export`, and its examples prepared as training's
    (`batch_size` per replica)."""

    spec: schema.Export
    pipeline: PipelineOptions
    task: schema.Task
    batch_size: int

    def export(self, model: keras.Model, run_dir: Path, splits) -> dict[str, Any]:
        """Every format of `export.formats`, each checked against Keras on held-out examples
        (tfrecipe.models.export); model.keras whatever the formats: `tfrecipe evaluate` reads
        it. `splits`: the undistributed splits."""
        try:
            return exports.export_run(
                model,
                run_dir,
                exports.options_from(self.spec),
                splits=splits,
                pipeline=self.pipeline,
                task=self.task,
                batch_size=self.batch_size,
            )
        except exports.ExportError as error:
            raise TrainingError(f"export failed: {error}") from None


@dataclasses.dataclass(frozen=True)
class Finishing:
    """What a trained model goes through: its exports, and the baselines fitted beside it."""

    exporting: Exporting
    fit_baselines: Callable[[Any], dict[str, Any]] | None  # baseline=auto


def finishing(
    ctx: RunContext, export: schema.Export, batching: schema.Batching, baseline: schema.Baseline
) -> Finishing:
    """The exports of `export.formats`, their examples prepared as training's, and the
    baselines `baseline=auto` fits."""
    exporting = Exporting(
        spec=export,
        pipeline=ctx.pipeline,
        task=ctx.task,
        batch_size=batching.per_replica_batch_size,
    )
    return Finishing(exporting, baselines.fitter(baseline, ctx))


def train_model(
    ctx: RunContext,
    built: Built,
    options: LoopOptions,
    summary: RunSummary,
    monitors: Monitors,
    protected: Protection,
):
    """Trains with the plan's loop (again from a backup after each rollback; in two phases with
    `loop.finetune`); the model ends on its averaged weights with `optimizer.ema`. Returns the
    loop, which evaluates the test split."""
    model, inputs = built.model, built.data
    if built.resumed and inputs.steps_per_epoch:  # what the model completed before this start
        summary.update(epochs_completed=built.resumed.step // inputs.steps_per_epoch)
    loop = loop_of(ctx.plan)
    if built.phases is not None:
        loop = finetune.TwoPhaseLoop(loop, built.phases, on_switch=protected.follow_optimizer)
    callbacks = [*monitors.callbacks, *protected.callbacks]
    unused = [inputs.train]  # the first attempt's data, from start_step on

    def train_from(step: int) -> None:
        # After a rollback: the seeded stream from the restored step on, as a resumed run reads it.
        data = unused.pop() if unused else inputs.train_from(step)
        at_step = dataclasses.replace(options, initial_step=step)
        loop.run(model, data, inputs.validation, options=at_step, callbacks=callbacks)

    built.policy.train(
        model,
        train_from,
        start_step=built.start_step,
        history=monitors.history,
        rollbacks=summary["rollbacks"],
        on_rollback=summary.write,
    )
    optim.use_averaged_weights(model)  # optimizer.ema: test and export the average
    return loop


def test_and_export(
    loop,
    built: Built,
    summary: RunSummary,
    exporting: Exporting,
    *,
    rows: list[dict[str, float]],
    objective: Callable[[], tuple[Any, Any]],
) -> None:
    """The test split's scores (`objective`'s loss and metrics) and the exports, while the
    curves of the epochs' `rows` are plotted beside them."""
    model, inputs = built.model, built.data
    plotting = summary.home.plot_curves_in_background(rows, tasks.main_metric(exporting.task))
    try:
        if inputs.test is not None:
            summary.update(test=loop.evaluate(model, inputs.test, objective=objective))
        summary.update(exports=exporting.export(model, summary.home.path, inputs.splits))
    finally:
        plotting.join()


def find_learning_rate(
    spec: schema.LRFind, ctx: RunContext, built: Built, sweeping: lr_find.Sweeping
) -> dict[str, Any]:
    """`loop.lr_find`: the range test with the run's loop on a fresh stream of its training
    data; the model is put back as it was."""
    data = built.data.train_from(0)
    return lr_find.find_learning_rate(spec, built.model, loop_of(ctx.plan), data, ctx, sweeping)


def measurer(
    ctx: RunContext, built: Built, *, hosts: int, validation_freq: int | None = None
) -> Callable[..., dict[str, Any]]:
    """`measure(model, clock=..., examples_per_sec=...)`: summary.json's `perf` of this run;
    its diagnosis names only remedies the run does not already apply (the pipeline, the steps
    per call)."""
    plan, inputs, pipeline = ctx.plan, built.data, ctx.pipeline
    steps_per_call, per_replica_batch = built.steps_per_call, built.per_replica_batch
    knobs = report.Knobs(
        cache=pipeline.cache if pipeline else None,
        num_parallel_calls=pipeline.num_parallel_calls if pipeline else None,
        steps_per_call=steps_per_call,
        steps_per_epoch=inputs.steps_per_epoch,
        steps_key=plan.steps_key(replicas=built.strategy.num_replicas_in_sync),
        per_replica_batch=per_replica_batch,
        bounded_by=plan.call_bounds(inputs.steps_per_epoch) if inputs.steps_per_epoch else (),
        validation_freq=validation_freq,
        prefetches=True,  # tfrecipe.data.distribute ends every input in a prefetch
        held=bool((inputs.resident or {}).get("resident")),
    )
    measured = performance.Measured(
        element_spec=getattr(inputs.train, "element_spec", None),  # parameter servers: none
        per_replica_batch=per_replica_batch,
        global_batch=built.global_batch,
        hosts=hosts,
        asynchronous=plan.parameter_servers,
        deterministic=ctx.deterministic,
        knobs=knobs,
    )
    return functools.partial(performance.perf_fields, measured=measured)


@contextlib.contextmanager
def recording_end(
    summary: RunSummary,
    monitors: Monitors,
    model: keras.Model,
    protected: Protection,
    measure: Callable[..., dict[str, Any]],
) -> Iterator[None]:
    """Records how training ended (summary.json, the trackers) and stops the fault-tolerance
    watch; an unexpected exception leaves as a TrainingError, a streamed table's bad cell as a
    DataError."""
    try:
        yield
    except BaseException as error:
        if monitors.watchdog is not None:  # what follows is the failure's handling, not a stall
            monitors.watchdog.stop()
        bad_cell = table_stream.data_error(error)
        if bad_cell is not None:  # a streamed table's bad cell: the data's fault, exit 2
            error = DataError(f"dataset: {bad_cell}")
        status = "preempted" if isinstance(error, Preempted) else "failed"
        _finish(summary, monitors, model, status=status, error=error)
        if isinstance(error, DataError):
            raise error from None
        if isinstance(error, Exception) and not isinstance(error, TrainingError | Preempted):
            raise TrainingError(summary["error"]) from error
        raise
    finally:
        protected.close()
    board = summary.home.path / "tensorboard" if monitors.tensorboard else None
    _record_perf(summary, monitors, model, measure, board)
    pruned = optuna_reporter.pruned_at(monitors.callbacks)  # an Optuna trial its pruner stopped
    if pruned is not None:
        summary.update(pruned_at_epoch=pruned)
    _finish(summary, monitors, model, status="completed" if pruned is None else "pruned")


def _record_perf(
    summary: RunSummary,
    monitors: Monitors,
    model: keras.Model,
    measure: Callable[..., dict[str, Any]],
    board: Path | None,
) -> None:
    """summary.json's `perf` (where the time went) and its diagnosis, also on the console and
    in TensorBoard (`board`: the run's TensorBoard dir, if it logs there)."""
    perf = measure(
        model,
        clock=monitors.step_clock,
        examples_per_sec=monitors.throughput.examples_per_sec(),
    )
    if monitors.profile is not None:
        perf["profile"] = monitors.profile
    summary.update(perf=perf)
    if board is not None:
        performance.log_to_tensorboard(board, perf, step=backup.current_step(model))
    said = report.console_diagnosis(perf, time.perf_counter() - summary.started)
    if said:
        log.warning("perf: %s", said)


def _finish(
    summary: RunSummary,
    monitors: Monitors,
    model: keras.Model,
    *,
    status: str,
    error: BaseException | None = None,
) -> None:
    """Writes the final summary.json (also after a failure) and finishes the tracked runs (W&B,
    MLflow, HParams)."""
    # The phase the run ended in: loop.finetune unfroze more than the start counted.
    summary.update(params=param_counts(model))
    summary.finish(
        status,
        rows=monitors.history.rows,
        steps_completed=backup.current_step(model),
        examples_per_sec=monitors.throughput.examples_per_sec() if error is None else None,
        error=error,
    )
    for tracker in monitors.trackers:
        tracker.finish(summary.fields)
