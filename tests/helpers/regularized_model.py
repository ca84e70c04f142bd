"""A user's model with weight and activity regularization, so `model.losses` is not empty."""

from __future__ import annotations

from collections.abc import Sequence

import keras


def regularized_mlp(
    *,
    input_shape: Sequence[int],
    num_outputs: int,
    hidden_units: Sequence[int] = (32,),
    dropout: float = 0.0,
    l2: float = 0.01,
) -> keras.Model:
    """`tfrecipe.models.mlp`'s arguments (dropout must stay 0) with L2 on the kernels and on the
    hidden activations."""
    if dropout:
        raise ValueError(f"regularized_mlp has no dropout, received dropout={dropout}")
    inputs = keras.Input(shape=tuple(input_shape))
    x = keras.layers.Flatten()(inputs)
    for units in hidden_units:
        x = keras.layers.Dense(
            units,
            activation="relu",
            kernel_regularizer=keras.regularizers.L2(l2),
            activity_regularizer=keras.regularizers.L2(l2 / 10),
        )(x)
    logits = keras.layers.Dense(
        num_outputs, dtype="float32", kernel_regularizer=keras.regularizers.L2(l2)
    )(x)
    return keras.Model(inputs, logits, name="regularized_mlp")
