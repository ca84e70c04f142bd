"""Backup and restore of the full training state, multi-worker safe (`callbacks.backup`).

What a backup holds (one `tf.train.Checkpoint`): the model (weights, and the state of its Keras
seed generators, e.g. dropout's RNG), the optimizer (slots, `iterations`, a float16 loss scale:
`LossScaleOptimizer` tracks its scale variables) and so the step counter, and the running totals
of the epoch's training metrics (an epoch resumed mid-way goes on from them: `Backup`). The epoch
and the position in the input follow from the step: an epoch is `steps_per_epoch` steps of one
endless, seeded (hence deterministic) iterator, and a backup is only ever taken at a step where
every epoch before it has finished its epoch-end work (validation, history), so

    epoch = step // steps_per_epoch, step in that epoch = step % steps_per_epoch,
    input position = step x gradient_accumulation_steps global batches.

A restored run rebuilds the training data skipping the batches already consumed (`data.distribute.distribute`
`skip`) instead of checkpointing the iterator: it works the same for `Model.fit` (whose iterator
is its own), the custom loop and every strategy, at the cost of reading the skipped batches once.

Who writes where (docs/strategies.md, `cluster=local`): every worker calls save (synchronized variables
need all of them); the chief writes RUN_DIR/backup, the others their scratch run dir, deleted with
it. Every worker restores from the chief's directory (the run dir is shared).

Integrity: `CheckpointManager` writes the data files first and then replaces the `checkpoint`
state file atomically, so "latest" never names a half-written checkpoint. A latest checkpoint that
cannot be read anyway (a damaged disk, a truncated copy) is skipped with a warning for the one
before it (`restore_latest`); a state file that cannot be read is replaced by a listing of the
`ckpt-STEP` files (`checkpoints_in`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import weakref
from collections.abc import Callable
from pathlib import Path

import keras
import tensorflow as tf

from tfrecipe import compat, files, printed
from tfrecipe.outcome import BACKUP_DIR, listed_checkpoints

log = logging.getLogger("tfrecipe")


@dataclasses.dataclass(frozen=True)
class BackupOptions:
    """Args:
    periodic: save every `every_n_steps` steps and at each epoch end (else only on preemption).
    every_n_steps: steps between periodic backups (at the first batch end at or after each).
    max_to_keep: how many backups to keep (older ones are deleted).
    save_at_start: also save the state training starts from, so that a rollback (a NaN loss
      before the first periodic backup) has one.
    """

    periodic: bool
    every_n_steps: int = 100
    max_to_keep: int = 3
    save_at_start: bool = False


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a restored run continues: `step` optimizer steps done, from checkpoint `path`."""

    path: str
    step: int


def training_state(model: keras.Model) -> tf.train.Checkpoint:
    """The checkpoint of everything training needs (the optimizer must be built)."""
    return tf.train.Checkpoint(
        model=model, optimizer=model.optimizer, rng=tf.train.Checkpoint(**_rng_states(model))
    )


def _rng_states(model: keras.Model) -> dict[str, tf.Variable]:
    """The state of each layer's Keras seed generator (dropout masks, random augmentation
    layers): a checkpoint of the model alone does not track them, and a restored run would
    draw other masks than the interrupted one."""
    states = {}
    for layer in compat.flatten_layers(model):
        for index, generator in enumerate(compat.seed_generators(layer)):
            states[f"{layer.name}-{index}"] = generator.state.value
    return states


# Per model, the metrics a custom loop trains with (its own objects; fit's are the model's).
_LOOP_METRICS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def training_metrics(model: keras.Model, metrics: tuple[keras.metrics.Metric, ...]) -> None:
    """The metrics a loop of its own trains `model` with (their running totals are backed up);
    fit's are the model's own."""
    _LOOP_METRICS[model] = metrics


def _running_totals(model: keras.Model) -> tf.train.Checkpoint:
    """The variables of the training metrics (fit's compiled ones are built by `on_train_begin`;
    a metric built at its first update, e.g. F1, only once it has one)."""
    metrics = _LOOP_METRICS.get(model) or model.metrics
    return tf.train.Checkpoint(
        **{f"{m.name}-{i}": v.value for m in metrics for i, v in enumerate(m.variables)}
    )


def current_step(model: keras.Model) -> int:
    """The optimizer step of the epoch the callbacks see (`replaying`)."""
    if model in _REPLAYED:
        return _REPLAYED[model][0]
    # convert_to_numpy: int() fails on the MirroredVariable of a multi-replica strategy.
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


# Per model, while a group of epochs trained in one call (tfrecipe.loops.epoch_groups) is
# replayed to the callbacks: (the step of the epoch they see, the steps the model is ahead).
_REPLAYED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def replaying(model: keras.Model, step: int | None, ahead: int = 0) -> None:
    """The callbacks see optimizer step `step`, `ahead` steps behind the model: `current_step`
    says `step` (no device read), and no backup is taken while `ahead`; None: they see the
    model's own step again."""
    if step is None:
        _REPLAYED.pop(model, None)
    else:
        _REPLAYED[model] = (step, ahead)


def steps_ahead(model: keras.Model) -> int:
    return _REPLAYED.get(model, (0, 0))[1]


class StepCounter(keras.callbacks.Callback):
    """A callback that knows the optimizer step at each call's end without a device read:
    reading `iterations` after every call costs ~250 µs, a tenth of a small model's step. The
    step is read once per epoch (a resume or a rollback moves it) and counted on from the
    epoch's first batch (0, or where a resumed epoch starts)."""

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = current_step(self.model)
        self._first_batch: int | None = None

    def on_train_batch_begin(self, batch, logs=None):
        if self._first_batch is None:
            self._first_batch = batch

    def step_after(self, batch: int) -> int:
        """The optimizer step after the call that ended at `batch` (`on_train_batch_end`)."""
        return self._epoch_start + batch + 1 - (self._first_batch or 0)


def crossed(every: int, before: int, after: int) -> bool:
    """Whether the steps from `before` to `after` passed a multiple of `every`."""
    return after // every > before // every


def checkpoints_in(path: Path) -> list[str]:
    """The checkpoints a CheckpointManager keeps in `path`, newest first ([] when none).

    Its `checkpoint` state file lists them; where that file cannot be read (damaged, emptied,
    deleted), the checkpoint files themselves are listed, with a warning: a broken state file
    must not turn a resume into a silent start from step 0.
    """
    state = _checkpoint_state(path)
    if state is not None:
        return list(reversed(state.all_model_checkpoint_paths))
    found = listed_checkpoints(path)
    if found:
        log.warning(
            "%s cannot be read; found %d checkpoints by listing %s (newest %s)",
            path / "checkpoint",
            len(found),
            path,
            Path(found[0]).name,
        )
    return found


def _checkpoint_state(path: Path):
    """The CheckpointManager's state in `path`, or None where there is none or it is unreadable
    (TensorFlow returns None for a file it cannot parse, and raises for an empty one)."""
    try:
        return tf.train.get_checkpoint_state(str(path))
    except (ValueError, tf.errors.OpError):
        return None


def resolve_checkpoints(path: Path) -> list[str]:
    """`resume=PATH`: a checkpoint prefix (".../ckpt-6"), a backup directory or a run directory;
    the checkpoints to try, newest first."""
    if path.is_dir():
        return checkpoints_in(path) or checkpoints_in(path / BACKUP_DIR)
    return [str(path)] if tf.io.gfile.exists(f"{path}.index") else []


def restore_latest(checkpoint: tf.train.Checkpoint, candidates: list[str]) -> str | None:
    """Restores the newest readable checkpoint of `candidates` (newest first); returns its path.

    A checkpoint that cannot be read is skipped with a warning naming it and the error, for the
    one before it: a damaged latest backup costs one backup interval, not the run.
    """
    for path in candidates:
        try:
            # the metrics' running totals it also holds are read at the first epoch's begin
            checkpoint.restore(path).assert_existing_objects_matched().expect_partial()
        except Exception as error:  # DataLossError, IndexError (truncated), a mismatch: any
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error)
            log.warning("backup %s cannot be restored (%s); trying the one before it", path, reason)
            continue
        return path
    if candidates:
        log.warning(
            "no backup could be restored (%d tried); starting from scratch", len(candidates)
        )
    return None


class Backup(StepCounter):
    """Saves the training state every N steps and at each epoch end, and on preemption.

    Every worker runs this callback at the same steps (the step counts are the same everywhere),
    so every worker takes part in each save. A backup is never taken after the last step of an
    epoch but before its epoch end: then a restored run never skips an epoch's validation.

    Args:
      manager: saves into this worker's directory (the chief's: RUN_DIR/backup).
      options: when to save and how many to keep.
      steps_per_epoch: the loop's steps per epoch.
      check_preemption: called at each step where a backup may be taken, with the save function;
        saves and raises `preemption.Preempted` when the cluster is being preempted.
      resumed_from: the backup the run restored: an epoch resumed mid-way reads its training
        metrics' running totals back from it once the loop has reset them (at its epoch begin),
        so its row in history.csv is the uninterrupted run's.
    """

    def __init__(
        self,
        *,
        manager: tf.train.CheckpointManager,
        options: BackupOptions,
        steps_per_epoch: int,
        check_preemption: Callable[[], None] | None = None,
        resumed_from: str | None = None,
    ):
        super().__init__()
        self.manager, self.resumed_from = manager, resumed_from
        self.options = options
        self.steps_per_epoch = steps_per_epoch
        self.check_preemption = check_preemption
        self.last_saved: int | None = None  # the step of this process's latest save
        self.diverged = False  # a NaN/Inf loss was seen: no state from here on is worth saving
        self._interval_start = 0  # periodic backups count from here
        self._unbuilt: tuple[str, list] | None = None  # (backup, metrics unbuilt at its read)

    def save(self) -> str | None:
        step = current_step(self.model)
        if step == self.last_saved:
            return None
        # A step's loss is computed before its update: the step that blows the weights up still
        # reports a finite loss, and its state must not become the backup a rollback restores.
        if not _all_finite(self.model.trainable_variables):
            self.diverged = True
            return None
        self.manager.checkpoint.metrics = _running_totals(self.model)  # as built by now
        path = self.manager.save(checkpoint_number=step)
        self.last_saved = self._interval_start = step
        return path

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        restored, self.resumed_from = self.resumed_from, None  # the run's first epoch only
        if restored and self._epoch_start % self.steps_per_epoch:
            totals = tf.train.Checkpoint(metrics=_running_totals(self.model))
            totals.read(restored).expect_partial()  # a backup from before they were kept: none
            # Without a strategy, fit builds its compiled metrics when it traces the first step:
            # their totals are added to that step's once it is taken.
            metrics = _LOOP_METRICS.get(self.model) or self.model.metrics
            if unbuilt := [metric for metric in metrics if not metric.variables]:
                self._unbuilt = (restored, unbuilt)

    def _add_unbuilt_totals(self) -> None:
        (restored, metrics), self._unbuilt = self._unbuilt, None
        reader = tf.train.load_checkpoint(restored)
        for metric in metrics:
            for index, variable in enumerate(metric.variables):
                key = f"metrics/{metric.name}-{index}/.ATTRIBUTES/VARIABLE_VALUE"
                if reader.has_tensor(key):
                    variable.assign_add(reader.get_tensor(key))

    def on_train_begin(self, logs=None):
        # Training (re)starts from a good state: the start of the run, a resumed backup or a
        # rollback's; the next periodic backup is one interval on.
        self.diverged = False
        self._interval_start = current_step(self.model)
        if self.options.save_at_start:
            self.save()

    def on_train_batch_end(self, batch, logs=None):
        if self._unbuilt:
            self._add_unbuilt_totals()
        step = self.step_after(batch)
        if step % self.steps_per_epoch == 0:
            return  # the epoch's last step: its epoch end saves (after validation)
        self._at_boundary(step, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._at_boundary(current_step(self.model), logs, epoch_end=True)

    def _at_boundary(self, step: int, logs, *, epoch_end: bool = False) -> None:
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            # Never let a blown-up state push good backups out (training stops on it).
            self.diverged = True
        if self.diverged or steps_ahead(self.model):  # a group replays: its last epoch saves
            return
        if self.check_preemption is not None:
            self.check_preemption()
        if not self.options.periodic:
            return
        every = self.options.every_n_steps
        if epoch_end or crossed(every, self._interval_start, step):
            self.save()


def _all_finite(variables: list[tf.Variable]) -> bool:
    """One device read for all of them (not one per variable)."""
    checks = [tf.reduce_all(tf.math.is_finite(v)) for v in variables]
    return bool(tf.reduce_all(checks)) if checks else True


def make_manager(
    checkpoint: tf.train.Checkpoint, directory: Path, max_to_keep: int
) -> tf.train.CheckpointManager:
    printed.quiet("absl", "Sharding callback duration")  # one INFO line per checkpoint save
    directory = files.library_dir(directory)  # never through a link out of the run dir
    _repair_state(directory)
    return tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=max_to_keep)


def _repair_state(directory: Path) -> None:
    """Rewrites an unreadable state file from the checkpoints listed in `directory`, so that the
    manager keeps rotating them (it would otherwise start a new list and never delete them)."""
    if not (directory / "checkpoint").exists() or _checkpoint_state(directory) is not None:
        return
    oldest_first = list(reversed(listed_checkpoints(directory)))
    if oldest_first:
        # With their files' times: the manager deletes only checkpoints it has a time for.
        times = [Path(f"{path}.index").stat().st_mtime for path in oldest_first]
        tf.compat.v1.train.update_checkpoint_state(
            str(directory),
            oldest_first[-1],
            all_model_checkpoint_paths=oldest_first,
            all_model_checkpoint_timestamps=times,
        )
