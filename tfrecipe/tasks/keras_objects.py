"""Each task's Keras loss and metric objects, built from logits (the model's head has no
activation), and the `_target_` ones a config names. Keras is imported inside each builder: the
config check (`tfrecipe validate`) reads the task table without TensorFlow."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfrecipe.config.grants import Grants
    from tfrecipe.tasks.config import Target, TaskConfig


def extra_metric_name(node: Target) -> str:
    """The name an extra metric is reported under: its `name`, else its class's name in snake
    case (keras.metrics.MeanSquaredLogarithmicError: mean_squared_logarithmic_error). Known
    without importing it (the config check runs before TensorFlow); `metrics` passes it on."""
    name = (node.model_extra or {}).get("name")
    if isinstance(name, str) and name:
        return name
    return _snake_case(node.target.rpartition(".")[2])


def _snake_case(name: str) -> str:
    # Keras' own rule (keras.src.utils.naming.to_snake_case), for the names Keras would pick.
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def instantiate_target(node: Target, *, key: str, grants: Grants, **defaults: Any) -> Any:
    """A `_target_` loss or metric, through the one allow-listed instantiation; `defaults`
    are arguments the node does not set itself."""
    from tfrecipe.config.instantiate import instantiate

    spec = node.model_dump(by_alias=True)
    extra = {name: value for name, value in defaults.items() if name not in spec}
    return instantiate(spec, key=key, grants=grants, **extra)


# --- per task: the loss (when task.loss names none by `_target_`) and the metrics -------------------
def classification_loss(task: TaskConfig):
    import keras

    if task.label_smoothing:
        return _sparse_smoothed_loss()(label_smoothing=task.label_smoothing)
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def sigmoid_loss(task: TaskConfig):
    """binary and multilabel: sigmoid (binary) cross-entropy from logits."""
    import keras

    return keras.losses.BinaryCrossentropy(from_logits=True)


def regression_loss(task: TaskConfig):
    import keras

    if task.loss == "huber":
        return keras.losses.Huber(delta=task.huber_delta)
    return {"mse": keras.losses.MeanSquaredError, "mae": keras.losses.MeanAbsoluteError}[
        task.loss
    ]()


def classification_metrics(task: TaskConfig) -> list[Any]:
    import keras

    found = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    if task.top_k:
        found.append(
            keras.metrics.SparseTopKCategoricalAccuracy(
                k=task.top_k, name=f"top_{task.top_k}_accuracy"
            )
        )
    return found


def binary_metrics(task: TaskConfig) -> list[Any]:
    import keras

    sigmoid = _sigmoid_metrics()
    return [
        sigmoid["BinaryAccuracy"](threshold=task.threshold, name="accuracy"),
        keras.metrics.AUC(from_logits=True, name="auc"),
        sigmoid["Precision"](thresholds=task.threshold, name="precision"),
        sigmoid["Recall"](thresholds=task.threshold, name="recall"),
    ]


def multilabel_metrics(task: TaskConfig) -> list[Any]:
    import keras

    sigmoid = _sigmoid_metrics()
    return [
        sigmoid["BinaryAccuracy"](threshold=task.threshold, name="binary_accuracy"),
        keras.metrics.AUC(from_logits=True, multi_label=True, name="auc"),
        sigmoid["F1Score"](average="micro", threshold=task.threshold, name="f1_micro"),
        sigmoid["F1Score"](average="macro", threshold=task.threshold, name="f1_macro"),
    ]


def regression_metrics(task: TaskConfig) -> list[Any]:
    import keras

    return [
        keras.metrics.MeanAbsoluteError(name="mae"),
        keras.metrics.RootMeanSquaredError(name="rmse"),
        keras.metrics.R2Score(name="r2"),
    ]


# --- tfrecipe's own Keras classes, registered for saved models ------------------------------------
_SIGMOID_METRICS: dict[str, type] = {}


def _sigmoid_metrics() -> dict[str, type]:
    """Keras metrics that read probabilities, made to read logits: the model's head has no
    activation (the loss works from logits, stabler), so these apply the sigmoid first.
    Registered by name so a saved model and the custom loop's compile config rebuild them."""
    if _SIGMOID_METRICS:
        return _SIGMOID_METRICS
    import keras

    for base in (
        keras.metrics.BinaryAccuracy,
        keras.metrics.Precision,
        keras.metrics.Recall,
        keras.metrics.F1Score,
    ):

        class FromLogits(base):
            def update_state(self, y_true, y_pred, sample_weight=None):
                y_pred = keras.ops.sigmoid(keras.ops.cast(y_pred, "float32"))
                if isinstance(self, keras.metrics.F1Score):  # needs the labels' float dtype
                    y_true = keras.ops.cast(y_true, "float32")
                return super().update_state(y_true, y_pred, sample_weight)

        name = f"Sigmoid{base.__name__}"
        FromLogits.__name__ = FromLogits.__qualname__ = name
        register = keras.saving.register_keras_serializable(package="tfrecipe", name=name)
        _SIGMOID_METRICS[base.__name__] = register(FromLogits)
    return _SIGMOID_METRICS


_SMOOTHED: list[type] = []


def _sparse_smoothed_loss() -> type:
    """Sparse categorical cross-entropy with label smoothing (Keras' sparse loss has none):
    the class ids made one-hot, then Keras' categorical cross-entropy from logits."""
    if _SMOOTHED:
        return _SMOOTHED[0]
    import keras

    @keras.saving.register_keras_serializable(package="tfrecipe")
    class SparseSmoothedCrossentropy(keras.losses.Loss):
        def __init__(self, label_smoothing=0.0, reduction="sum_over_batch_size", name=None):
            super().__init__(reduction=reduction, name=name or "sparse_smoothed_crossentropy")
            self.label_smoothing = label_smoothing

        def call(self, y_true, y_pred):
            ids = keras.ops.cast(keras.ops.reshape(y_true, (-1,)), "int32")
            one_hot = keras.ops.one_hot(ids, keras.ops.shape(y_pred)[-1], dtype=y_pred.dtype)
            return keras.losses.categorical_crossentropy(
                one_hot, y_pred, from_logits=True, label_smoothing=self.label_smoothing
            )

        def get_config(self):
            return {**super().get_config(), "label_smoothing": self.label_smoothing}

    _SMOOTHED.append(SparseSmoothedCrossentropy)
    return SparseSmoothedCrossentropy


def register_custom_objects() -> None:
    """Makes the tasks' own Keras classes known (before loading a saved model; the models' layers
    too: factory.register_custom_objects)."""
    _sigmoid_metrics()
    _sparse_smoothed_loss()
