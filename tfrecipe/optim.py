"""Optimizer and learning-rate schedule from the optimizer config."""

from __future__ import annotations

import math

import keras

from tfrecipe import schema

_OPTIMIZERS = {
    "adam": keras.optimizers.Adam,
    "adamw": keras.optimizers.AdamW,
    "sgd": keras.optimizers.SGD,
}


def scaled_learning_rate(
    base: float, *, rule: str, global_batch_size: int, reference_batch_size: int
) -> float:
    """The learning rate for `global_batch_size`, by the linear or square-root scaling rule."""
    ratio = global_batch_size / reference_batch_size
    return base * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


def learning_rate_schedule(
    spec: schema.Optimizer, *, learning_rate: float, total_steps: int
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    if spec.schedule == "constant":
        return learning_rate
    warmup = spec.warmup_steps if spec.schedule == "warmup_cosine" else 0
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else learning_rate,
        decay_steps=max(total_steps - warmup, 1),
        alpha=spec.min_lr_fraction,
        warmup_target=learning_rate if warmup else None,
        warmup_steps=warmup,
    )


def build_optimizer(
    spec: schema.Optimizer,
    *,
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
    loss_scaling: bool,
) -> keras.optimizers.Optimizer:
    """The configured optimizer; wrapped in a dynamic `LossScaleOptimizer` for float16."""
    options = spec.model_dump(
        exclude={"name", "schedule", "warmup_steps", "min_lr_fraction", "learning_rate"}
    )
    optimizer = _OPTIMIZERS[spec.name](learning_rate=learning_rate, **options)
    return keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaling else optimizer
