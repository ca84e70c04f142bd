"""A user callback that records what actually ran, for tests that check an option took effect
rather than that the summary repeats the config:

    +callbacks.extra.probe._target_=helpers.run_probe.RunProbe
    +callbacks.extra.probe.path=/tmp/probe.json  allowed_targets=[helpers]
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import tensorflow as tf

# The public strategy classes, by the name a test expects.
STRATEGIES = {
    "OneDeviceStrategy": tf.distribute.OneDeviceStrategy,
    "MirroredStrategy": tf.distribute.MirroredStrategy,
    "CentralStorageStrategy": tf.distribute.experimental.CentralStorageStrategy,
    "MultiWorkerMirroredStrategy": tf.distribute.MultiWorkerMirroredStrategy,
}


class RunProbe(keras.callbacks.Callback):
    """At the end of training writes to `path`: the strategy classes the model was built under
    (none: the default strategy), and whether Keras' fit ran the steps (`model.train_function`,
    which only fit builds)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = Path(path)

    def on_train_end(self, logs=None):
        strategy = self.model.distribute_strategy
        probe = {
            "strategies": sorted(n for n, c in STRATEGIES.items() if isinstance(strategy, c)),
            "fit": self.model.train_function is not None,
        }
        self.path.write_text(json.dumps(probe))
