"""Sidecar evaluation: an `evaluator` task scores each checkpoint the workers write, as it appears.

Writer side: with `cluster.evaluator=true` every worker saves the model's weights after each
epoch (`checkpoint_callbacks`): the chief into `RUN_DIR/checkpoints/epoch-NNN.weights.h5`, the
others into their scratch dirs (every worker takes part in saving synchronized variables).

Reader side (`evaluate_checkpoints`): the evaluator task receives the same model built on the
default strategy (`train.py` builds it; it never constructs the workers' strategy, so it joins
no collective), waits for new checkpoint files, evaluates each on the validation split (the test
split when there is none), prints one line per checkpoint and appends it to
`RUN_DIR/evaluator/metrics.csv` (a file only the evaluator writes). It stops once the chief's
summary.json says training ended and every checkpoint has been scored.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

from tfrecipe import files, rundir

CHECKPOINTS = "checkpoints"
PATTERN = "epoch-{epoch:03d}.weights.h5"


def checkpoint_callbacks(home: rundir.RunFiles) -> list:
    """The per-epoch weight checkpoints a sidecar evaluator reads, each file written whole
    (tfrecipe.files.write_weights) before its name appears."""
    import keras

    folder = files.library_dir(home.path / CHECKPOINTS)

    class EpochWeights(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            files.write_weights(self.model, folder / PATTERN.format(epoch=epoch + 1))

    return [EpochWeights()]


def _training_ended(home: rundir.RunFiles) -> bool:
    summary = home.summary()
    return bool(summary) and summary.get("status") in ("completed", "pruned", "failed", "preempted")


def _load(model, path: Path, attempts: int = 5) -> None:
    """Loads weights, retrying while the writer may still be writing the file."""
    for attempt in range(attempts):
        try:
            model.load_weights(path)
            return
        except (OSError, ValueError):
            if attempt + 1 == attempts:
                raise
            time.sleep(1.0)


def _score(model, data, path: Path) -> dict[str, float]:
    """The metrics of the checkpoint at `path`, printed on one line."""
    _load(model, path)
    metrics = model.evaluate(data, verbose=0, return_dict=True)
    metrics = {name: float(value) for name, value in metrics.items()}
    print(f"evaluated {path.name}: {metrics}", flush=True)
    return metrics


class _MetricsTable:
    """metrics.csv, a row per checkpoint as it is scored; the first row's metrics name the
    columns."""

    def __init__(self, file) -> None:
        self._file, self._writer = file, None

    def add(self, checkpoint: str, metrics: dict[str, float]) -> None:
        if self._writer is None:
            self._writer = csv.DictWriter(self._file, fieldnames=["checkpoint", *metrics])
            self._writer.writeheader()
        self._writer.writerow({"checkpoint": checkpoint, **metrics})
        self._file.flush()


def evaluate_checkpoints(
    model, data, *, home: rundir.RunFiles, poll_s: float = 1.0, started: float | None = None
) -> dict[str, Any]:
    """Scores every checkpoint of the run in `home` until training ends; returns a summary.

    Args:
      model: the run's model, compiled like training's, built on the default strategy.
      data: the split to score each checkpoint on, batched as training evaluates it.
      started: when the evaluator task began (`time.perf_counter()`), so that its wall time
        counts building the model and data; now when not given.
    """
    from tfrecipe import compat

    compat.cache_saving_skipsets()  # a load per checkpoint, each walking every layer and metric
    started = time.perf_counter() if started is None else started
    out = files.library_dir(home.path / "evaluator")
    seen: set[Path] = set()
    last: dict[str, float] = {}
    with files.open_log(out / "metrics.csv") as file:
        table = _MetricsTable(file)
        while True:
            ended = _training_ended(home)  # before listing: the last checkpoint is not missed
            for path in sorted(set((home.path / CHECKPOINTS).glob("epoch-*.weights.h5")) - seen):
                last = _score(model, data, path)
                table.add(path.name, last)
                seen.add(path)
            if ended:
                break
            time.sleep(poll_s)
    return {
        "status": "completed",
        "checkpoints_evaluated": len(seen),
        "metrics": {f"val_{k}": v for k, v in last.items()},
        "test": {},
        "wall_time_s": round(time.perf_counter() - started, 3),
    }
