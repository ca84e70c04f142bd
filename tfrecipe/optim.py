"""Optimizer and learning-rate schedule from the optimizer config."""

from __future__ import annotations

import math
from typing import Any

import keras

from tfrecipe import compat
from tfrecipe.config import schema

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
    gradient_accumulation_steps: int = 1,
) -> keras.optimizers.Optimizer:
    """The configured optimizer; wrapped in a dynamic `LossScaleOptimizer` for float16.

    `gradient_accumulation_steps` > 1: Keras' own accumulation (`Model.fit`'s, which has no
    other): the optimizer averages that many micro-batches' gradients before each update, and its
    `iterations` (what schedules, backups and step counts read) counts updates.
    """
    options = spec.model_dump(
        exclude={"name", "schedule", "warmup_steps", "min_lr_fraction", "learning_rate", "ema"}
    )
    if gradient_accumulation_steps > 1:
        options["gradient_accumulation_steps"] = gradient_accumulation_steps
        if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            learning_rate = PerUpdateSchedule(learning_rate, gradient_accumulation_steps)
    optimizer = _OPTIMIZERS[spec.name](learning_rate=learning_rate, use_ema=spec.ema, **options)
    if spec.ema:
        _defer_ema_finalization(optimizer)
    if not loss_scaling:
        return optimizer
    return count_skipped_steps(keras.optimizers.LossScaleOptimizer(optimizer))


def _defer_ema_finalization(optimizer: keras.optimizers.Optimizer) -> None:
    """`fit` copies the averaged weights into the model at the end of every call
    (`finalize_variable_values`); tfrecipe's fit runs a resumed epoch as two calls, and the
    second would go on training from the average. Only this instance is changed: tfrecipe puts the
    average in place itself, once, when training ends (`use_averaged_weights`)."""
    optimizer.finalize_variable_values = lambda var_list: None


def uses_ema(optimizer: keras.optimizers.Optimizer) -> bool:
    return bool(getattr(_inner(optimizer), "use_ema", False))


def use_averaged_weights(model: keras.Model) -> None:
    """Puts the moving average of the weights (`optimizer.ema`) into the model, for the test
    split, the exports and model.keras; a no-op without EMA."""
    optimizer = _inner(model.optimizer)
    if uses_ema(optimizer) and optimizer.built:
        keras.optimizers.Optimizer.finalize_variable_values(optimizer, model.trainable_weights)


def averages(model: keras.Model) -> dict[int, Any]:
    """The moving average of each weight (`optimizer.ema`), by the weight's id (what a save of
    the averaged weights writes in its place); empty without EMA or before the optimizer is
    built."""
    optimizer = _inner(model.optimizer) if model.optimizer is not None else None
    if optimizer is None or not uses_ema(optimizer) or not optimizer.built:
        return {}
    return {id(variable): average for variable, average in compat.ema_pairs(optimizer)}


def count_skipped_steps(
    optimizer: keras.optimizers.LossScaleOptimizer,
) -> keras.optimizers.LossScaleOptimizer:
    """Makes a step whose float16 gradients overflowed count in `iterations`, as a step.

    Keras 3's dynamic loss scaling skips such a step (it halves the scale and applies nothing)
    without counting it; tf.keras counted it. tfrecipe reads `iterations` as the number of
    training steps taken, i.e. of global batches consumed: a backup's input position, the resumed
    epoch, `steps_completed`. Uncounted skips (common in the first steps, while the scale comes
    down from 2^15) would resume a run on batches it already used and end it short of its planned
    steps. Only this instance is changed: `model.keras` still names Keras' own class.
    """
    compat.after_skipped_step(optimizer, lambda: optimizer.iterations.assign_add(1))
    return optimizer


@keras.saving.register_keras_serializable(package="tfrecipe")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule(step) x factor`: a schedule lowered after a loss blow-up (a rollback), kept in
    model.keras like any Keras schedule."""

    def __init__(self, schedule: keras.optimizers.schedules.LearningRateSchedule, factor: float):
        self.schedule = schedule
        self.factor = factor

    def __call__(self, step):
        return self.schedule(step) * self.factor

    def get_config(self) -> dict:
        return {
            "schedule": keras.optimizers.schedules.serialize(self.schedule),
            "factor": self.factor,
        }

    @classmethod
    def from_config(cls, config: dict) -> ScaledSchedule:
        schedule = keras.optimizers.schedules.deserialize(config["schedule"])
        return cls(schedule, config["factor"])


@keras.saving.register_keras_serializable(package="tfrecipe")
class PerUpdateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule over optimizer updates under Keras' gradient accumulation, which calls the
    schedule with its micro-batch counter (Keras 3.15 `_get_current_learning_rate` passes
    `_iterations`, not `iterations`): `schedule(micro_batches // accumulate)`."""

    def __init__(self, schedule: keras.optimizers.schedules.LearningRateSchedule, accumulate: int):
        self.schedule = schedule
        self.accumulate = accumulate

    def __call__(self, step):
        return self.schedule(keras.ops.floor_divide(step, self.accumulate))

    def get_config(self) -> dict:
        return {
            "schedule": keras.optimizers.schedules.serialize(self.schedule),
            "accumulate": self.accumulate,
        }

    @classmethod
    def from_config(cls, config: dict) -> PerUpdateSchedule:
        schedule = keras.optimizers.schedules.deserialize(config["schedule"])
        return cls(schedule, config["accumulate"])


def _inner(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer that holds the learning rate: a float16 LossScaleOptimizer's inner one."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """The learning rate of the next step (a schedule's value at the current step)."""
    return float(keras.ops.convert_to_numpy(_inner(optimizer).learning_rate))


def base_learning_rate(
    optimizer: keras.optimizers.Optimizer,
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """The learning rate `optimizer` trains with now: its schedule, or the float's value."""
    schedule = compat.learning_rate_setting(_inner(optimizer))
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return schedule
    return float(keras.ops.convert_to_numpy(schedule))


def set_scaled_learning_rate(
    optimizer: keras.optimizers.Optimizer,
    base: float | keras.optimizers.schedules.LearningRateSchedule,
    factor: float,
) -> None:
    """Trains on with `base x factor` (a float's variable is assigned; a schedule is wrapped, so
    a traced train step must be traced again to see it)."""
    inner = _inner(optimizer)
    if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
        inner.learning_rate = ScaledSchedule(base, factor)
    else:
        inner.learning_rate = base * factor


def build_optimizer_variables(model: keras.Model) -> None:
    """Creates the optimizer's variables now, under the strategy's scope, as fit does: they
    cannot be created inside a training loop's graph, and a restore must find them to fill."""
    if model.optimizer is None:
        raise ValueError(
            "the training loops expect a compiled model (model.compile(optimizer=...))"
        )
    if not model.optimizer.built:
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)
