"""`train(cfg)`: one training run, as a list of steps.

cluster -> strategy -> precision -> data -> (in strategy.scope()) model, optimizer, metrics
-> loop -> results in the run directory.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tfrecipe import factory, rundir
from tfrecipe.config import schema
from tfrecipe.distribute import cluster
from tfrecipe.errors import ConfigError

log = logging.getLogger("tfrecipe")

BACKUP_DIR = "backup"  # RUN_DIR/backup (tfrecipe.fault.backup.BACKUP_DIR; this module loads no TF)


class TrainingError(RuntimeError):
    """Training itself failed (not the configuration): exit code 1, summary status "failed"."""


def batch_sizes(spec: schema.Batching, num_replicas: int) -> tuple[int, int]:
    """Returns (per_replica, global): global = per-replica x replicas, or the fixed global
    batch split evenly over the replicas."""
    if spec.global_batch_size is None:
        return spec.per_replica_batch_size, spec.per_replica_batch_size * num_replicas
    if spec.global_batch_size % num_replicas:
        raise ConfigError(
            f"batching.global_batch_size={spec.global_batch_size}: must divide evenly by the "
            f"{num_replicas} replicas; use a multiple of {num_replicas}"
        )
    return spec.global_batch_size // num_replicas, spec.global_batch_size


def ensure_fresh_run_dir(run_dir: Path, *, resume: str = "auto") -> None:
    """Refuses a run dir that already holds a finished run: its outputs are never overwritten.

    A failed, preempted or interrupted run is what `resume=auto` continues; `resume=never`
    refuses it too (except when the local launcher restarts this same run after a crash).
    """
    previous = rundir.read_summary(run_dir)
    if previous and previous.get("status") == "completed":
        raise ConfigError(
            f"hydra.run.dir={run_dir}: already holds a completed run (summary.json); "
            "choose another hydra.run.dir"
        )
    restarted = int(os.environ.get(cluster.ATTEMPT_ENV, "0")) > 0  # by the launcher: same run
    held = previous is not None or (run_dir / BACKUP_DIR).is_dir()
    if resume == "never" and held and not restarted:
        status = (previous or {}).get("status", "a backup")
        raise ConfigError(
            f"resume=never: hydra.run.dir={run_dir} already holds a run ({status}); choose a new "
            "hydra.run.dir, or resume=auto to continue that run"
        )


def seed_everything(seed: int, *, deterministic: bool) -> None:
    import keras
    import tensorflow as tf

    keras.backend.clear_session()  # nothing left over from an earlier run in this process
    keras.utils.set_random_seed(seed)  # Python, NumPy and TensorFlow
    # Set both ways: an earlier run in this process (a sweep job, a test) may have turned it on.
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    else:
        # TensorFlow 2.21 exports only the enabling half (no tf.config...disable_op_determinism).
        from tensorflow.python.framework import config as tf_config

        tf_config.disable_op_determinism()


def train(cfg: DictConfig, *, run_dir: str | Path) -> dict[str, Any]:
    """Trains as `cfg` says; writes the run directory; returns the summary (summary.json).

    Raises:
      ConfigError: the configuration is invalid (nothing has been written).
      TrainingError: training failed (summary.json says "failed").
    """
    run = schema.validate(cfg)
    task = _join_cluster(run)
    if task.type == "evaluator":  # a sidecar: reads the run dir the workers write
        from tfrecipe.distribute.evaluator import evaluate_checkpoints

        return evaluate_checkpoints(run, run_dir=Path(run_dir))
    if task.is_chief:
        return _train(cfg, run, task, run_dir=Path(run_dir))
    # Only the chief writes the run dir; the others write the same files (every worker must
    # take part in saving synchronized variables) to a scratch dir they delete.
    with tempfile.TemporaryDirectory(prefix=f"tfrecipe-{task.type}{task.index}-") as scratch:
        return _train(cfg, run, task, run_dir=Path(scratch), shared_run_dir=Path(run_dir))


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
    cfg: DictConfig,
    run: schema.RunConfig,
    task: cluster.Task,
    *,
    run_dir: Path,
    shared_run_dir: Path | None = None,
) -> dict[str, Any]:
    """Trains into `run_dir` (a non-chief's scratch dir; its backups are read from
    `shared_run_dir`, the chief's run dir). However it ends, summary.json says how: also after
    a failure, SIGTERM or Ctrl-C before training began (a config error writes nothing)."""
    from tfrecipe.fault.preemption import Preempted, signals_preempt

    attempt: dict[str, Any] = {}  # "summary": this attempt's, once training set it up
    # The command line locks the run dir for the whole process; a lock taken here (train()
    # called directly, a sweep's job) is given back when the run ends.
    locked_before = rundir.holds_run_dir(run_dir)
    with signals_preempt():
        try:
            return _train_steps(
                cfg, run, task, run_dir=run_dir, shared_run_dir=shared_run_dir, attempt=attempt
            )
        except ConfigError:
            raise
        except BaseException as error:
            summary = attempt.get("summary")
            if summary is None or summary["status"] == "running":  # not recorded by _finish
                status = "preempted" if isinstance(error, Preempted) else "failed"
                _record_unfinished(run_dir, summary, status, error, chief=shared_run_dir is None)
            raise
        finally:
            if not locked_before:
                rundir.unlock_run_dir(run_dir)


def _record_unfinished(
    run_dir: Path, summary: dict | None, status: str, error: BaseException, *, chief: bool
) -> None:
    """The final status of a run that stopped before training: this attempt's summary, else
    the one an earlier attempt left (a rerun), else a new one."""
    if chief:
        try:
            rundir.lock_run_dir(run_dir)  # creates it; never write into another run's dir
        except ConfigError:
            return
    summary = summary or rundir.read_summary(run_dir) or {}
    summary.update(status=status, error=f"{type(error).__name__}: {error}")
    rundir.write_summary(run_dir, summary)


def _train_steps(
    cfg: DictConfig,
    run: schema.RunConfig,
    task: cluster.Task,
    *,
    run_dir: Path,
    shared_run_dir: Path | None,
    attempt: dict[str, Any],
) -> dict[str, Any]:
    from tfrecipe.fault.preemption import Preempted
    from tfrecipe.optim import base_learning_rate

    started = time.perf_counter()
    if shared_run_dir is None and run_dir.exists():  # the chief: another run may train there
        rundir.lock_run_dir(run_dir)
    ensure_fresh_run_dir(run_dir, resume=run.resume)
    strategy = _setup_strategy(run, task)
    per_replica_batch, global_batch = batch_sizes(run.batching, strategy.num_replicas_in_sync)
    splits, steps_per_epoch = _load_data(run, global_batch)
    model = _build_model(run, strategy, splits.info, steps_per_epoch, global_batch)
    backup_dir = (shared_run_dir or run_dir) / BACKUP_DIR  # every worker reads the chief's
    recovery = _Recovery(
        spec=run.callbacks.terminate_on_nan,
        candidates=lambda: _candidates(run, backup_dir),
        # as configured: a restore sets a float rate's variable to the backup's
        base_learning_rate=base_learning_rate(model.optimizer),
        steps_per_epoch=steps_per_epoch,
    )
    resumed = _restore(run, model, backup_dir)
    start_step = resumed.step if resumed else 0
    inputs = _build_inputs(run, strategy, splits, steps_per_epoch, global_batch, start_step)

    summary = _initial_summary(run, strategy, per_replica_batch, global_batch, run_dir)
    summary["resumed_from_step"] = resumed.step if resumed else None
    if resumed:
        summary["rollbacks"] = recovery.resume(model, backup_dir.parent, resumed.step)
    if shared_run_dir is None:
        rundir.lock_run_dir(run_dir)  # creates it (a no-op when held: the command line locks)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.write_config(run_dir, cfg)
    rundir.write_summary(run_dir, summary)
    attempt["summary"] = summary

    monitors = _monitors(
        run, cfg, task, run_dir, inputs, global_batch, start_step, resuming=resumed is not None
    )
    # A fresh run keeps its first step's state: a rollback before the first periodic backup.
    protection = _fault_tolerance(
        run, task, model, run_dir, steps_per_epoch, save_at_start=resumed is None
    )
    try:
        _run_loop(
            run,
            model,
            inputs,
            [*monitors.callbacks, *protection.callbacks],
            summary,
            run_dir,
            history=monitors.history,
            start_step=start_step,
            recovery=recovery,
        )
    except BaseException as error:
        status = "preempted" if isinstance(error, Preempted) else "failed"
        _finish(summary, monitors, run_dir, started, model, status=status, error=error)
        if isinstance(error, Exception) and not isinstance(error, TrainingError | Preempted):
            raise TrainingError(summary["error"]) from error
        raise
    finally:
        protection.close()
    _finish(summary, monitors, run_dir, started, model, status="completed")
    return summary


def _setup_strategy(run: schema.RunConfig, task: cluster.Task):
    """The strategy (first: logical devices must be set before any other TensorFlow call),
    then seeds, then the precision policy (seeding clears the Keras session, which resets it)."""
    from tfrecipe.distribute.strategy import build_strategy, device_kinds
    from tfrecipe.precision import set_precision

    strategy = build_strategy(run.strategy, cluster_resolver=cluster.build_resolver(run.cluster))
    seed_everything(run.seed, deterministic=run.deterministic)
    set_precision(
        run.precision.policy,
        require_native=run.precision.require_native,
        device_kinds=device_kinds(strategy),
    )
    return strategy


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The distributed splits (validation and test may be None) and what the loop needs of them."""

    train: Any  # from the run's start step on
    validation: Any
    test: Any
    info: Any  # data.DatasetInfo
    steps_per_epoch: int
    train_from: Any  # step -> the training data from that optimizer step on (fit's resume)


def _load_data(run: schema.RunConfig, global_batch: int):
    """The dataset's splits (not yet distributed) and the optimizer steps per epoch."""
    splits = factory.load_splits(run)
    _check_batch_fits(run.batching, global_batch, splits.info.num_train)
    # Steps count optimizer steps; with gradient accumulation each reads N batches, so the
    # default epoch stays about one pass.
    steps_per_epoch = run.loop.steps_per_epoch or math.ceil(
        _steps_in(splits.info.num_train, global_batch, run.batching.drop_remainder)
        / run.loop.gradient_accumulation_steps
    )
    return splits, steps_per_epoch


def _build_inputs(
    run: schema.RunConfig,
    strategy,
    splits,
    steps_per_epoch: int,
    global_batch: int,
    start_step: int = 0,
) -> _Inputs:
    from tfrecipe.data.distribute import distribute as distribute_dataset
    from tfrecipe.data.pipeline import batch_transform, prepare

    def distribute(dataset, *, split: str, start: int = 0):
        if dataset is None:
            return None
        training = split == "train"
        dataset = prepare(dataset, run.pipeline, split=split, training=training, seed=run.seed)
        return distribute_dataset(
            strategy,
            dataset,
            global_batch_size=global_batch,
            drop_remainder=run.batching.drop_remainder and training,
            # Training data is endless; an epoch is `steps_per_epoch` steps of one iterator, so
            # with the default (one pass per epoch) each epoch sees every example once.
            repeat=training,
            auto_shard_policy=run.pipeline.auto_shard_policy,
            batch_map=batch_transform(run.pipeline),
            # A restored run continues the same seeded stream where the backup was taken.
            skip=start * run.loop.gradient_accumulation_steps,
        )

    def train_from(step: int):
        return distribute(splits.train, split="train", start=step)

    return _Inputs(
        train=train_from(start_step),
        validation=distribute(splits.validation, split="validation"),
        test=distribute(splits.test, split="test"),
        info=splits.info,
        steps_per_epoch=steps_per_epoch,
        train_from=train_from,
    )


def _build_model(run: schema.RunConfig, strategy, info, steps_per_epoch: int, global_batch: int):
    """Model, optimizer, loss and metrics, created under the strategy's scope."""
    from tfrecipe.distribute.strategy import model_scope

    with model_scope(strategy):
        model = factory.build_model(run, info)
        total_steps = steps_per_epoch * run.loop.epochs
        optimizer = _build_optimizer(run, global_batch, total_steps=total_steps)
        factory.compile_model(
            model, optimizer=optimizer, steps_per_execution=run.batching.steps_per_execution
        )
    return model


def _initial_summary(
    run: schema.RunConfig, strategy, per_replica_batch: int, global_batch: int, run_dir: Path
) -> dict[str, Any]:
    """summary.json as it stands when training starts (the contract in DESIGN.md)."""
    return {
        "status": "running",
        "strategy": run.strategy.name,
        "num_replicas": strategy.num_replicas_in_sync,
        "loop": run.loop.name,
        "model": run.model.target,
        "dataset": run.dataset.target,
        "precision": run.precision.policy,
        "seed": run.seed,
        "per_replica_batch_size": per_replica_batch,
        "global_batch_size": global_batch,
        "learning_rate": float(_initial_learning_rate(run, global_batch)),
        "epochs_completed": 0,
        "steps_completed": 0,
        "resumed_from_step": None,
        "rollbacks": [],  # {step, restored_step, learning_rate_factor}: see _Recovery
        "metrics": {},
        "test": {},
        "examples_per_sec": None,
        "wall_time_s": None,
        "run_dir": str(run_dir.resolve()),
    }


@dataclasses.dataclass(frozen=True)
class _Monitors:
    """The callbacks every loop drives, and the ones train() reads results from."""

    callbacks: list
    history: Any  # callbacks.EpochHistory
    throughput: Any  # callbacks.Throughput
    tracker: Any  # tracking.WandbTracker | None


def _monitors(
    run: schema.RunConfig,
    cfg: DictConfig,
    task: cluster.Task,
    run_dir: Path,
    inputs: _Inputs,
    global_batch: int,
    start_step: int = 0,
    *,
    resuming: bool = False,
) -> _Monitors:
    from tfrecipe.callbacks import EpochHistory, Throughput, build_callbacks

    history = EpochHistory(run_dir)
    # A resumed run keeps the epochs it already finished (history.csv is the chief's).
    history.rows = rundir.read_history(run_dir)[: start_step // inputs.steps_per_epoch]
    throughput = Throughput(
        examples_per_step=global_batch * run.loop.gradient_accumulation_steps,
        examples_per_epoch=None if run.loop.steps_per_epoch else inputs.info.num_train,
    )
    callbacks = [
        history,
        throughput,
        *build_callbacks(
            run.callbacks, run.logger, run_dir=run_dir, allowed_targets=run.allowed_targets
        ),
    ]
    if getattr(run.cluster, "evaluator", False):  # checkpoints for the sidecar evaluator
        from tfrecipe.distribute.evaluator import checkpoint_callbacks

        callbacks += checkpoint_callbacks(run_dir)
    # One W&B run per training run: the chief's (other workers train into a scratch dir).
    tracker = _start_tracking(run, cfg, run_dir, resume=resuming) if task.is_chief else None
    if tracker is not None:
        callbacks += tracker.callbacks()
    return _Monitors(callbacks, history, throughput, tracker)


def _run_loop(
    run: schema.RunConfig,
    model,
    inputs: _Inputs,
    callbacks: list,
    summary: dict[str, Any],
    run_dir: Path,
    *,
    history,
    start_step: int = 0,
    recovery: _Recovery,
) -> None:
    """Trains with the configured loop (again from a backup after each rollback), then evaluates
    the test split and exports the model."""
    from tfrecipe.callbacks import progress_verbosity
    from tfrecipe.loops.options import LoopOptions

    options = LoopOptions(
        epochs=run.loop.epochs,
        steps_per_epoch=inputs.steps_per_epoch,
        validation_freq=run.loop.validation_freq,
        verbose=progress_verbosity(run.loop.verbose, enabled=run.callbacks.progress.enabled),
        steps_per_loop=run.loop.steps_per_loop,
        gradient_accumulation_steps=run.loop.gradient_accumulation_steps,
        initial_step=start_step,
    )
    # Parameter servers train through a ClusterCoordinator: their own custom loop.
    loop_module = "parameter_server" if run.strategy.name == "parameter_server" else run.loop.name
    loop = importlib.import_module(f"tfrecipe.loops.{loop_module}")
    extra = {"train_data_from": inputs.train_from} if loop_module == "fit" else {}
    train_data = inputs.train
    while True:
        loop.run(
            model, train_data, inputs.validation, options=options, callbacks=callbacks, **extra
        )
        blow_up = _loss_blow_up(history.rows)
        if blow_up is None:
            break
        step = recovery.roll_back(model, blow_up, summary["rollbacks"], history)
        rundir.write_summary(run_dir, summary)
        # The seeded stream from the restored step on, as a resumed run reads it.
        options = dataclasses.replace(options, initial_step=step)
        train_data = inputs.train_from(step)
    if inputs.test is not None:
        summary["test"] = loop.evaluate(model, inputs.test)
    # model.keras whatever the formats: `tfrecipe evaluate` reads it.
    rundir.export_model(model, run_dir, {"keras", *run.callbacks.export.formats})
    rundir.plot_curves(run_dir, history.rows)


def _finish(
    summary: dict[str, Any],
    monitors: _Monitors,
    run_dir: Path,
    started: float,
    model,
    *,
    status: str,
    error: BaseException | None = None,
) -> None:
    """Writes the final summary.json (also after a failure) and finishes the W&B run."""
    from tfrecipe.fault import backup

    rows = monitors.history.rows
    summary.update(
        status=status,
        steps_completed=backup.current_step(model),
        epochs_completed=len(rows),
        metrics=_final_metrics(rows),
        wall_time_s=round(time.perf_counter() - started, 3),
    )
    if error is not None:
        summary["error"] = f"{type(error).__name__}: {error}"
    else:
        summary["examples_per_sec"] = monitors.throughput.examples_per_sec()
    rundir.write_summary(run_dir, summary)
    if monitors.tracker is not None:
        monitors.tracker.finish(summary)


def _restore(run: schema.RunConfig, model, backup_dir: Path):
    """Restores the state to continue from (`resume`); returns a backup.ResumePoint or None."""
    from tfrecipe.fault import backup

    backup.build_optimizer(model)  # its variables must exist to be restored into
    candidates = _candidates(run, backup_dir)
    path = backup.restore_latest(backup.training_state(model), candidates)
    if path is None:
        if candidates:
            raise TrainingError(
                f"no backup of {len(candidates)} in {backup_dir} can be restored (see the "
                "warnings); start a new run (resume=never and a new hydra.run.dir)"
            )
        return None
    point = backup.ResumePoint(path=path, step=backup.current_step(model))
    log.info("resuming from %s at step %d", path, point.step)
    return point


def _candidates(run: schema.RunConfig, backup_dir: Path) -> list[str]:
    """The checkpoints to continue from, newest first: the run's own backups, else those of
    `resume=PATH` (so a rollback before the first own backup restores the run's start)."""
    from tfrecipe.fault import backup

    own = backup.checkpoints_in(backup_dir)
    if run.resume in ("auto", "never") or own:
        # never: the run dir held no run (ensure_fresh_run_dir), unless the launcher restarted
        # this one; a run that began from resume=PATH continues from its own, newer backups.
        return own
    candidates = backup.resolve_checkpoints(Path(run.resume))
    if not candidates:
        raise ConfigError(
            f"resume={run.resume}: no checkpoint there; expected a checkpoint prefix (e.g. "
            "RUN_DIR/backup/ckpt-100), a backup dir or a run dir, or resume=auto|never"
        )
    return candidates


@dataclasses.dataclass(frozen=True)
class _Recovery:
    """What a NaN/Inf loss leads to (`callbacks.terminate_on_nan`): with rollbacks left, the
    newest good backup is restored and training goes on at a lower learning rate (TF Model
    Garden's recovery, plus the lower rate); without, the run fails.

    Every worker sees the same all-reduced loss, so every worker rolls back, each from the
    chief's backups. A resumed run continues the rollbacks of the run it resumes (they count
    towards the limit, and the rate stays lowered).
    """

    spec: schema.TerminateOnNaN
    candidates: Callable[[], list[str]]  # the backups to roll back to, newest first
    base_learning_rate: Any  # the float or schedule the run started with (optim)
    steps_per_epoch: int

    def roll_back(self, model, blow_up: str, rollbacks: list[dict], history) -> int:
        """Restores the newest good backup into `model` and lowers its learning rate to
        base x lr_factor^k for the k-th rollback; records it in `rollbacks` and returns the
        restored step. Raises TrainingError when no rollback is left or nothing restores."""
        from tfrecipe import optim
        from tfrecipe.fault import backup

        limit = self.spec.max_rollbacks
        if len(rollbacks) >= limit:
            if limit:
                blow_up += f" again after {limit} rollbacks (callbacks.terminate_on_nan)"
            raise TrainingError(
                f"{blow_up}; lower optimizer.learning_rate or enable optimizer.global_clipnorm"
            )
        step = backup.current_step(model)
        path = backup.restore_latest(backup.training_state(model), self.candidates())
        if path is None:
            raise TrainingError(f"{blow_up}; no backup could be restored to roll back to")
        factor = _learning_rate_factor(rollbacks) * self.spec.lr_factor
        self._lower_learning_rate(model, factor)  # after the restore, which sets a float's
        restored = backup.current_step(model)
        history.keep(restored // self.steps_per_epoch)
        rollbacks.append({"step": step, "restored_step": restored, "learning_rate_factor": factor})
        log.warning(
            "%s at step %d: rolled back to %s (step %d) with the learning rate x%g, now %.4g "
            "(rollback %d of %d)",
            blow_up,
            step,
            path,
            restored,
            factor,
            optim.current_learning_rate(model.optimizer),
            len(rollbacks),
            limit,
        )
        return restored

    def resume(self, model, run_dir: Path, step: int) -> list[dict]:
        """The rollbacks of the interrupted run in `run_dir` up to `step` (the restored one),
        with the learning rate lowered as they left it."""
        previous = (rundir.read_summary(run_dir) or {}).get("rollbacks", [])
        rollbacks = [r for r in previous if r["restored_step"] <= step]
        if rollbacks:
            self._lower_learning_rate(model, _learning_rate_factor(rollbacks))
        return rollbacks

    def _lower_learning_rate(self, model, factor: float) -> None:
        from tfrecipe import optim

        optim.set_scaled_learning_rate(model.optimizer, self.base_learning_rate, factor)
        model.make_train_function(force=True)  # fit's traced step holds the old schedule


def _learning_rate_factor(rollbacks: list[dict]) -> float:
    return rollbacks[-1]["learning_rate_factor"] if rollbacks else 1.0


@dataclasses.dataclass(frozen=True)
class _Protection:
    """The backup callback, and what stops watching for preemption when training ends."""

    callbacks: list
    close: Any  # () -> None


def _fault_tolerance(
    run: schema.RunConfig,
    task: cluster.Task,
    model,
    run_dir: Path,
    steps_per_epoch: int,
    *,
    save_at_start: bool,
) -> _Protection:
    """Backups (periodic when `callbacks.backup.enabled`, default: multi-worker runs and runs
    that roll back) and the SIGTERM watcher that saves one on preemption.

    Args:
      save_at_start: with rollbacks, also back up the state training starts from.
    """
    from tfrecipe.fault import backup, preemption

    spec = run.callbacks.backup
    rolls_back = run.callbacks.terminate_on_nan.max_rollbacks > 0
    options = backup.BackupOptions(
        periodic=spec.enabled if spec.enabled is not None else task.type is not None or rolls_back,
        every_n_steps=spec.every_n_steps,
        max_to_keep=spec.max_to_keep,
        save_at_start=rolls_back and save_at_start,
    )
    manager = backup.make_manager(
        backup.training_state(model), run_dir / BACKUP_DIR, options.max_to_keep
    )
    callback = backup.Backup(manager=manager, options=options, steps_per_epoch=steps_per_epoch)
    callback.set_model(model)
    watcher = preemption.watch(
        save=callback.save,
        cluster_resolver=getattr(model.distribute_strategy, "cluster_resolver", None),
        parameter_servers=run.strategy.name == "parameter_server",
        current_step=lambda: backup.current_step(model),
    )
    if watcher is None:
        return _Protection([callback], lambda: None)
    callback.check_preemption = watcher.check
    return _Protection([callback], watcher.close)


def _start_tracking(run: schema.RunConfig, cfg: DictConfig, run_dir: Path, *, resume: bool):
    """The W&B run, when `logger.wandb` is on (grouped by sweep in a multirun); a resumed
    training run continues the W&B run it began."""
    if run.logger.wandb is None:
        return None
    from tfrecipe.tracking import WandbTracker

    return WandbTracker(
        run.logger.wandb,
        config=rundir.public_config(cfg),
        run_dir=run_dir,
        sweep_group=_sweep_group(),
        resume=resume,
    )


def _sweep_group() -> str | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return "-".join(Path(HydraConfig.get().sweep.dir).parts[-2:])


def _check_batch_fits(spec: schema.Batching, global_batch: int, num_train: int) -> None:
    """A global batch larger than the training split is a typo (every step would repeat
    examples within one batch, or drop_remainder=true would leave no step at all)."""
    if global_batch <= num_train:
        return
    key = "global_batch_size" if spec.global_batch_size is not None else "per_replica_batch_size"
    raise ConfigError(
        f"batching.{key}={getattr(spec, key)}: the global batch ({global_batch}) is larger than "
        f"the training split ({num_train} examples); choose a global batch of at most {num_train}"
    )


def _steps_in(num_examples: int, global_batch: int, drop_remainder: bool) -> int:
    # _check_batch_fits made sure global_batch <= num_examples: at least one step.
    if drop_remainder:
        return num_examples // global_batch
    return math.ceil(num_examples / global_batch)


def _initial_learning_rate(run: schema.RunConfig, global_batch: int) -> float:
    from tfrecipe.optim import scaled_learning_rate

    return scaled_learning_rate(
        run.optimizer.learning_rate,
        rule=run.batching.lr_scaling,
        global_batch_size=global_batch,
        reference_batch_size=run.batching.lr_reference_batch_size
        or run.batching.per_replica_batch_size,
    )


def _build_optimizer(run: schema.RunConfig, global_batch: int, *, total_steps: int):
    from tfrecipe.optim import build_optimizer, learning_rate_schedule

    schedule = learning_rate_schedule(
        run.optimizer,
        learning_rate=_initial_learning_rate(run, global_batch),
        total_steps=total_steps,
    )
    return build_optimizer(
        run.optimizer,
        learning_rate=schedule,
        loss_scaling=run.precision.policy == "mixed_float16",
    )


def _final_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """The last epoch's metrics; validation metrics from the last epoch that validated."""
    metrics: dict[str, float] = {}
    for row in rows:
        metrics.update({k: v for k, v in row.items() if k != "epoch"})
    return metrics


def _loss_blow_up(rows: list[dict[str, float]]) -> str | None:
    """What went wrong when the last epoch's training loss is NaN/Inf (TerminateOnNaN stopped
    it there), else None."""
    loss = _final_metrics(rows).get("loss")
    if loss is not None and not math.isfinite(loss):
        return f"the training loss became {loss} in epoch {len(rows)}"
    return None
