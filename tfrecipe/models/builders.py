"""Model builders: each takes the dataset's `input_shape` and the task's `num_outputs` (the head's
width: classes, 1 for binary, labels, regression outputs) plus its own options, and returns an
uncompiled Keras model whose output is float32 with no activation (logits, or a regression's
linear outputs), also under mixed precision.

A user's model is any function with this signature, named in config by `model._target_`.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import layers

from tfrecipe.config.targets import config_target


def _logits(x: keras.KerasTensor, num_outputs: int) -> keras.KerasTensor:
    # float32 output: softmax/cross-entropy (and a regression's squared error) in half precision
    # lose too much (Keras' guidance).
    return layers.Dense(num_outputs, dtype="float32", name="logits")(x)


def _require_image(input_shape: Sequence[int], model: str) -> None:
    if len(input_shape) != 3:
        raise ValueError(
            f"{model} expects images of shape [height, width, channels], received "
            f"input_shape={list(input_shape)}; use model=mlp for vectors"
        )


@config_target
def mlp(
    *,
    input_shape: Sequence[int],
    num_outputs: int,
    hidden_units: Sequence[int] = (256, 256),
    dropout: float = 0.0,
) -> keras.Model:
    """Dense layers with ReLU on the flattened input."""
    if not all(isinstance(u, int) and u > 0 for u in hidden_units):
        raise ValueError(f"hidden_units must be positive integers, received {list(hidden_units)}")
    inputs = keras.Input(shape=tuple(input_shape))
    x = layers.Flatten()(inputs)
    for units in hidden_units:
        x = layers.Dense(units, activation="relu")(x)
        if dropout:
            x = layers.Dropout(dropout)(x)
    return keras.Model(inputs, _logits(x, num_outputs), name="mlp")


@config_target
def linear(*, input_shape: Sequence[int], num_outputs: int, l2: float = 0.0) -> keras.Model:
    """One Dense layer on the flattened (table: encoded) input: linear regression, or logistic
    regression under a binary, multilabel or classification task, on the same preprocessing as
    every other model. `l2`: a weight penalty (Ridge's alpha divided by the training examples
    gives the same optimum under mean squared error)."""
    if not (isinstance(l2, int | float) and l2 >= 0):
        raise ValueError(f"l2 must be a number >= 0, received l2={l2!r}")
    inputs = keras.Input(shape=tuple(input_shape))
    x = layers.Flatten()(inputs)
    regularizer = keras.regularizers.L2(l2) if l2 else None
    outputs = layers.Dense(
        num_outputs, dtype="float32", kernel_regularizer=regularizer, name="logits"
    )(x)
    return keras.Model(inputs, outputs, name="linear")


@config_target
def cnn(
    *,
    input_shape: Sequence[int],
    num_outputs: int,
    filters: Sequence[int] = (32, 64),
    dense_units: int = 128,
    dropout: float = 0.2,
) -> keras.Model:
    """Conv blocks (two 3x3 convolutions, then 2x2 pooling while the image is large enough)."""
    _require_image(input_shape, "cnn")
    inputs = keras.Input(shape=tuple(input_shape))
    x = inputs
    size = min(input_shape[:2])
    for width in filters:
        x = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        x = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        if size >= 4:
            x = layers.MaxPooling2D()(x)
            size //= 2
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(dense_units, activation="relu")(x)
    if dropout:
        x = layers.Dropout(dropout)(x)
    return keras.Model(inputs, _logits(x, num_outputs), name="cnn")


def _residual_block(x: keras.KerasTensor, width: int, stride: int) -> keras.KerasTensor:
    shortcut = x
    y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU()(y)
    y = layers.Conv2D(width, 3, padding="same", use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    if stride != 1 or shortcut.shape[-1] != width:
        shortcut = layers.Conv2D(width, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = layers.BatchNormalization()(shortcut)
    return layers.ReLU()(layers.Add()([y, shortcut]))


@config_target
def resnet(
    *,
    input_shape: Sequence[int],
    num_outputs: int,
    stage_filters: Sequence[int] = (16, 32, 64),
    blocks_per_stage: int = 2,
) -> keras.Model:
    """A small ResNet (He et al.'s CIFAR design: 3x3 stem, residual stages, global pooling)."""
    _require_image(input_shape, "resnet")
    if blocks_per_stage < 1:
        raise ValueError(f"blocks_per_stage must be >= 1, received {blocks_per_stage}")
    inputs = keras.Input(shape=tuple(input_shape))
    x = layers.Conv2D(stage_filters[0], 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for stage, width in enumerate(stage_filters):
        for block in range(blocks_per_stage):
            downsample = stage > 0 and block == 0 and min(x.shape[1:3]) >= 2
            x = _residual_block(x, width, stride=2 if downsample else 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, _logits(x, num_outputs), name="resnet")
