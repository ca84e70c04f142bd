"""The run's data, model and objective, defined once for training, `tfrecipe evaluate` and the
sidecar evaluator (which must build exactly what training built)."""

from __future__ import annotations

import math

from tfrecipe.config import schema
from tfrecipe.config.instantiate import instantiate
from tfrecipe.data.pipeline import PipelineOptions, batch_transform, prepare


def load_splits(spec: schema.Target, *, allowed_targets: list[str]):
    """The `dataset` group's unbatched splits and their `DatasetInfo` (`data.Splits`)."""
    return instantiate(spec.model_dump(by_alias=True), key="dataset", allowed=allowed_targets)


def build_model(spec: schema.Target, info, *, allowed_targets: list[str]):
    """The `model` group's model for the dataset's input shape and classes (build it in the scope
    of the strategy that will train it)."""
    return instantiate(
        spec.model_dump(by_alias=True),
        key="model",
        allowed=allowed_targets,
        input_shape=info.input_shape,
        num_classes=info.num_classes,
    )


def evaluation_data(dataset, options: PipelineOptions, *, batch_size: int, seed: int, split: str):
    """One split, prepared and batched as training evaluates it (normalization included), on the
    default strategy: `batch_size` examples per batch on its one replica."""
    import tensorflow as tf

    from tfrecipe.data.distribute import distribute as distribute_dataset

    return distribute_dataset(
        tf.distribute.get_strategy(),
        prepare(dataset, options, split=split, training=False, seed=seed),
        global_batch_size=batch_size,
        batch_map=batch_transform(options),
    )


# A model below this many parameters takes a small fraction of a millisecond per example, so a
# training step costs about as much as the Python (callbacks, dispatch) around it: several steps
# per call pay that once. Above it one step per call loses nothing and keeps hooks per step.
SMALL_MODEL_PARAMS = 1_000_000
MAX_STEPS_PER_CALL = 32


def steps_per_call(
    requested: int | str,
    *,
    num_params: int,
    steps_per_epoch: int,
    start_step: int = 0,
    hook_intervals: tuple[int, ...] = (),
) -> int:
    """`batching.steps_per_execution` / `loop.steps_per_loop`, with "auto" resolved: for a small
    model the largest number up to MAX_STEPS_PER_CALL that divides `steps_per_epoch`, the steps
    left in the epoch a restored run starts in (`fit`'s last call of an epoch would otherwise run
    past the epoch on endless data) and every step interval a per-step hook was asked for
    (`hook_intervals`: backups, step logs keep their steps); else 1. It depends on the config,
    the model and the restored step only, so every replica and worker picks the same."""
    if requested != "auto":
        return int(requested)
    if num_params >= SMALL_MODEL_PARAMS:
        return 1
    period = math.gcd(steps_per_epoch, start_step % steps_per_epoch, *hook_intervals)
    return max(d for d in range(1, min(MAX_STEPS_PER_CALL, period) + 1) if period % d == 0)


def compile_model(
    model, *, optimizer=None, steps_per_execution: int = 1, jit_compile: bool | str = "auto"
) -> None:
    """Every model trains and is scored on sparse categorical cross-entropy from logits and
    accuracy, under Keras' own names (`loss`, `accuracy`)."""
    import keras

    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=steps_per_execution,
        jit_compile=jit_compile,
    )
