"""`train(cfg)`: one training run, as a list of steps.

cluster -> strategy -> precision -> data -> (in strategy.scope()) model, optimizer, metrics
-> loop -> results in the run directory.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tfrecipe import cluster, rundir, schema
from tfrecipe.errors import ConfigError

log = logging.getLogger("tfrecipe")


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


def ensure_fresh_run_dir(run_dir: Path) -> None:
    """Refuses a run dir that already holds a finished run: its outputs are never overwritten."""
    previous = rundir.read_summary(run_dir)
    if previous and previous.get("status") == "completed":
        raise ConfigError(
            f"hydra.run.dir={run_dir}: already holds a completed run (summary.json); "
            "choose another hydra.run.dir"
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
        from tfrecipe.evaluator import evaluate_checkpoints

        return evaluate_checkpoints(run, run_dir=Path(run_dir))
    if task.is_chief:
        return _train(cfg, run, task, run_dir=Path(run_dir))
    # Only the chief writes the run dir; the others write the same files (every worker must
    # take part in saving synchronized variables) to a scratch dir they delete.
    with tempfile.TemporaryDirectory(prefix=f"tfrecipe-{task.type}{task.index}-") as scratch:
        return _train(cfg, run, task, run_dir=Path(scratch))


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
    cfg: DictConfig, run: schema.RunConfig, task: cluster.Task, *, run_dir: Path
) -> dict[str, Any]:
    started = time.perf_counter()
    ensure_fresh_run_dir(run_dir)
    strategy = _setup_strategy(run, task)
    per_replica_batch, global_batch = batch_sizes(run.batching, strategy.num_replicas_in_sync)
    inputs = _build_inputs(run, strategy, global_batch)
    model = _build_model(run, strategy, inputs, global_batch)

    summary = _initial_summary(run, strategy, per_replica_batch, global_batch, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.write_config(run_dir, cfg)
    rundir.write_summary(run_dir, summary)

    monitors = _monitors(run, cfg, task, run_dir, inputs, global_batch)
    try:
        _run_loop(run, model, inputs, monitors, summary, run_dir)
    except BaseException as error:
        _finish(summary, monitors, run_dir, started, model, status="failed", error=error)
        if isinstance(error, Exception) and not isinstance(error, TrainingError):
            raise TrainingError(summary["error"]) from error
        raise
    _finish(summary, monitors, run_dir, started, model, status="completed")
    return summary


def _setup_strategy(run: schema.RunConfig, task: cluster.Task):
    """The strategy (first: logical devices must be set before any other TensorFlow call),
    then seeds, then the precision policy (seeding clears the Keras session, which resets it)."""
    from tfrecipe.precision import set_precision
    from tfrecipe.strategy import build_strategy, device_kinds

    strategy = build_strategy(run.strategy, cluster_resolver=cluster.build_resolver(run.cluster))
    cluster.maybe_crash_for_test(task)
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

    train: Any
    validation: Any
    test: Any
    info: Any  # data.DatasetInfo
    steps_per_epoch: int


def _build_inputs(run: schema.RunConfig, strategy, global_batch: int) -> _Inputs:
    from tfrecipe import data
    from tfrecipe.instantiate import instantiate
    from tfrecipe.pipeline import batch_transform, prepare

    splits = instantiate(
        run.dataset.model_dump(by_alias=True), key="dataset", allowed=run.allowed_targets
    )
    # Steps count optimizer steps; with gradient accumulation each reads N batches, so the
    # default epoch stays about one pass.
    steps_per_epoch = run.loop.steps_per_epoch or math.ceil(
        _steps_in(splits.info.num_train, global_batch, run.batching.drop_remainder)
        / run.loop.gradient_accumulation_steps
    )

    def distribute(dataset, *, split: str):
        if dataset is None:
            return None
        training = split == "train"
        dataset = prepare(dataset, run.pipeline, split=split, training=training, seed=run.seed)
        return data.distribute(
            strategy,
            dataset,
            global_batch_size=global_batch,
            drop_remainder=run.batching.drop_remainder and training,
            # Training data is endless; an epoch is `steps_per_epoch` steps of one iterator, so
            # with the default (one pass per epoch) each epoch sees every example once.
            repeat=training,
            auto_shard_policy=run.pipeline.auto_shard_policy,
            batch_map=batch_transform(run.pipeline),
        )

    return _Inputs(
        train=distribute(splits.train, split="train"),
        validation=distribute(splits.validation, split="validation"),
        test=distribute(splits.test, split="test"),
        info=splits.info,
        steps_per_epoch=steps_per_epoch,
    )


def _build_model(run: schema.RunConfig, strategy, inputs: _Inputs, global_batch: int):
    """Model, optimizer, loss and metrics, created under the strategy's scope."""
    from tfrecipe.instantiate import instantiate
    from tfrecipe.strategy import model_scope

    with model_scope(strategy):
        model = instantiate(
            run.model.model_dump(by_alias=True),
            key="model",
            allowed=run.allowed_targets,
            input_shape=inputs.info.input_shape,
            num_classes=inputs.info.num_classes,
        )
        total_steps = inputs.steps_per_epoch * run.loop.epochs
        optimizer = _build_optimizer(run, global_batch, total_steps=total_steps)
        _compile(model, optimizer, steps_per_execution=run.batching.steps_per_execution)
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
) -> _Monitors:
    from tfrecipe.callbacks import EpochHistory, Throughput, build_callbacks

    history = EpochHistory(run_dir)
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
        from tfrecipe.evaluator import checkpoint_callbacks

        callbacks += checkpoint_callbacks(run_dir)
    # One W&B run per training run: the chief's (other workers train into a scratch dir).
    tracker = _start_tracking(run, cfg, run_dir) if task.is_chief else None
    if tracker is not None:
        callbacks += tracker.callbacks()
    return _Monitors(callbacks, history, throughput, tracker)


def _run_loop(
    run: schema.RunConfig,
    model,
    inputs: _Inputs,
    monitors: _Monitors,
    summary: dict[str, Any],
    run_dir: Path,
) -> None:
    """Trains with the configured loop, then evaluates the test split and exports the model."""
    from tfrecipe.loops.options import LoopOptions

    options = LoopOptions(
        epochs=run.loop.epochs,
        steps_per_epoch=inputs.steps_per_epoch,
        validation_freq=run.loop.validation_freq,
        verbose=run.loop.verbose if run.callbacks.progress.enabled else 0,
        steps_per_loop=run.loop.steps_per_loop,
        gradient_accumulation_steps=run.loop.gradient_accumulation_steps,
    )
    # Parameter servers train through a ClusterCoordinator: their own custom loop.
    loop_module = "parameter_server" if run.strategy.name == "parameter_server" else run.loop.name
    loop = importlib.import_module(f"tfrecipe.loops.{loop_module}")
    loop.run(model, inputs.train, inputs.validation, options=options, callbacks=monitors.callbacks)
    rows = monitors.history.rows
    _check_finite(_final_metrics(rows), rows)
    if inputs.test is not None:
        summary["test"] = loop.evaluate(model, inputs.test)
    _export(model, run_dir)
    rundir.plot_curves(run_dir, rows)


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
    rows = monitors.history.rows
    summary.update(
        status=status,
        steps_completed=_optimizer_steps(model),
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


def _start_tracking(run: schema.RunConfig, cfg: DictConfig, run_dir: Path):
    """The W&B run, when `logger.wandb` is on (grouped by sweep in a multirun)."""
    if run.logger.wandb is None:
        return None
    from tfrecipe.tracking import WandbTracker

    return WandbTracker(
        run.logger.wandb,
        config=rundir.public_config(cfg),
        run_dir=run_dir,
        sweep_group=_sweep_group(),
    )


def _sweep_group() -> str | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return "-".join(Path(HydraConfig.get().sweep.dir).parts[-2:])


def _steps_in(num_examples: int, global_batch: int, drop_remainder: bool) -> int:
    steps = (
        num_examples // global_batch if drop_remainder else math.ceil(num_examples / global_batch)
    )
    if steps == 0:
        raise ConfigError(
            f"batching: the global batch ({global_batch}) is larger than the training split "
            f"({num_examples} examples) and drop_remainder=true leaves no steps"
        )
    return steps


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


def _compile(model, optimizer, *, steps_per_execution: int) -> None:
    import keras

    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=steps_per_execution,
    )


def _final_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """The last epoch's metrics; validation metrics from the last epoch that validated."""
    metrics: dict[str, float] = {}
    for row in rows:
        metrics.update({k: v for k, v in row.items() if k != "epoch"})
    return metrics


def _check_finite(metrics: dict[str, float], rows: list[dict[str, float]]) -> None:
    loss = metrics.get("loss")
    if loss is not None and not math.isfinite(loss):
        raise TrainingError(
            f"the training loss became {loss} in epoch {len(rows)}; lower "
            "optimizer.learning_rate or enable optimizer.global_clipnorm"
        )


def _export(model, run_dir: Path) -> None:
    """model.keras, written under a temporary name and renamed: never half-written."""
    import os

    partial = run_dir / ".partial.keras"
    model.save(partial)
    os.replace(partial, run_dir / "model.keras")


def _optimizer_steps(model) -> int:
    import keras

    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))
