"""A user's model with a frozen body, for two-phase fine-tuning tests (`loop.finetune`), and a
callback that records which weights moved and the learning rate after each epoch.

    model=mlp model._target_=helpers.finetune_models.frozen_body_mlp model.hidden_units=[16,16]
    +callbacks.extra.probe._target_=helpers.finetune_models.WeightProbe
    +callbacks.extra.probe.path=/tmp/probe.jsonl allowed_targets=[helpers]

Like a user's package, it depends on nothing from tfrecipe.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import keras
import numpy as np


def frozen_body_mlp(
    *, input_shape, num_outputs, hidden_units=(16, 16), dropout: float = 0.0
) -> keras.Model:
    """Flatten -> a body of Dense + BatchNormalization layers (frozen) -> a Dense head."""
    inputs = keras.Input(shape=tuple(input_shape))
    x = keras.layers.Flatten()(inputs)
    for index, units in enumerate(hidden_units):
        x = keras.layers.Dense(units, activation="relu", name=f"body_dense_{index}")(x)
        x = keras.layers.BatchNormalization(name=f"body_bn_{index}")(x)
    outputs = keras.layers.Dense(num_outputs, dtype="float32", name="head")(x)
    model = keras.Model(inputs, outputs, name="frozen_body_mlp")
    for layer in model.layers:
        if layer.name.startswith("body_"):
            layer.trainable = False
    return model


def _fingerprint(layer: keras.Layer) -> str:
    digest = hashlib.sha1()
    for weight in layer.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


class WeightProbe(keras.callbacks.Callback):
    """Appends one JSON line at the start of training and after each epoch: a fingerprint of each
    layer's weights, the learning rate of the next step and the number of trainable tensors."""

    def __init__(self, path: str):
        super().__init__()
        self.path = Path(path)

    def _record(self, epoch: int | None) -> None:
        rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        row = {
            "epoch": epoch,
            "weights": {layer.name: _fingerprint(layer) for layer in self.model.layers},
            "learning_rate": rate,
            "trainable": len(self.model.trainable_variables),
        }
        with self.path.open("a") as file:
            file.write(json.dumps(row) + "\n")

    def on_train_begin(self, logs=None):
        self._record(None)

    def on_epoch_end(self, epoch, logs=None):
        self._record(epoch)


def read_probe(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


class SignalAtStep(keras.callbacks.Callback):
    """Sends this process SIGTERM after optimizer step `step` (a preemption at a known step; a
    resumed run starts past it and is left alone). The step must end a call: run it with one
    step per call."""

    def __init__(self, step: int):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        import os
        import signal

        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
