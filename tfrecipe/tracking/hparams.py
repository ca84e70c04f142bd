"""TensorBoard's hyperparameter view (HParams) for `logger=tensorboard`: each run writes its
hyperparameters and final metrics into RUN_DIR/tensorboard, beside Keras' train/ and validation/
curves, so `tensorboard --logdir SWEEP_DIR` shows one HParams row per job.

The hyperparameters are the keys the sweep varies (the launching process names them in
SWEEP_KEYS_ENV; each job's own value), or every leaf of the config for a single run. The metrics
are summary.json's final ones, the test split's (`test_*`) and throughput, as `hparams/NAME`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfrecipe import files

if TYPE_CHECKING:
    import keras

# The keys a sweep varies, as a JSON list, set by the process that launches the jobs.
SWEEP_KEYS_ENV = "TFRECIPE_SWEEP_KEYS"
LOG_DIR = "tensorboard"
TAG_PREFIX = "hparams/"


class HParamsTracker:
    """Args:
    run_dir: the run directory (the view goes to RUN_DIR/tensorboard).
    hparams: the run's hyperparameters (`hyperparameters`).
    trial: the name the view shows for the run.
    """

    def __init__(self, *, run_dir: Path, hparams: Mapping[str, Any], trial: str):
        self.run_dir, self.hparams, self.trial = run_dir, dict(hparams), trial

    def callbacks(self) -> list[keras.callbacks.Callback]:
        return []

    def finish(self, summary: dict[str, Any]) -> None:
        import tensorflow as tf
        from tensorboard.plugins.hparams import api as hp

        numbers = dict(summary.get("metrics") or {})
        numbers |= {f"test_{k}": v for k, v in (summary.get("test") or {}).items()}
        numbers |= {k: summary.get(k) for k in ("examples_per_sec", "wall_time_s")}
        step = int(summary.get("epochs_completed") or 0)
        writer = tf.summary.create_file_writer(str(files.library_dir(self.run_dir / LOG_DIR)))
        try:
            with writer.as_default():
                hp.hparams(self.hparams, trial_id=self.trial)
                for name, value in numbers.items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        tf.summary.scalar(f"{TAG_PREFIX}{name}", float(value), step=step)
        finally:
            writer.close()


def hyperparameters(
    config: Mapping[str, Any], overrides: Sequence[str] | None
) -> dict[str, bool | int | float | str]:
    """A sweep job's values of the keys the sweep varies (SWEEP_KEYS_ENV; all of its overrides
    when that is unset), else every leaf of the config. Values HParams cannot hold (lists,
    None) as text."""
    if overrides is None:
        return {key: _value(value) for key, value in _leaves(config).items()}
    pairs = dict(o.split("=", 1) for o in overrides if "=" in o)
    pairs = {key.lstrip("+~"): value for key, value in pairs.items()}
    keys = json.loads(os.environ.get(SWEEP_KEYS_ENV) or "null") or list(pairs)
    leaves = _leaves(config)
    return {
        key: _value(leaves[key]) if key in leaves else _parsed(pairs[key])
        for key in keys
        if key in pairs or key in leaves
    }


def _leaves(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping) and value:
            flat |= _leaves(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _value(value: Any) -> bool | int | float | str:
    return value if isinstance(value, bool | int | float | str) else json.dumps(value)


def _parsed(text: str) -> bool | int | float | str:
    """An override's value (a group option such as model=mlp): a number where it reads as one."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)
