"""A user's callback that saves the backbone's and the head's weights as training begins, after
each epoch and as it ends, to see what a frozen layer did:
    +callbacks.extra.snap._target_=helpers.weight_snapshot.WeightSnapshot
    +callbacks.extra.snap.path=DIR  allowed_targets=[helpers]
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np


class WeightSnapshot(keras.callbacks.Callback):
    """DIR/begin.npz, DIR/epoch{N}.npz and DIR/end.npz: `backbone/I` and `logits/I` for each
    weight (trainable or not: a frozen BatchNormalization must not update its moving statistics
    either)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = Path(path)

    def _save(self, name: str) -> None:
        arrays = {
            f"{layer}/{i}": np.asarray(weight)
            for layer in ("backbone", "logits")
            for i, weight in enumerate(self.model.get_layer(layer).get_weights())
        }
        self.path.mkdir(parents=True, exist_ok=True)
        np.savez(self.path / f"{name}.npz", **arrays)

    def on_train_begin(self, logs=None):
        self._save("begin")

    def on_epoch_end(self, epoch, logs=None):
        self._save(f"epoch{epoch}")

    def on_train_end(self, logs=None):
        self._save("end")
