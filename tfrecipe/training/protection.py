"""Fault tolerance, assembled: backups, the preemption watch, and the NaN/Inf recovery policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import keras

from tfrecipe import optim
from tfrecipe.config import schema
from tfrecipe.config.plan import RunPlan
from tfrecipe.errors import ConfigError, Problem
from tfrecipe.fault import backup, preemption
from tfrecipe.fault.recovery import Recovery, candidates, restore
from tfrecipe.outcome import BACKUP_DIR


@dataclasses.dataclass(frozen=True)
class Protection:
    """The backup callback, and what stops watching for preemption when training ends."""

    callbacks: list[keras.callbacks.Callback]
    close: Callable[[], None]

    def follow_optimizer(self) -> None:
        """Backups after the fine-tuning switch hold the new optimizer (and its step)."""
        for callback in self.callbacks:
            if isinstance(callback, backup.Backup):
                callback.manager.checkpoint.optimizer = callback.model.optimizer


def recovery_policy(
    spec: schema.TerminateOnNaN,
    *,
    resume: str,
    model: keras.Model,
    backup_dir: Path,
    steps_per_epoch: int,
) -> Recovery:
    """`callbacks.terminate_on_nan`'s policy; built before a restore, which sets a float rate's
    variable to the backup's, so it reads the rate as configured."""
    return Recovery(
        spec=spec,
        resume=resume,
        backup_dir=backup_dir,
        base_learning_rate=optim.base_learning_rate(model.optimizer),
        steps_per_epoch=steps_per_epoch,
    )


def restore_protected(
    spec: schema.TerminateOnNaN,
    *,
    resume: str,
    model: keras.Model,
    phases,
    backup_dir: Path,
    steps_per_epoch: int,
):
    """`(policy, resumed)`: the NaN/Inf recovery policy, then the restored backup (None: a fresh
    start); `phases`: the fine-tuning's two phases, or None."""
    if phases is not None:  # a backup past the switch holds phase two's optimizer
        phases.resume_in_phase_two(candidates(resume, backup_dir))
    # before a restore, which sets a float rate's variable to the backup's
    policy = recovery_policy(
        spec, resume=resume, model=model, backup_dir=backup_dir, steps_per_epoch=steps_per_epoch
    )
    return policy, restore(model, resume=resume, backup_dir=backup_dir)


def check_epochs_left(resumed: backup.ResumePoint | None, steps_per_epoch: int, epochs: int):
    """A resumed run stops at the end of epoch `loop.epochs` (sooner or later than the first
    attempt's), never before the epoch its backup is in: the steps it holds cannot be untrained.

    Raises:
      ConfigError: the backup is past the end of epoch `epochs`.
    """
    if resumed is None or resumed.step <= steps_per_epoch * epochs:
        return
    epoch = -(-resumed.step // steps_per_epoch)  # the epoch the backup's step is in, from 1
    raise ConfigError(
        Problem(
            "loop.epochs",
            epochs,
            f"the backup to resume ({resumed.path}) is at step {resumed.step}, in epoch {epoch} "
            f"of {steps_per_epoch} steps; give loop.epochs={epoch} or more, or resume=never in "
            "a new run dir",
        )
    )


def fault_tolerance(
    plan: RunPlan,
    spec: schema.Backup,
    *,
    model: keras.Model,
    run_dir: Path,
    steps_per_epoch: int,
    resumed: backup.ResumePoint | None,
) -> Protection:
    """Backups (periodic as the plan says: `RunPlan.periodic_backups`) and the SIGTERM watcher
    that saves one on preemption.

    Args:
      spec: `callbacks.backup`, for how many backups to keep.
      resumed: the backup the run restored, or None (a fresh run that rolls back also backs up
        the state training starts from).
    """
    options = _backup_options(plan, spec, resumed=resumed is not None)
    manager = backup.make_manager(
        backup.training_state(model), run_dir / BACKUP_DIR, options.max_to_keep
    )
    callback = backup.Backup(
        manager=manager,
        options=options,
        steps_per_epoch=steps_per_epoch,
        resumed_from=resumed and resumed.path,
    )
    callback.set_model(model)
    watcher = preemption.watch(
        save=callback.save,
        cluster_resolver=getattr(model.distribute_strategy, "cluster_resolver", None),
        parameter_servers=plan.parameter_servers,
        current_step=lambda: backup.current_step(model),
    )
    if watcher is None:
        return Protection([callback], lambda: None)
    callback.check_preemption = watcher.check
    return Protection([callback], watcher.close)


def _backup_options(plan: RunPlan, spec: schema.Backup, *, resumed: bool) -> backup.BackupOptions:
    return backup.BackupOptions(
        periodic=plan.periodic_backups,
        every_n_steps=plan.backup_every_n_steps,
        max_to_keep=spec.max_to_keep,
        save_at_start=plan.save_at_start(resumed=resumed),
    )
