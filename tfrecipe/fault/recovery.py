"""Where a run continues from, and what a NaN/Inf loss leads to.

`restore` puts the newest readable backup into the model when a run resumes (`resume=auto`, or
`resume=PATH` for a run that has none of its own yet). `Recovery` is the policy of
`callbacks.terminate_on_nan`: with rollbacks left, the newest good backup is restored and
training goes on at a lower learning rate (TF Model Garden's recovery, plus the lower rate);
without, the run fails with `TrainingError`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import keras

from tfrecipe import init_source, optim, rundir
from tfrecipe.config import schema
from tfrecipe.errors import ConfigError
from tfrecipe.fault import backup
from tfrecipe.outcome import TrainingError

log = logging.getLogger("tfrecipe")


class History(Protocol):
    """The epochs a run finished (`callbacks.EpochHistory`): where a loss blew up, and what a
    rollback forgets (the epochs after the restored step)."""

    rows: list[dict[str, float]]

    def keep(self, epochs: int) -> None: ...


def candidates(resume: str, backup_dir: Path) -> list[str]:
    """The checkpoints to continue from, newest first: the run's own backups, else those of
    `resume=PATH` (so a rollback before the first own backup restores the run's start)."""
    own = backup.checkpoints_in(backup_dir)
    if resume in ("auto", "never") or own:
        # never: the run dir held no run (ensure_fresh_run_dir), unless the launcher restarted
        # this one; a run that began from resume=PATH continues from its own, newer backups.
        return own
    found = backup.resolve_checkpoints(Path(resume))
    if not found:
        raise ConfigError(init_source.no_checkpoint(resume))
    return found


def restore(model: keras.Model, *, resume: str, backup_dir: Path) -> backup.ResumePoint | None:
    """Restores the state to continue from (`resume`); None when there is none (a new run).

    Raises:
      TrainingError: there are backups, but none of them can be read.
    """
    optim.build_optimizer_variables(model)  # they must exist to be restored into
    found = candidates(resume, backup_dir)
    path = backup.restore_latest(backup.training_state(model), found)
    if path is None:
        if found:
            raise TrainingError(
                f"no backup of {len(found)} in {backup_dir} can be restored (see the "
                "warnings); start a new run (resume=never and a new hydra.run.dir)"
            )
        return None
    point = backup.ResumePoint(path=path, step=backup.current_step(model))
    log.info("resuming from %s at step %d", path, point.step)
    return point


def loss_blow_up(rows: list[dict[str, float]]) -> str | None:
    """What went wrong when the last epoch's training loss is NaN/Inf (TerminateOnNaN stopped
    it there), else None."""
    losses = [row["loss"] for row in rows if "loss" in row]
    if losses and not math.isfinite(losses[-1]):
        return f"the training loss became {losses[-1]} in epoch {len(rows)}"
    return None


@dataclasses.dataclass(frozen=True)
class Recovery:
    """The rollback policy of one run (`callbacks.terminate_on_nan`).

    Every worker sees the same all-reduced loss, so every worker rolls back, each from the
    chief's backups. A resumed run continues the rollbacks of the run it resumes (they count
    towards the limit, and the rate stays lowered).
    """

    spec: schema.TerminateOnNaN
    resume: str  # the run's `resume`: where its backups come from before it has its own
    backup_dir: Path  # the chief's backups, newest first, are what a rollback restores
    # The float or schedule the run started with, as configured: a restore sets a float rate's
    # variable to the backup's, so read it before restoring.
    base_learning_rate: float | keras.optimizers.schedules.LearningRateSchedule
    steps_per_epoch: int

    def train(
        self,
        model: keras.Model,
        train_from: Callable[[int], None],
        *,
        start_step: int,
        history: History,
        rollbacks: list[dict],
        on_rollback: Callable[[], None],
    ) -> None:
        """Trains with `train_from(step)`, from `start_step` on; after an epoch that ends with
        a NaN/Inf loss, rolls back (`on_rollback` records it) and trains again from the
        restored step."""
        step = start_step
        while True:
            train_from(step)
            blow_up = loss_blow_up(history.rows)
            if blow_up is None:
                return
            step = self.roll_back(model, blow_up, rollbacks, history)
            on_rollback()

    def roll_back(
        self, model: keras.Model, blow_up: str, rollbacks: list[dict], history: History
    ) -> int:
        """Restores the newest good backup into `model` and lowers its learning rate to
        base x lr_factor^k for the k-th rollback; records it in `rollbacks` and returns the
        restored step. Raises TrainingError when no rollback is left or nothing restores."""
        limit = self.spec.max_rollbacks
        if len(rollbacks) >= limit:
            if limit:
                blow_up += f" again after {limit} rollbacks (callbacks.terminate_on_nan)"
            raise TrainingError(
                f"{blow_up}; lower optimizer.learning_rate or enable optimizer.global_clipnorm"
            )
        step = backup.current_step(model)
        found = candidates(self.resume, self.backup_dir)
        path = backup.restore_latest(backup.training_state(model), found)
        if path is None:
            raise TrainingError(f"{blow_up}; no backup could be restored to roll back to")
        factor = learning_rate_factor(rollbacks) * self.spec.lr_factor
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

    def resume_rollbacks(self, model: keras.Model, run_dir: Path, step: int) -> list[dict]:
        """The rollbacks of the interrupted run in `run_dir` up to `step` (the restored one),
        with the learning rate lowered as they left it."""
        previous = (rundir.RunFiles(run_dir).summary() or {}).get("rollbacks", [])
        rollbacks = [r for r in previous if r["restored_step"] <= step]
        if rollbacks:
            self._lower_learning_rate(model, learning_rate_factor(rollbacks))
        return rollbacks

    def _lower_learning_rate(self, model: keras.Model, factor: float) -> None:
        optim.set_scaled_learning_rate(model.optimizer, self.base_learning_rate, factor)
        model.make_train_function(force=True)  # fit's traced step holds the old schedule


def learning_rate_factor(rollbacks: list[dict]) -> float:
    """The factor the last rollback left the learning rate at (1 before any)."""
    return rollbacks[-1]["learning_rate_factor"] if rollbacks else 1.0
