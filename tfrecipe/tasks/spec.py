"""The task table: per task (the `task` group) its metrics under stable Keras names, its main
metric, its default monitor, the width of the model's head, its loss and metric objects, the
check that a dataset's targets fit it, and what its outputs mean (`outputs`: the signature's and
`predict`'s names and decoding). A new task is one `TaskSpec` line in `SPECS` (and its
config class in config/schema.py).

Imports no TensorFlow: the config check (`tfrecipe validate`) reads the names; the Keras objects
are built in `keras_objects`, which imports Keras when one is asked for.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tfrecipe.config.grants import NO_GRANTS, Grants
from tfrecipe.errors import ConfigError, Problem
from tfrecipe.tasks import checks, keras_objects, outputs
from tfrecipe.tasks.config import Target as Target
from tfrecipe.tasks.config import TaskConfig as TaskConfig
from tfrecipe.tasks.keras_objects import extra_metric_name, instantiate_target

if TYPE_CHECKING:
    from tfrecipe.data.splits import DatasetInfo

# The `task` group's default (conf/config.yaml): what a config that names no task runs.
DEFAULT_TASK = "classification"
# How a user's model builder is called; the message an old (`num_classes`) builder gets.
MODEL_ARGUMENTS = ("input_shape", "num_outputs")
OLD_SIGNATURE_HINT = (
    "model builders now take num_outputs (the task's output size) instead of num_classes; "
    "rename the parameter: def builder(*, input_shape, num_outputs, ...)"
)


@dataclasses.dataclass(frozen=True)
class Reports:
    """What a task reports.

    Attributes:
      metric_names: its own metrics as `fit` logs them (without `loss`; validation adds `val_`).
      main_metric: the metric curves.png plots beside the loss.
      default_monitor: what checkpoints and early stopping watch with `monitor: auto`.
      baseline_metric: the number `baseline=auto` compares the baselines on (what an analyst
        reads first).
    """

    metric_names: Callable[[TaskConfig], tuple[str, ...]]
    main_metric: str
    default_monitor: str
    baseline_metric: str


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: what it reports and how it learns.

    Attributes:
      reports: its metric names, main metric, default monitor and baselines' metric.
      head: the width of the model's head for a dataset.
      loss: its Keras loss, from logits where it has a choice (unless `task.loss` names one).
      metrics: fresh Keras metric objects, in `metric_names`' order.
      target_problem: what about a dataset's targets it cannot learn from (None: nothing).
      outputs: what the head's outputs mean: their names, threshold, positive class, decoding.
      targets: what it learns from: "class_ids" (one class per example), "multi_hot" (a 0/1
        per label) or "values".
      learns_names: it learns string labels as class ids (class names).
      num_classes: the class ids its class weights cover (None: it takes none).
      standardizes_targets: `task.standardize_targets` applies.
    """

    reports: Reports
    head: Callable[[TaskConfig, DatasetInfo], int]
    loss: Callable[[TaskConfig], Any]
    metrics: Callable[[TaskConfig], list[Any]]
    target_problem: Callable[[TaskConfig, DatasetInfo], str | None]
    outputs: outputs.Outputs
    targets: str
    learns_names: bool = False
    num_classes: Callable[[DatasetInfo], int] | None = None
    standardizes_targets: bool = False


def _classification_names(task: TaskConfig) -> tuple[str, ...]:
    return ("accuracy", *((f"top_{task.top_k}_accuracy",) if task.top_k else ()))


def _flattened_targets(task: TaskConfig, info: DatasetInfo) -> int:
    return math.prod(info.target_shape) or 1


SPECS: Mapping[str, TaskSpec] = {
    "classification": TaskSpec(
        reports=Reports(
            metric_names=_classification_names,
            main_metric="accuracy",
            default_monitor="val_loss",
            baseline_metric="accuracy",
        ),
        head=lambda task, info: info.num_classes,
        loss=keras_objects.classification_loss,
        metrics=keras_objects.classification_metrics,
        target_problem=checks.classification_problem,
        outputs=outputs.CLASSES,
        targets="class_ids",
        learns_names=True,
        num_classes=lambda info: info.num_classes,
    ),
    "binary": TaskSpec(
        reports=Reports(
            metric_names=lambda task: ("accuracy", "auc", "precision", "recall"),
            main_metric="auc",
            # threshold-free, robust to imbalanced classes
            default_monitor="val_auc",
            baseline_metric="auc",
        ),
        head=lambda task, info: 1,
        loss=keras_objects.sigmoid_loss,
        metrics=keras_objects.binary_metrics,
        target_problem=checks.binary_problem,
        outputs=outputs.BINARY,
        targets="class_ids",
        learns_names=True,
        num_classes=lambda info: 2,
    ),
    "multilabel": TaskSpec(
        reports=Reports(
            metric_names=lambda task: ("binary_accuracy", "auc", "f1_micro", "f1_macro"),
            main_metric="f1_macro",
            default_monitor="val_loss",
            baseline_metric="f1_macro",
        ),
        head=_flattened_targets,
        loss=keras_objects.sigmoid_loss,
        metrics=keras_objects.multilabel_metrics,
        target_problem=checks.multilabel_problem,
        outputs=outputs.LABELS,
        targets="multi_hot",
    ),
    "regression": TaskSpec(
        reports=Reports(
            metric_names=lambda task: ("mae", "rmse", "r2"),
            main_metric="mae",
            default_monitor="val_loss",
            baseline_metric="r2",
        ),
        head=_flattened_targets,
        loss=keras_objects.regression_loss,
        metrics=keras_objects.regression_metrics,
        target_problem=checks.regression_problem,
        outputs=outputs.VALUES,
        targets="values",
        standardizes_targets=True,
    ),
}


def spec_of(task: TaskConfig) -> TaskSpec:
    return SPECS[task.name]


def outputs_of(name: str) -> outputs.Outputs:
    """What the outputs of task `name` mean (a signature.json's `task`, an ensemble's)."""
    return SPECS[name].outputs


def has_positive_class(task: TaskConfig) -> bool:
    """Its probability is of one class of two (`task.positive_class`): auc, precision and
    recall are about that class."""
    return spec_of(task).outputs.positive_class


def main_metric_named(name: str | None) -> str:
    """The main metric of task `name` (the default task's for a config naming none or one this
    version does not know: a sweep's report still reads)."""
    return SPECS.get(name or DEFAULT_TASK, SPECS[DEFAULT_TASK]).reports.main_metric


# --- names: what a run reports and may monitor --------------------------------------------------
def metric_names(task: TaskConfig, *, extra: bool = True) -> tuple[str, ...]:
    """The task's metrics as `fit` logs them (without `loss`; validation adds `val_`), then
    its extra `task.metrics` (unless `extra` is False)."""
    extras = tuple(extra_metric_name(node) for node in task.metrics) if extra else ()
    return (*spec_of(task).reports.metric_names(task), *extras)


def default_monitor(task: TaskConfig) -> str:
    """What checkpoints and early stopping watch with `monitor: auto`: the validation loss, but
    for binary tasks the validation AUC (threshold-free, robust to imbalanced classes)."""
    return spec_of(task).reports.default_monitor


def summary_names(task: TaskConfig) -> tuple[str, ...]:
    """The numbers summary.json holds for this task by the names sweeps and `compare` use
    (`rundir.summary_value`): the final metrics, the test split's as `test_X`, throughput."""
    test = tuple(f"test_{name}" for name in ("loss", *metric_names(task)))
    return (*monitors(task), *test, "examples_per_sec", "wall_time_s")


def main_metric(task: TaskConfig) -> str:
    """The metric curves.png plots beside the loss."""
    return spec_of(task).reports.main_metric


def monitors(task: TaskConfig) -> tuple[str, ...]:
    """Every name a checkpoint or early-stopping monitor may take for this task."""
    names = ("loss", *metric_names(task))
    return (*names, *(f"val_{name}" for name in names))


# Metrics where bigger is better; the others (loss, mae, rmse) improve downwards.
_HIGHER_IS_BETTER = frozenset(
    {"accuracy", "binary_accuracy", "auc", "precision", "recall", "f1_micro", "f1_macro", "r2"}
)


# Words in a metric's name that say bigger is better (an extra metric's too: auc_pr, f1_score,
# mean_io_u, r2_score, ...); any other name improves downwards (losses, errors).
_HIGHER_IS_BETTER_WORDS = ("accuracy", "auc", "precision", "recall", "f1", "io_u", "iou", "r2")


def monitor_mode(monitor: str) -> str:
    """ "max" or "min" for a monitored name (val_auc: max, val_mae: min), decided from the name:
    Keras' "auto" reads it from the compiled metric objects, which the custom loop never
    builds, and guesses wrong for names it does not know."""
    base = monitor.removeprefix("val_")
    words = base.split("_")
    higher = base in _HIGHER_IS_BETTER or any(
        word in words or base.endswith(word) for word in _HIGHER_IS_BETTER_WORDS
    )
    return "max" if higher else "min"


def best_row(
    rows: Iterable[Mapping[str, float]], monitor: str, mode: str = "auto"
) -> Mapping[str, float] | None:
    """The epoch (a history row) with the best `monitor` value, the first of equals (as Keras'
    checkpoint keeps it); None when no epoch logged it."""
    mode = monitor_mode(monitor) if mode == "auto" else mode
    logged = [row for row in rows if row.get(monitor) is not None and math.isfinite(row[monitor])]
    if not logged:
        return None
    pick = max if mode == "max" else min
    return pick(logged, key=lambda row: row[monitor])


# --- the model's head, loss and metrics --------------------------------------------------------
def num_outputs(task: TaskConfig, info: DatasetInfo) -> int:
    """The width of the model's head."""
    return spec_of(task).head(task, info)


def loss(task: TaskConfig, *, grants: Grants = NO_GRANTS):
    """The task's loss (from logits where it has a choice), mean over each example's outputs;
    `task.loss` when it names a Keras loss class by `_target_` (it then sees the raw outputs:
    logits for the classification tasks)."""
    if task.loss is not None and not isinstance(task.loss, str):
        return instantiate_target(task.loss, key="task.loss", grants=grants)
    return spec_of(task).loss(task)


def metrics(task: TaskConfig, *, grants: Grants = NO_GRANTS) -> list[Any]:
    """Fresh metric objects under the names `metric_names` lists, in that order: the task's
    own, then `task.metrics` (which see the model's raw outputs, logits for classification)."""
    extras = [
        instantiate_target(
            node, key=f"task.metrics.{index}", grants=grants, name=extra_metric_name(node)
        )
        for index, node in enumerate(task.metrics)
    ]
    return [*spec_of(task).metrics(task), *extras]


# --- the dataset's targets against the task ------------------------------------------------------
def check_targets(task: TaskConfig, info: DatasetInfo, *, dataset: str) -> None:
    """Refuses targets the task cannot learn from, and class weights for classes the dataset
    does not have, before training.

    Raises:
      ConfigError: one line naming the dataset, the task and the offending value.
    """
    spec = spec_of(task)
    problem = checks.common_problem(task, info, learns_names=spec.learns_names)
    problem = problem or spec.target_problem(task, info)
    if problem:
        raise ConfigError(Problem("task", task.name, f"dataset {dataset} {problem}"))
    weights = getattr(task, "class_weight", None)
    if isinstance(weights, dict):
        num_classes = spec.num_classes(info)
        outside = [c for c in weights if c >= num_classes]
        if outside:
            raise ConfigError(
                Problem(
                    "task.class_weight",
                    weights,
                    f"class id {outside[0]} is outside [0, num_classes={num_classes}) of "
                    f"task={task.name} on dataset {dataset}",
                )
            )
