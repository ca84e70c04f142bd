"""`loop=fit`: Keras `Model.fit` on the strategy's distributed datasets."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfrecipe.loops.options import LoopOptions


def run(
    model: keras.Model,
    train_data: tf.distribute.DistributedDataset,
    validation_data: tf.distribute.DistributedDataset | None,
    *,
    options: LoopOptions,
    callbacks: list[keras.callbacks.Callback],
) -> None:
    model.fit(
        train_data,
        validation_data=validation_data,
        epochs=options.epochs,
        steps_per_epoch=options.steps_per_epoch,
        validation_freq=options.validation_freq,
        callbacks=callbacks,
        verbose=options.verbose,
        shuffle=False,  # the dataset shuffles itself (seeded)
    )


def evaluate(
    model: keras.Model, data: tf.distribute.DistributedDataset, steps: int | None = None
) -> dict[str, float]:
    """The compiled loss and metrics of `model` on `data` (all of it, or `steps` batches)."""
    results = model.evaluate(data, steps=steps, verbose=0, return_dict=True)
    return {name: float(value) for name, value in results.items()}
