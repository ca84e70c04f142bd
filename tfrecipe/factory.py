"""The run's data, model and objective, defined once for training, `tfrecipe evaluate` and the
sidecar evaluator (which must build exactly what training built)."""

from __future__ import annotations

from tfrecipe.config import schema
from tfrecipe.config.instantiate import instantiate


def load_splits(run: schema.RunConfig):
    """The configured dataset's unbatched splits and their `DatasetInfo` (`data.Splits`)."""
    return instantiate(
        run.dataset.model_dump(by_alias=True), key="dataset", allowed=run.allowed_targets
    )


def build_model(run: schema.RunConfig, info):
    """The configured model for the dataset's input shape and classes (build it in the scope of
    the strategy that will train it)."""
    return instantiate(
        run.model.model_dump(by_alias=True),
        key="model",
        allowed=run.allowed_targets,
        input_shape=info.input_shape,
        num_classes=info.num_classes,
    )


def compile_model(model, *, optimizer=None, steps_per_execution: int = 1) -> None:
    """Every model trains and is scored on sparse categorical cross-entropy from logits and
    accuracy, under Keras' own names (`loss`, `accuracy`)."""
    import keras

    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=steps_per_execution,
    )
