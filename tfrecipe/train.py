"""`train(cfg)`: one training run, as a list of steps.

cluster -> strategy -> precision -> data -> (in strategy.scope()) model, optimizer, metrics
-> (restore) -> loop -> results in the run directory. How each step is assembled lives in
`tfrecipe.training`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from omegaconf import DictConfig

from tfrecipe import compat, factory, optim, rundir, signature, tasks
from tfrecipe.callbacks import progress_verbosity
from tfrecipe.config import schema
from tfrecipe.config.changes import check_resume_unchanged
from tfrecipe.config.trust import Trust
from tfrecipe.data import fingerprint, table_stream
from tfrecipe.data.tabular import STATS_WAIT_S, StatsCache
from tfrecipe.distribute import cluster, evaluator
from tfrecipe.distribute.strategy import build_strategy, device_kinds
from tfrecipe.errors import ConfigError, DataError
from tfrecipe.fault import backup, preemption, recovery, watchdog
from tfrecipe.fault.preemption import Preempted
from tfrecipe.fault.recovery import Recovery
from tfrecipe.loops import custom, finetune, fit, parameter_server
from tfrecipe.loops.options import LoopOptions
from tfrecipe.models import export as exports
from tfrecipe.outcome import (
    BACKUP_DIR,
    TrainingError,
    check_resume_batch,
    ensure_fresh_run_dir,
)
from tfrecipe.perf.clock import InputClock
from tfrecipe.precision import set_precision
from tfrecipe.training import baselines, lr_find, pacing, performance, protection
from tfrecipe.training import ensemble as ensembles
from tfrecipe.training import inputs as data
from tfrecipe.training import model as models
from tfrecipe.training import monitors as monitoring
from tfrecipe.training import summary as summaries
from tfrecipe.training.inputs import Inputs, batch_sizes
from tfrecipe.training.monitors import Monitors
from tfrecipe.training.protection import Protection
from tfrecipe.training.summary import RunSummary

__all__ = ["TrainingError", "batch_sizes", "ensure_fresh_run_dir", "seed_everything", "train"]

log = logging.getLogger("tfrecipe")

# The loop that trains a run: its `loop` option, except on parameter servers, which train through
# a ClusterCoordinator (their own custom loop).
_LOOPS = {"fit": fit, "custom": custom, "parameter_server": parameter_server}


def seed_everything(seed: int, *, deterministic: bool) -> None:
    keras.backend.clear_session()  # nothing left over from an earlier run in this process
    keras.utils.set_random_seed(seed)  # Python, NumPy and TensorFlow
    # Set both ways: an earlier run in this process (a sweep job, a test) may have turned it on.
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    else:
        # TensorFlow 2.21 exports only the enabling half (no tf.config...disable_op_determinism).
        compat.disable_op_determinism()


def train(cfg: DictConfig, *, run_dir: str | Path, trust: Trust | None = None) -> dict[str, Any]:
    """Trains as `cfg` says; writes the run directory; returns the summary (summary.json).

    Args:
      cfg: the composed config (`tfrecipe.compose(overrides)`).
      run_dir: where the run writes.
      trust: what may grant code (`allowed_targets`): `Trust.from_command_line(overrides)` for
        the overrides you composed with; None: what this process's command line granted (a
        sweep's job inherits its sweep's), which in a plain Python process is nothing.

    Raises:
      ConfigError: the configuration is invalid (nothing has been written).
      TrainingError: training failed (summary.json says "failed").
    """
    run = schema.validate(cfg, trust=trust or Trust.of_this_process())
    task = _join_cluster(run)
    if task.type == "evaluator":  # a sidecar: reads the run dir the workers write
        return _evaluate_checkpoints(run, Path(run_dir))
    # What config.yaml and W&B hold: the raw config goes no further than here.
    config = rundir.public_config(cfg)
    if task.is_chief:
        return _train(config, run, task, _Dirs(run_dir=Path(run_dir), shared_run_dir=Path(run_dir)))
    # Only the chief writes the run dir; the others write the same files (every worker must
    # take part in saving synchronized variables) to a scratch dir they delete.
    with tempfile.TemporaryDirectory(prefix=f"tfrecipe-{task.type}{task.index}-") as scratch:
        dirs = _Dirs(run_dir=Path(scratch), shared_run_dir=Path(run_dir))
        return _train(config, run, task, dirs)


def _evaluate_checkpoints(run: schema.RunConfig, run_dir: Path) -> dict[str, Any]:
    """The sidecar evaluator: the run's model, compiled like training's, scores each checkpoint
    on the validation split (the test split when there is none), prepared like training's
    evaluation data, all on the default strategy (it joins no collective)."""
    started = time.perf_counter()
    splits = factory.load_splits(
        run.dataset,
        allowed_targets=run.allowed_targets,
        stats_cache=StatsCache(run_dir, chief=False, wait_s=STATS_WAIT_S),  # the chief's
        task=run.task,
    )
    model = factory.build_model(
        run.model, splits, task=run.task, allowed_targets=run.allowed_targets
    )
    factory.compile_model(model, task=run.task, allowed_targets=run.allowed_targets)
    split = "validation" if splits.validation is not None else "test"
    data = factory.evaluation_data(
        splits, split, run.pipeline, batch_size=run.batching.per_replica_batch_size, seed=run.seed
    )
    return evaluator.evaluate_checkpoints(model, data, run_dir=run_dir, started=started)


@dataclasses.dataclass(frozen=True)
class _Dirs:
    """Where this process writes: the run dir on the chief, a scratch dir on another worker,
    which restores from the chief's backups in the shared run dir."""

    run_dir: Path
    shared_run_dir: Path  # the chief's run dir

    @property
    def chief(self) -> bool:
        return self.run_dir == self.shared_run_dir

    @property
    def backup_dir(self) -> Path:
        return self.shared_run_dir / BACKUP_DIR  # every worker reads the chief's

    def stats_cache(self) -> StatsCache:
        """The table statistics: the chief computes them, the others wait for its."""
        return StatsCache(
            self.shared_run_dir, chief=self.chief, wait_s=0 if self.chief else STATS_WAIT_S
        )


def _join_cluster(run: schema.RunConfig) -> cluster.Task:
    """Who this process is; parameter servers and their workers serve here and never return."""
    if run.cluster.name == "local":
        raise ConfigError(
            "cluster=local: the local launcher runs from the command line (python -m tfrecipe "
            "... cluster=local), not inside a sweep or train(); use cluster=tf_config here"
        )
    task = cluster.current_task(run.cluster)
    if run.strategy.name == "parameter_server" and task.type in ("ps", "worker"):
        cluster.serve(run.cluster)
    return task


def _train(
    config: Mapping[str, Any], run: schema.RunConfig, task: cluster.Task, dirs: _Dirs
) -> dict[str, Any]:
    """Trains into `dirs.run_dir`. However it ends, summary.json says how: also after a
    failure, SIGTERM or Ctrl-C before training began (a config error writes nothing)."""
    attempt: dict[str, RunSummary] = {}  # "summary": this attempt's, once training set it up
    # The command line locks the run dir for the whole process; a lock taken here (train()
    # called directly, a sweep's job) is given back when the run ends.
    locked_before = rundir.holds_run_dir(dirs.run_dir)
    with preemption.signals_preempt():
        try:
            steps = _train_ensemble if run.ensemble.seeds > 1 else _train_steps
            return steps(config, run, task, dirs, attempt).fields
        except ConfigError:
            raise
        except BaseException as error:
            summary = attempt.get("summary")
            if summary is None or summary.status == "running":  # not recorded by finish()
                status = "preempted" if isinstance(error, Preempted) else "failed"
                summaries.record_unfinished(dirs.run_dir, summary, status, error, chief=dirs.chief)
            raise
        finally:
            if not locked_before:
                rundir.unlock_run_dir(dirs.run_dir)


def _train_steps(
    config: Mapping[str, Any],
    run: schema.RunConfig,
    task: cluster.Task,
    dirs: _Dirs,
    attempt: dict[str, RunSummary],
) -> RunSummary:
    """The steps of one run; `attempt["summary"]` is its summary once the run dir holds it."""
    started = time.perf_counter()
    _claim_run_dir(dirs, resume=run.resume)
    check_resume_unchanged(
        dirs.run_dir, config, resume=run.resume, allowed=run.resume_allow_changes
    )
    data_files = (  # what it trains on, taken first: a resume on other data is refused
        fingerprint.check_resumed(dirs.run_dir, run.dataset.model_dump(by_alias=True),
                                  allowed=run.resume_allow_changes, resume=run.resume)
        if dirs.chief else None
    )  # fmt: skip
    strategy = _setup_strategy(run, task)
    per_replica_batch, global_batch = batch_sizes(run.batching, strategy.num_replicas_in_sync)
    check_resume_batch(
        dirs.shared_run_dir, global_batch=global_batch, num_replicas=strategy.num_replicas_in_sync
    )
    splits, steps_per_epoch = data.load_data(run, global_batch, stats_cache=dirs.stats_cache())
    if run.baseline.name == "auto":  # refused before training, not after it
        baselines.check_applicable(splits, dataset=run.dataset.target)
    model = models.build_model(run, strategy, splits, steps_per_epoch, global_batch)
    models.check_export_formats(run.export.formats, model)  # before training, not after it
    phases = models.two_phases(run, strategy, model, steps_per_epoch, global_batch)
    if phases is not None:  # a backup past the switch holds phase two's optimizer
        phases.resume_in_phase_two(recovery.candidates(run.resume, dirs.backup_dir))
    # before a restore, which sets a float rate's variable to the backup's
    policy = protection.recovery_policy(run, model, dirs.backup_dir, steps_per_epoch)
    resumed = recovery.restore(model, resume=run.resume, backup_dir=dirs.backup_dir)
    warm = models.warm_start_from(run.model, strategy, model) if resumed is None else None
    start_step = resumed.step if resumed else 0
    steps_per_call = pacing.pace(run, model, steps_per_epoch, start_step)  # decided once
    inputs = data.build_inputs(run, strategy, splits, steps_per_epoch, global_batch, start_step)

    summary = RunSummary(
        dirs.run_dir,
        summaries.initial_fields(
            run,
            num_replicas=strategy.num_replicas_in_sync,
            per_replica_batch=per_replica_batch,
            global_batch=global_batch,
            learning_rate=models.initial_learning_rate(run, global_batch),
            run_dir=dirs.run_dir,
        ),
        started=started,
    )
    summary.update(summaries.how_it_runs(model, steps_per_call=steps_per_call))
    summary.update(provenance=performance.run_provenance(task, strategy))
    log.info("model: %(total)d parameters, %(trainable)d trainable", summary["params"])
    summary.update(summaries.options_used(phases, warm, inputs.class_weight))
    if run.task.name == "binary":  # what auc, precision and recall are about
        summary.update(positive_class=tasks.positive_class(run.task, splits.info))
    if resumed:
        summary.update(
            resumed_from_step=resumed.step,
            rollbacks=policy.resume_rollbacks(model, dirs.shared_run_dir, resumed.step),
        )
    if dirs.chief:  # stalls of earlier starts of this run (their stack files, summary.json)
        earlier = (rundir.read_summary(dirs.run_dir) or {}).get("stalls")
        summary.update(stalls=watchdog.recorded_stalls(dirs.run_dir, earlier))
    summary.start(config, chief=dirs.chief)
    if dirs.chief:  # what predictions need: class names, target encoding, input columns
        signature.write(dirs.run_dir, models.describe(run, splits, model))
        fingerprint.record(dirs.run_dir, data_files)
    attempt["summary"] = summary
    if run.loop.lr_find.enabled:
        summary.update(lr_find=_find_learning_rate(run, model, inputs, dirs))
        summary.write()
        if run.loop.lr_find.only:  # `tfrecipe lr-find`: the sweep is the run
            summary.finish("completed", rows=[], steps_completed=start_step, examples_per_sec=None)
            return summary

    monitors = monitoring.build_monitors(
        run,
        config=config,
        chief=task.is_chief,
        run_dir=dirs.run_dir,
        inputs=inputs,
        global_batch=global_batch,
        strategy=strategy,
        start_step=start_step,
        resuming=resumed is not None,
        watchdog=watchdog.build_watchdog(
            run.cluster.stall_timeout,
            task=f"{task.type}-{task.index}" if task.type is not None else None,
            run_dir=dirs.shared_run_dir,
            chief=dirs.chief,
        ),
    )
    # A fresh run keeps its first step's state: a rollback before the first periodic backup.
    protected = protection.fault_tolerance(
        run,
        in_cluster=task.type is not None,
        model=model,
        run_dir=dirs.run_dir,
        steps_per_epoch=steps_per_epoch,
        save_at_start=resumed is None,
    )
    measure = functools.partial(
        performance.perf_fields,
        element_spec=getattr(inputs.train, "element_spec", None),  # parameter servers: none
        per_replica_batch=per_replica_batch,
        global_batch=global_batch,
        hosts=summary["provenance"]["hosts"],
        asynchronous=run.strategy.name == "parameter_server",
        deterministic=run.deterministic,
    )
    with _recording_end(summary, monitors, model, protected, measure):
        _run_loop(
            run, model, inputs, summary, monitors, protected, start_step, policy,
            steps_per_call=steps_per_call, phases=phases,
        )  # fmt: skip
        if run.baseline.name == "auto" and dirs.chief:  # after the model: it names no layer first
            summary.update(baselines=_fit_baselines(run, splits))
    return summary


def _fit_baselines(run: schema.RunConfig, splits) -> dict[str, Any]:
    """scikit-learn's baselines on the run's split and preprocessing (the whole table's
    splits, not a worker's share)."""
    started = time.perf_counter()
    fitted = baselines.fit_baselines(
        splits,
        task=run.task,
        pipeline=run.pipeline,
        max_rows=run.baseline.max_rows,
        seed=run.seed,
        allowed_targets=run.allowed_targets,
    )
    log.info("baselines fitted in %.1fs", time.perf_counter() - started)
    return fitted


def _find_learning_rate(
    run: schema.RunConfig, model: keras.Model, inputs: Inputs, dirs: _Dirs
) -> dict[str, Any]:
    """`loop.lr_find`: the range test with the run's loop on a fresh stream of its training
    data; the model is put back as it was."""
    found = lr_find.find_learning_rate(
        run, model, _loop_of(run), inputs.train_from(0), run_dir=dirs.run_dir, chief=dirs.chief
    )
    log.info(
        "lr_find: suggested learning rate %s (lowest loss at %s) after %d steps; plot: %s",
        found["suggested_learning_rate"],
        found["min_loss_learning_rate"],
        found["steps"],
        dirs.run_dir / lr_find.PLOT,
    )
    return found


def _loop_of(run: schema.RunConfig):
    """The loop that trains a run (parameter servers: their ClusterCoordinator loop)."""
    return _LOOPS["parameter_server" if run.strategy.name == "parameter_server" else run.loop.name]


def _train_ensemble(
    config: Mapping[str, Any],
    run: schema.RunConfig,
    task: cluster.Task,
    dirs: _Dirs,
    attempt: dict[str, RunSummary],
) -> RunSummary:
    """`ensemble.seeds=N`: N member runs (RUN_DIR/members/I, seed + I; a completed member is
    kept, an interrupted one resumes from its own backup), then one model averaging them,
    evaluated, exported and recorded as a single run's."""
    started = time.perf_counter()
    _claim_run_dir(dirs, resume=run.resume)
    check_resume_unchanged(
        dirs.run_dir, config, resume=run.resume, allowed=run.resume_allow_changes
    )
    summary = RunSummary(
        dirs.run_dir, summaries.ensemble_fields(run, dirs.run_dir), started=started
    )
    summary.start(config, chief=dirs.chief)
    attempt["summary"] = summary
    members = []
    for index in range(run.ensemble.seeds):
        member_dir = dirs.run_dir / ensembles.MEMBERS / str(index)
        member_run, member_config = ensembles.member_config(run, config, index)
        done = rundir.read_summary(member_dir)
        if not (done and done.get("status") == "completed"):
            log.info("ensemble: member %d of %d (seed %d)", index + 1, run.ensemble.seeds,
                     member_run.seed)  # fmt: skip
            done = _train(member_config, member_run, task, _Dirs(member_dir, member_dir))
        members.append(done)
        summary.update(ensemble=ensembles.record(run, members))
        summary.write()
    splits = factory.load_splits(
        run.dataset, allowed_targets=run.allowed_targets,
        stats_cache=StatsCache(dirs.run_dir / ensembles.MEMBERS / "0", chief=False), task=run.task,
    )  # fmt: skip
    summary.update(ensembles.as_single_run(members))
    if dirs.chief:  # the members' inputs and outputs are the ensemble's (predict reads it)
        signature.write(dirs.run_dir, signature.read(dirs.run_dir / ensembles.MEMBERS / "0"))
    model = ensembles.load(run, dirs.run_dir)
    scored = ensembles.scores(run, model, splits)  # test, and val_ metrics
    summary.update(test=scored["test"])
    summary.update(exports=_export(run, model, dirs.run_dir, _undistributed(splits)))
    if run.baseline.name == "auto":
        summary.update(baselines=_fit_baselines(run, splits))
    summary.finish(
        "completed",
        rows=[],
        steps_completed=sum(m["steps_completed"] for m in members),
        examples_per_sec=None,
    )
    summary.update(
        metrics=scored["metrics"], epochs_completed=max(m["epochs_completed"] for m in members)
    )
    summary.write()
    return summary


def _undistributed(splits) -> Inputs:
    """What `_export` reads of a run's inputs (the undistributed splits), for the ensemble."""
    return Inputs(train=None, validation=None, test=None, info=splits.info, steps_per_epoch=0,
                  train_from=lambda step: None, splits=splits)  # fmt: skip


def _claim_run_dir(dirs: _Dirs, *, resume: str) -> None:
    """Locks the chief's run dir when it exists (another run may train there), then checks it
    holds no run this one must not continue."""
    if dirs.chief and dirs.run_dir.exists():
        rundir.lock_run_dir(dirs.run_dir)
    ensure_fresh_run_dir(dirs.run_dir, resume=resume)


@contextlib.contextmanager
def _recording_end(
    summary: RunSummary,
    monitors: Monitors,
    model: keras.Model,
    protected: Protection,
    measure: Callable[..., dict[str, Any]],
) -> Iterator[None]:
    """Records how training ended (summary.json, W&B) and stops the fault-tolerance watch; an
    unexpected exception leaves as a TrainingError."""
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
    board = summary.run_dir / "tensorboard" if monitors.tensorboard else None
    _record_perf(summary, monitors, model, measure, board)
    _finish(summary, monitors, model, status="completed")


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
    if perf["diagnosis"]:
        log.warning("perf: %s", perf["diagnosis"])


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
    summary.finish(
        status,
        rows=monitors.history.rows,
        steps_completed=backup.current_step(model),
        examples_per_sec=monitors.throughput.examples_per_sec() if error is None else None,
        error=error,
    )
    for tracker in monitors.trackers:
        tracker.finish(summary.fields)


def _setup_strategy(run: schema.RunConfig, task: cluster.Task) -> tf.distribute.Strategy:
    """The strategy (first: logical devices must be set before any other TensorFlow call),
    then seeds, then the precision policy (seeding clears the Keras session, which resets it)."""
    strategy = build_strategy(run.strategy, cluster_resolver=cluster.build_resolver(run.cluster))
    seed_everything(run.seed, deterministic=run.deterministic)
    # auto on a cluster: float32, since workers on different machines could pick differently.
    policy = run.precision.policy
    set_precision(
        "float32" if policy == "auto" and task.type is not None else policy,
        require_native=run.precision.require_native,
        device_kinds=device_kinds(strategy),
    )
    return strategy


def _run_loop(
    run: schema.RunConfig,
    model: keras.Model,
    inputs: Inputs,
    summary: RunSummary,
    monitors: Monitors,
    protected: Protection,
    start_step: int,
    policy: Recovery,
    *,
    steps_per_call: int,
    phases: finetune.TwoPhases | None = None,
) -> None:
    """Trains with the configured loop (again from a backup after each rollback; in two phases
    with `loop.finetune`), then evaluates the test split and exports the model."""
    options = _loop_options(run, inputs, steps_per_call, monitors.input_clock)
    loop = _loop_of(run)
    if phases is not None:
        loop = finetune.TwoPhaseLoop(loop, phases, on_switch=protected.follow_optimizer)
    callbacks = [*monitors.callbacks, *protected.callbacks]
    unused = [inputs.train]  # the first attempt's data, from start_step on

    def train_from(step: int) -> None:
        # After a rollback: the seeded stream from the restored step on, as a resumed run reads it.
        data = unused.pop() if unused else inputs.train_from(step)
        at_step = dataclasses.replace(options, initial_step=step)
        loop.run(model, data, inputs.validation, options=at_step, callbacks=callbacks)

    policy.train(
        model,
        train_from,
        start_step=start_step,
        history=monitors.history,
        rollbacks=summary["rollbacks"],
        on_rollback=summary.write,
    )
    optim.use_averaged_weights(model)  # optimizer.ema: test and export the average
    rows = monitors.history.rows
    summary.update(summaries.best_epoch(run.callbacks, rows, epochs=run.loop.epochs))
    plotting = rundir.plot_curves_in_background(  # beside these
        summary.run_dir, rows, tasks.main_metric(run.task)
    )
    try:
        if inputs.test is not None:
            summary.update(test=loop.evaluate(model, inputs.test))
        summary.update(exports=_export(run, model, summary.run_dir, inputs))
    finally:
        plotting.join()


def _loop_options(
    run: schema.RunConfig, inputs: Inputs, steps_per_call: int, input_clock: InputClock | None
) -> LoopOptions:
    return LoopOptions(
        epochs=run.loop.epochs,
        steps_per_epoch=inputs.steps_per_epoch,
        validation_freq=run.loop.validation_freq,
        verbose=progress_verbosity(run.loop.verbose, enabled=run.callbacks.progress.enabled),
        steps_per_loop=steps_per_call,
        gradient_accumulation_steps=run.loop.gradient_accumulation_steps,
        train_data_from=inputs.train_from,
        input_clock=input_clock,
    )


def _export(run: schema.RunConfig, model: keras.Model, run_dir: Path, inputs: Inputs):
    """Every format of `export.formats`, each checked against Keras on held-out examples
    (tfrecipe.models.export); model.keras whatever the formats: `tfrecipe evaluate` reads it."""
    try:
        return exports.export_run(
            model,
            run_dir,
            exports.options_from(run.export),
            splits=inputs.splits,
            pipeline=run.pipeline,
            task=run.task,
            batch_size=run.batching.per_replica_batch_size,
        )
    except exports.ExportError as error:
        raise TrainingError(f"export failed: {error}") from None
