"""A user's own model builder, outside tfrecipe: named in config by `model._target_`.

Used by the CLI tests as `model._target_=tests.helpers.user_models.tiny_dense` with
`allowed_targets=[tests.helpers]`; it depends on nothing from tfrecipe, like a user's package.
"""

from __future__ import annotations

import keras


def tiny_dense(*, input_shape, num_outputs, width: int = 16) -> keras.Model:
    """Flatten, one hidden Dense layer, float32 logits."""
    inputs = keras.Input(shape=tuple(input_shape))
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(width, activation="relu", name="user_hidden")(x)
    outputs = keras.layers.Dense(num_outputs, dtype="float32", name="user_logits")(x)
    return keras.Model(inputs, outputs, name="user_tiny_dense")
