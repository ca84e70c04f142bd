"""What a run learns (the `task` group), in one place: per task its loss, its metrics under
stable Keras names, the size of the model's head, its main metric, and the check that the
dataset's targets fit it (before any training).

| task           | head                | loss                                  | metrics                               |
|----------------|---------------------|---------------------------------------|---------------------------------------|
| classification | num_classes logits  | sparse categorical cross-entropy      | accuracy (+ top_K_accuracy)           |
| binary         | 1 logit             | binary cross-entropy                  | accuracy, auc, precision, recall      |
| multilabel     | N logits            | sigmoid (binary) cross-entropy        | binary_accuracy, auc, f1_micro/macro  |
| regression     | N linear outputs    | mse, mae or huber                     | mae, rmse, r2                         |

Imports no TensorFlow at module level: the config check (`tfrecipe validate`) uses the names.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from tfrecipe.errors import ConfigError

if TYPE_CHECKING:
    from tfrecipe.config import schema
    from tfrecipe.data.splits import DatasetInfo

# How a user's model builder is called; the message an old (`num_classes`) builder gets.
MODEL_ARGUMENTS = ("input_shape", "num_outputs")
OLD_SIGNATURE_HINT = (
    "model builders now take num_outputs (the task's output size) instead of num_classes; "
    "rename the parameter: def builder(*, input_shape, num_outputs, ...)"
)


def metric_names(task: schema.Task) -> tuple[str, ...]:
    """The task's metrics as `fit` logs them (without `loss`; validation adds `val_`)."""
    if task.name == "classification":
        return ("accuracy", *((f"top_{task.top_k}_accuracy",) if task.top_k else ()))
    if task.name == "binary":
        return ("accuracy", "auc", "precision", "recall")
    if task.name == "multilabel":
        return ("binary_accuracy", "auc", "f1_micro", "f1_macro")
    return ("mae", "rmse", "r2")


def main_metric(task: schema.Task) -> str:
    """The metric curves.png plots beside the loss."""
    return {"classification": "accuracy", "binary": "auc", "multilabel": "f1_macro"}.get(
        task.name, "mae"
    )


def monitors(task: schema.Task) -> tuple[str, ...]:
    """Every name a checkpoint or early-stopping monitor may take for this task."""
    names = ("loss", *metric_names(task))
    return (*names, *(f"val_{name}" for name in names))


# Metrics where bigger is better; the others (loss, mae, rmse) improve downwards.
_HIGHER_IS_BETTER = frozenset(
    {"accuracy", "binary_accuracy", "auc", "precision", "recall", "f1_micro", "f1_macro", "r2"}
)


def monitor_mode(monitor: str) -> str:
    """ "max" or "min" for a monitored name (val_auc: max, val_mae: min), decided from the name:
    Keras' "auto" reads it from the compiled metric objects, which the custom loop never
    builds, and guesses wrong for names it does not know."""
    base = monitor.removeprefix("val_")
    return "max" if base in _HIGHER_IS_BETTER or base.endswith("_accuracy") else "min"


def num_outputs(task: schema.Task, info: DatasetInfo) -> int:
    """The width of the model's head."""
    if task.name == "classification":
        return info.num_classes
    if task.name == "binary":
        return 1
    return math.prod(info.target_shape) or 1


# --- loss and metrics (Keras objects) -------------------------------------------------------------
def loss(task: schema.Task):
    """The task's loss (from logits where it has a choice), mean over each example's outputs."""
    import keras

    if task.name == "classification":
        if task.label_smoothing:
            return _sparse_smoothed_loss()(label_smoothing=task.label_smoothing)
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if task.name in ("binary", "multilabel"):
        return keras.losses.BinaryCrossentropy(from_logits=True)
    if task.loss == "huber":
        return keras.losses.Huber(delta=task.huber_delta)
    return {"mse": keras.losses.MeanSquaredError, "mae": keras.losses.MeanAbsoluteError}[
        task.loss
    ]()


def metrics(task: schema.Task) -> list[Any]:
    """Fresh metric objects under the names `metric_names` lists, in that order."""
    import keras

    if task.name == "classification":
        found = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        if task.top_k:
            found.append(
                keras.metrics.SparseTopKCategoricalAccuracy(
                    k=task.top_k, name=f"top_{task.top_k}_accuracy"
                )
            )
        return found
    sigmoid = _sigmoid_metrics()
    if task.name == "binary":
        return [
            sigmoid["BinaryAccuracy"](threshold=task.threshold, name="accuracy"),
            keras.metrics.AUC(from_logits=True, name="auc"),
            sigmoid["Precision"](thresholds=task.threshold, name="precision"),
            sigmoid["Recall"](thresholds=task.threshold, name="recall"),
        ]
    if task.name == "multilabel":
        return [
            sigmoid["BinaryAccuracy"](threshold=task.threshold, name="binary_accuracy"),
            keras.metrics.AUC(from_logits=True, multi_label=True, name="auc"),
            sigmoid["F1Score"](average="micro", threshold=task.threshold, name="f1_micro"),
            sigmoid["F1Score"](average="macro", threshold=task.threshold, name="f1_macro"),
        ]
    return [
        keras.metrics.MeanAbsoluteError(name="mae"),
        keras.metrics.RootMeanSquaredError(name="rmse"),
        keras.metrics.R2Score(name="r2"),
    ]


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
    """Makes the task's own Keras classes known (before loading a saved model)."""
    _sigmoid_metrics()
    _sparse_smoothed_loss()


# --- the dataset's targets against the task --------------------------------------------------------
def check_targets(task: schema.Task, info: DatasetInfo, *, dataset: str) -> None:
    """Refuses targets the task cannot learn from, before training.

    Raises:
      ConfigError: one line naming the dataset, the task and the offending value.
    """
    problem = _target_problem(task, info)
    if problem:
        raise ConfigError(f"task={task.name}: dataset {dataset} {problem}")


def _target_problem(task: schema.Task, info: DatasetInfo) -> str | None:
    targets = info.targets
    if info.class_names and task.name in ("regression", "multilabel"):  # ids of string labels
        return (
            f"has string labels (e.g. {info.class_names[0]!r}); {task.name} needs numeric "
            "targets (task=classification or binary learns the names)"
        )
    if targets is not None and targets.dtype.kind in "USO":
        example = targets.reshape(-1)[0].item() if targets.size else ""
        return f"has string labels (e.g. {example!r}); {task.name} needs numeric targets"
    if targets is not None and targets.dtype.kind == "f" and not np.isfinite(targets).all():
        bad = targets[~np.isfinite(targets)].reshape(-1)[0].item()
        return f"has a non-finite target ({bad}); remove or fill those examples"
    kind = info.target_kind
    if task.name == "classification":
        if kind not in ("classes", "binary"):
            return f"has {kind} targets; classification needs integer class ids (try task=...)"
        return _class_ids_problem(targets, info.num_classes)
    if task.name == "binary":
        if kind not in ("classes", "binary") or info.num_classes != 2:
            return (
                f"has {kind} targets with num_classes={info.num_classes}; binary needs 0/1 labels"
            )
        return _class_ids_problem(targets, 2)
    if task.name == "multilabel":
        return _multi_hot_problem(task, info)
    if kind == "float" or kind == "classes":  # regression on class ids is a choice, allowed
        return None
    return f"has {kind} targets; regression needs numeric targets"


def _class_ids_problem(targets: np.ndarray | None, num_classes: int) -> str | None:
    if targets is None:
        return None
    if targets.dtype.kind not in "iub":
        return f"has {targets.dtype} labels; class ids must be integers"
    bad = targets[(targets < 0) | (targets >= num_classes)]
    if bad.size:
        return f"has class id {int(bad.reshape(-1)[0])} outside [0, num_classes={num_classes})"
    return None


def _multi_hot_problem(task: schema.Task, info: DatasetInfo) -> str | None:
    if info.target_kind != "multi_hot" or len(info.target_shape) != 1:
        return (
            f"has {info.target_kind} targets of shape {list(info.target_shape)}; multilabel "
            "needs multi-hot vectors [num_labels]"
        )
    width = info.target_shape[0]
    if task.num_labels is not None and width != task.num_labels:
        return f"has multi-hot labels of width {width}, but task.num_labels={task.num_labels}"
    targets = info.targets
    if targets is not None and not np.isin(targets, (0, 1)).all():
        bad = targets[~np.isin(targets, (0, 1))].reshape(-1)[0]
        return f"has a multi-hot label value {bad}; each entry must be 0 or 1"
    return None
