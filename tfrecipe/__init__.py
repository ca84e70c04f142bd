"""tfrecipe: config-driven (Hydra) training recipes for TensorFlow/Keras.

The public API. Names load on first use, so that `tfrecipe --help` and the subcommands that need
no TensorFlow do not pay for importing it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfrecipe.config.compose import compose
    from tfrecipe.config.instantiate import instantiate
    from tfrecipe.config.schema import validate
    from tfrecipe.data.splits import DatasetInfo, Splits
    from tfrecipe.distribute.strategy import build_strategy
    from tfrecipe.errors import ConfigError
    from tfrecipe.outcome import TrainingError
    from tfrecipe.train import train

_PUBLIC = {
    "compose": "tfrecipe.config.compose",
    "DatasetInfo": "tfrecipe.data.splits",
    "Splits": "tfrecipe.data.splits",
    "ConfigError": "tfrecipe.errors",
    "instantiate": "tfrecipe.config.instantiate",
    "validate": "tfrecipe.config.schema",
    "build_strategy": "tfrecipe.distribute.strategy",
    "TrainingError": "tfrecipe.outcome",
    "train": "tfrecipe.train",
}
__all__ = [
    "ConfigError",
    "DatasetInfo",
    "Splits",
    "TrainingError",
    "build_strategy",
    "compose",
    "instantiate",
    "train",
    "validate",
]
__version__ = "0.1.0"


def _quiet_tensorflow() -> None:
    """TensorFlow's start-up lines stay off the console whoever imports it first (the Python
    API too; TF_CPP_MIN_LOG_LEVEL=0 shows them)."""
    from tfrecipe.cli.console import quiet_tensorflow_import

    quiet_tensorflow_import()


_quiet_tensorflow()


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tfrecipe' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
