"""Callbacks from the callbacks and logger configs; the same list drives every loop."""

from __future__ import annotations

import csv
import io
import logging
import math
import operator
import os
import sys
import time
import warnings
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras

from tfrecipe import files, reading
from tfrecipe.config import schema
from tfrecipe.config.grants import NO_GRANTS, Grants
from tfrecipe.config.instantiate import instantiate
from tfrecipe.fault import disk
from tfrecipe.fault.backup import StepCounter, crossed, current_step, steps_ahead
from tfrecipe.models.export import export_model
from tfrecipe.optim import averages, current_learning_rate
from tfrecipe.perf.profiler import StepProfiler
from tfrecipe.rundir import RunFiles
from tfrecipe.tasks import best_row
from tfrecipe.weights_file import WeightsWriter

log = logging.getLogger("tfrecipe")


class Throughput(keras.callbacks.Callback):
    """Measures steady-state training throughput: examples/sec over the epochs after the first
    (the first pays for tracing and compilation); with one epoch, over its batches after the first.
    Validation time is not counted (several epochs per call, tfrecipe.loops.epoch_groups:
    it is, in the graph; the first epoch is a call of its own there too)."""

    reads_logs_only = True  # a group of epochs in one call may run under it (loops.epoch_groups)

    def __init__(self, examples_per_step: int, examples_per_epoch: int | None = None):
        super().__init__()
        self.examples_per_step = examples_per_step
        self.examples_per_epoch = examples_per_epoch
        self.epochs: list[tuple[int, float]] = []  # (steps, seconds of training)
        self._first_batch_end: float | None = None
        self._first_epoch_rest: tuple[int, float] | None = None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._last = self._start
        self._steps = 0
        self._first_batch_end = None

    def validated_inside(self, seconds: float) -> None:
        """The epoch's call also validated for `seconds` (a group's, tfrecipe.loops.epoch_groups):
        not training time."""
        self._start += seconds

    def on_train_batch_end(self, batch, logs=None):
        self._last = time.perf_counter()
        self._steps = batch + 1  # batch is the index of the last step run (steps_per_execution)
        if self._first_batch_end is None:
            self._first_batch_end = (self._steps, self._last)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append((self._steps, self._last - self._start))
        if epoch == 0 and self._first_batch_end:
            steps, at = self._first_batch_end
            self._first_epoch_rest = (self._steps - steps, self._last - at)

    def _examples(self, steps: int) -> int:
        examples = steps * self.examples_per_step
        return min(examples, self.examples_per_epoch) if self.examples_per_epoch else examples

    def examples_per_sec(self) -> float | None:
        if len(self.epochs) > 1:
            measured = self.epochs[1:]
            seconds = sum(s for _, s in measured)
            return sum(self._examples(n) for n, _ in measured) / seconds if seconds else None
        if self._first_epoch_rest and self._first_epoch_rest[1] > 0:
            steps, seconds = self._first_epoch_rest
            return steps * self.examples_per_step / seconds
        return None


class EpochHistory(keras.callbacks.Callback):
    """Keeps one row of logs per epoch (validation metrics only where validation ran) and
    rewrites history.csv after each epoch (after a group's last, several epochs per call), so an
    interrupted run keeps its history."""

    reads_logs_only = True

    def __init__(self, home: RunFiles | None):
        super().__init__()
        self.home = home
        self.rows: list[dict[str, float]] = []

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}}
        self.rows.append(row)
        if not steps_ahead(self.model):  # a group of epochs in one call: at its last epoch
            self._write()

    def on_train_end(self, logs=None):
        self._write()  # a group stopped before its last epoch (a NaN, a pruned trial)

    def keep(self, epochs: int) -> None:
        """Forgets the epochs after the first `epochs` (a rollback trains them again)."""
        self.rows = self.rows[:epochs]
        self._write()

    def _write(self) -> None:
        if self.home is not None:
            self.home.write_history(self.rows)


class PeriodicExport(keras.callbacks.Callback):
    """Exports the model every N epochs in each of `formats` (model-EPOCH.keras,
    saved_model-EPOCH/). Every worker exports (synchronized variables need all of them); only the
    chief's run dir is the real one."""

    def __init__(self, home: RunFiles, every_n_epochs: int, formats: Collection[str] = ("keras",)):
        super().__init__()
        self.home, self.every_n_epochs, self.formats = home, every_n_epochs, formats

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_n_epochs == 0:
            export_model(self.model, self.home.path, self.formats, epoch=epoch + 1)


class StepLog(StepCounter):
    """Writes a row (`write`) after each call that crossed a multiple of `every_n_steps`
    optimizer steps, counted over the run (an epoch shorter than the interval still gets its
    rows). An auto call is never longer than the interval
    (tfrecipe.config.plan.RunPlan.steps_per_call), so each multiple gets a row of its own, at
    the first call end at or after it; the row names the step it was written at: the optimizer
    step, the epoch (1-based), the next step's learning rate and the call's logs.

    Steps are counted in Python (`StepCounter`), as the backups count them."""

    reads_logs_only = True

    def __init__(self, every_n_steps: int):
        super().__init__()
        self.every_n_steps = every_n_steps
        self._epoch = self._last = 0

    def write(self, row: dict[str, float]) -> None:
        raise NotImplementedError

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._epoch, self._last = epoch, self._epoch_start  # a rollback's too

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_after(batch)
        last, self._last = self._last, step
        if not crossed(self.every_n_steps, last, step):
            return
        row = {
            "step": current_step(self.model),
            "epoch": self._epoch + 1,
            "learning_rate": current_learning_rate(self.model.optimizer),
        }
        self.write(row | {k: float(v) for k, v in (logs or {}).items()})


class StepCSVLogger(StepLog):
    """Writes training metrics and the learning rate every N steps to a CSV file (flushed as it
    goes, so a crash keeps what was logged). A resumed run keeps the rows up to the step it
    resumed from (later ones are redone)."""

    def __init__(self, path: Path, every_n_steps: int):
        super().__init__(every_n_steps)
        self.path = path
        self._writer = None

    def on_train_begin(self, logs=None):
        kept = _rows_up_to(self.path, current_step(self.model))
        text, columns = io.StringIO(newline=""), list(kept[0]) if kept else None
        if kept:
            writer = csv.DictWriter(text, fieldnames=columns)
            writer.writeheader()
            writer.writerows(kept)
        self._file = files.open_log(self.path, text.getvalue())  # a new file, never a link
        self._writer = csv.DictWriter(self._file, fieldnames=columns) if kept else None

    def write(self, row: dict[str, float]) -> None:
        if self._writer is None:
            self._writer = csv.DictWriter(self._file, fieldnames=list(row))
            self._writer.writeheader()
        self._writer.writerow({k: row.get(k) for k in self._writer.fieldnames})
        self._file.flush()

    def on_train_end(self, logs=None):
        if self._writer is None:  # a run shorter than the interval: a header, not an empty file
            csv.writer(self._file).writerow(["step", "epoch", "learning_rate"])
        self._file.close()


class TensorBoardStepLogger(StepLog):
    """TensorBoard's per-step scalars (`logger.tensorboard.update_freq`: batch or every N
    steps) as `batch_*` in RUN_DIR/tensorboard/train at the optimizer step, steps.csv's rows.
    Keras' own counts its hook calls since this process began training: with several steps per
    call, in a resumed run or after a fine-tuning's switch they were not the optimizer's steps."""

    def __init__(self, train_dir: Path, every_n_steps: int):
        super().__init__(every_n_steps)
        self.train_dir = train_dir
        self._board = None

    def write(self, row: dict[str, float]) -> None:
        import tensorflow as tf

        if self._board is None:
            self._board = tf.summary.create_file_writer(str(files.library_dir(self.train_dir)))
        with self._board.as_default():
            for name, value in row.items():
                if name not in ("step", "epoch"):
                    tf.summary.scalar(f"batch_{name}", value, step=int(row["step"]))

    def on_train_end(self, logs=None):
        if self._board is not None:
            self._board.flush()


def _rows_up_to(path: Path, step: int) -> list[dict[str, str]]:
    """The rows a resumed run keeps of its own log (a regular file: never a link to a device)."""
    if not os.path.lexists(path):
        return []
    with reading.open_file(path, what=f"a run's {path.name}") as raw:
        rows = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
        return [row for row in rows if int(row["step"]) <= step]


def progress_verbosity(verbose: int | str, *, enabled: bool) -> int:
    """Keras' `verbose` for `loop.verbose`: "auto" is the bar on a terminal and one line per epoch
    anywhere else, where a bar's carriage returns and escapes would litter the log (SLURM output
    files, CI logs, `| tee`). `enabled`: `callbacks.progress.enabled` in the cluster's chief
    (the other tasks of a synchronous cluster would print the same lines again)."""
    if not enabled:
        return 0
    if verbose == "auto":
        return 1 if sys.stdout.isatty() else 2
    return int(verbose)


def _mode(monitor: str, mode: str) -> str:
    """The configured mode, with "auto" decided by the monitored metric (tfrecipe.tasks)."""
    from tfrecipe.tasks import monitor_mode

    return monitor_mode(monitor) if mode == "auto" else mode


class BestCheckpoint(keras.callbacks.Callback):
    """`best.weights.h5`: the weights of the best epoch so far (the first of equals), replaced
    whole through tfrecipe.files (a crash mid-save leaves the previous best, and a link planted
    in its place is refused, not written through; Keras' ModelCheckpoint writes in place). An
    epoch that did not log the monitored value (`loop.validation_freq` > 1) is not scored, so not
    saved. A resumed run starts from the best value its earlier epochs logged (Keras' checkpoint
    would start from scratch and overwrite the file with a worse epoch, keras#17012); with
    `optimizer.ema` it saves the averaged weights, which the monitored validation scored.
    A save reads the weights and a thread writes the file (tfrecipe.weights_file: the training
    does not wait on the disk); the last one is on disk when training ends.
    Under a group of epochs in one call (tfrecipe.loops.epoch_groups) the model is ahead of the
    epoch: the group's best is saved once, at its last epoch, from the best epoch's weights
    (`held_best`: the variables holding them, by the id of the model's weight they copy)."""

    reads_logs_only = True

    def __init__(self, path: Path, *, monitor: str, mode: str, best_so_far: float | None):
        super().__init__()
        self.path, self.monitor, self.best, self.mode = path, monitor, best_so_far, mode
        self.held_best: Mapping[int, Any] | None = None
        self._unsaved = False
        self._better = operator.gt if mode == "max" else operator.lt
        self._writer: WeightsWriter | None = None

    def on_epoch_end(self, epoch, logs=None):
        current = (logs or {}).get(self.monitor)
        scored = current is not None and math.isfinite(current)
        if scored and (self.best is None or self._better(current, self.best)):
            self.best, self._unsaved = float(current), True
        # a group of epochs in one call saves its best once, at its last epoch
        if self._unsaved and not steps_ahead(self.model):
            self._save()

    def on_train_end(self, logs=None):
        if self._unsaved:  # a group stopped before its last epoch: the best it trained
            self._save()
        if self._writer is not None:
            self._writer.wait()

    def _save(self) -> None:
        self._unsaved = False
        # the new file is written beside the old one: a disk without room for it raises ENOSPC
        # here (fault/disk.py), where h5py would crash the process
        disk.check_room(self.path.parent, disk.weights_bytes(self.model))
        if self._writer is None or self._writer.model is not self.model:
            if self._writer is not None:  # the last model's write lands first, not after
                self._writer.wait()
            self._writer = WeightsWriter(self.model, self.path)
        self._writer.save({**averages(self.model), **(self.held_best or {})})


def build_callbacks(
    spec: schema.Callbacks,
    logger: schema.Logger,
    *,
    home: RunFiles,
    grants: Grants = NO_GRANTS,
    export_formats: Collection[str] = ("keras",),
    earlier_epochs: Sequence[Mapping[str, float]] = (),
    chiefs: RunFiles | None = None,
) -> list[keras.callbacks.Callback]:
    """The callbacks the config switches on, in a fixed order (user callbacks last).

    Args:
      export_formats: `export.formats`; periodic exports write those that have them.
      earlier_epochs: the history rows of the epochs a resumed run already trained.
      chiefs: the chief's run dir (`home` unless this is another worker's scratch dir), whose
        best.weights.h5 early stopping may restore an earlier epoch from.
    """
    callbacks: list[keras.callbacks.Callback] = []
    if spec.terminate_on_nan.enabled:
        callbacks.append(keras.callbacks.TerminateOnNaN())
    if spec.model_checkpoint.enabled:
        callbacks += _best_checkpoint(spec.model_checkpoint, home, earlier_epochs)
    if spec.export.every_n_epochs:
        periodic = [f for f in export_formats if f in schema.PERIODIC_EXPORT_FORMATS]
        callbacks.append(PeriodicExport(home, spec.export.every_n_epochs, periodic or ["keras"]))
    if spec.early_stopping.enabled:
        callbacks.append(_early_stopping(spec, chiefs or home, earlier_epochs))
    callbacks += _logger_callbacks(logger, home)
    for name, node in spec.extra.items():
        callbacks.append(
            instantiate(
                node.model_dump(by_alias=True),
                key=f"callbacks.extra.{name}",
                grants=grants,
            )
        )
    return callbacks


def _early_stopping(
    spec: schema.Callbacks, home: RunFiles, earlier_epochs: Sequence[Mapping[str, float]]
) -> keras.callbacks.EarlyStopping:
    """`callbacks.early_stopping`, primed with the epochs a resumed run already trained; the
    epoch best.weights.h5 holds (its monitor's best of them), whose weights it may restore."""
    stopping, checkpoint = spec.early_stopping, spec.model_checkpoint
    held = None
    if checkpoint.enabled:
        best = best_row(
            earlier_epochs, checkpoint.monitor, _mode(checkpoint.monitor, checkpoint.mode)
        )
        held = None if best is None else (int(best["epoch"]), home.file("best_weights"))
    return EarlyStopping(
        earlier_epochs,
        best_weights_file=held,
        monitor=stopping.monitor,
        mode=_mode(stopping.monitor, "auto"),
        patience=stopping.patience,
        min_delta=stopping.min_delta,
        restore_best_weights=stopping.restore_best_weights,
    )


class EarlyStopping(keras.callbacks.EarlyStopping):
    """Keras' EarlyStopping (and its name, which messages show), which a resumed run primes
    with the history rows of the epochs it already trained: their best value, its epoch and the
    epochs waited since, so that it stops where an uninterrupted run stops (Keras' would count
    afresh from the resume). A best epoch
    among them has its weights restored from best.weights.h5 when that file holds that epoch
    (`best_weights_file`: (epoch, path)); else a warning says that the weights restored at the
    end are of an epoch trained since the resume."""

    def __init__(self, earlier_epochs, *, best_weights_file: tuple[int, Path] | None, **kwargs):
        super().__init__(**kwargs)
        self.earlier_epochs, self.best_weights_file = list(earlier_epochs), best_weights_file

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self.monitor_op is None:
            self._set_monitor_op()
        # the resume's rows, once: a NaN rollback trains again without them (as Keras' does)
        rows, self.earlier_epochs = self.earlier_epochs, []
        for epoch, row in enumerate(rows):  # on_epoch_end's count, weights aside
            current = row.get(self.monitor)
            if current is None or epoch < self.start_from_epoch:
                continue
            self.wait += 1
            if self._is_improvement(current, self.best):
                self.best, self.best_epoch, self.wait = current, epoch, 0
        if self.restore_best_weights and self.best is not None:
            self.best_weights = self._earlier_best_weights()

    def _earlier_best_weights(self) -> list | None:
        epoch, path = self.best_weights_file or (None, None)
        if epoch != self.best_epoch + 1 or not path.is_file():
            log.warning(
                "callbacks.early_stopping: the best epoch (%d) came before the resume and "
                "best.weights.h5 does not hold it; restore_best_weights restores an epoch "
                "trained since (the first, or a better one)",
                self.best_epoch + 1,
            )
            return None
        weights = self.model.get_weights()
        with warnings.catch_warnings():  # the file holds no optimizer state, by design
            warnings.filterwarnings("ignore", "Skipping variable loading for optimizer")
            self.model.load_weights(path)
        try:
            return self.model.get_weights()
        finally:
            self.model.set_weights(weights)


def _best_checkpoint(
    checkpoint, home: RunFiles, earlier_epochs: Sequence[Mapping[str, float]]
) -> list[keras.callbacks.Callback]:
    """`callbacks.model_checkpoint`: best.weights.h5, with the best of the epochs a resumed run
    already trained to beat."""
    mode = _mode(checkpoint.monitor, checkpoint.mode)
    best = best_row(earlier_epochs, checkpoint.monitor, mode)
    return [
        BestCheckpoint(
            home.file("best_weights"),
            monitor=checkpoint.monitor,
            mode=mode,
            best_so_far=None if best is None else best[checkpoint.monitor],
        ),
    ]


def _logger_callbacks(logger: schema.Logger, home: RunFiles) -> list[keras.callbacks.Callback]:
    """steps.csv and TensorBoard (with its step profiler), as `logger` switches them on."""
    callbacks: list[keras.callbacks.Callback] = []
    board = home.path / "tensorboard"
    if logger.csv:
        callbacks.append(StepCSVLogger(home.file("steps"), logger.csv.every_n_steps))
    if logger.tensorboard:
        tb = logger.tensorboard
        callbacks.append(
            keras.callbacks.TensorBoard(
                log_dir=str(files.library_dir(board)),
                update_freq="epoch",  # steps: TensorBoardStepLogger, at the optimizer's step
                histogram_freq=tb.histogram_freq,
                profile_batch=0,  # Keras' marker gives xprof no step: StepProfiler's does
            )
        )
        if tb.update_freq != "epoch":
            every = 1 if tb.update_freq == "batch" else tb.update_freq
            callbacks.append(TensorBoardStepLogger(board / "train", every))
        if tb.profile_batch:
            callbacks.append(StepProfiler(board, first=tb.profile_batch, calls=tb.profile_steps))
    return callbacks
