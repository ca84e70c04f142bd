"""Steps per `tf.function` call (fit: steps_per_execution, custom: steps_per_loop), decided once:
after the restore, when the step the run starts from is known."""

from __future__ import annotations

import keras

from tfrecipe import factory
from tfrecipe.config import schema


def pace(run: schema.RunConfig, model: keras.Model, steps_per_epoch: int, start_step: int) -> int:
    """The run's steps per call; fit's model takes it as its `steps_per_execution` (a run
    restored mid-epoch needs calls that also divide the rest of that epoch)."""
    steps = steps_per_call(run, model, steps_per_epoch, start_step)
    if run.loop.name == "fit":  # fit runs micro-batches: each call ends on an update
        model.steps_per_execution = steps * run.loop.gradient_accumulation_steps
    return steps


def steps_per_call(
    run: schema.RunConfig, model: keras.Model, steps_per_epoch: int, start_step: int = 0
) -> int:
    """The loop's steps per `tf.function` call (fit: steps_per_execution, custom: steps_per_loop)."""
    requested = (
        run.batching.steps_per_execution if run.loop.name == "fit" else run.loop.steps_per_loop
    )
    if run.strategy.name == "parameter_server":
        return 1  # ClusterCoordinator schedules one step per closure
    if run.logger.tensorboard is not None and run.logger.tensorboard.profile_batch:
        # xprof finds no step in a call that loops over several (measured: "steps": 0 at 2 per
        # call, in both loops): a profiled run takes one step per call.
        return 1
    replicas = model.distribute_strategy.num_replicas_in_sync
    if requested == "auto" and run.loop.name == "fit" and replicas > 1:
        # Keras 3.15's multi-step fit fails across replicas (TF 2.21, MirroredStrategy: "You
        # must feed a value for placeholder tensor 'while/cond/Placeholder'").
        return 1
    return factory.steps_per_call(
        requested,
        num_params=model.count_params(),
        steps_per_epoch=steps_per_epoch,
        start_step=start_step,
        hook_intervals=hook_intervals(run),
        short_last_call=run.loop.name == "custom",
    )


def hook_intervals(run: schema.RunConfig) -> tuple[int, ...]:
    """The step intervals per-batch hooks were configured at (a call boundary is a step's)."""
    backup = run.callbacks.backup
    # periodic backups as protection.fault_tolerance decides (on a cluster, every process is a task)
    rolls_back = run.callbacks.terminate_on_nan.max_rollbacks > 0
    periodic = backup.enabled if backup.enabled is not None else run.cluster.name != "none"
    intervals = [backup.every_n_steps] if periodic or rolls_back else []
    if run.logger.csv is not None:
        intervals.append(run.logger.csv.every_n_steps)
    if run.logger.wandb is not None and run.logger.wandb.log_every_n_steps:
        intervals.append(run.logger.wandb.log_every_n_steps)
    if run.logger.tensorboard is not None and run.logger.tensorboard.update_freq != "epoch":
        update = run.logger.tensorboard.update_freq
        intervals.append(1 if update == "batch" else update)
    return tuple(intervals)
