"""Whether a dataset's targets fit a task, per task: one line saying what is wrong, or None.
NumPy only (run before any training)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tfrecipe.data.splits import DatasetInfo
    from tfrecipe.tasks.config import TaskConfig


def common_problem(task: TaskConfig, info: DatasetInfo, *, learns_names: bool) -> str | None:
    """What no task learns from: string labels (unless the task learns class names), non-finite
    targets."""
    targets = info.targets
    if info.class_names and not learns_names:  # ids of string labels
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
    return None


def classification_problem(task: TaskConfig, info: DatasetInfo) -> str | None:
    kind = info.target_kind
    if kind not in ("classes", "binary"):
        return f"has {kind} targets; classification needs integer class ids (try task=...)"
    return (
        _untrained_problem(info)
        or _class_ids_problem(info.targets, info.num_classes)
        or _numbering_problem(info)
    )


def binary_problem(task: TaskConfig, info: DatasetInfo) -> str | None:
    kind = info.target_kind
    if kind not in ("classes", "binary") or info.num_classes != 2:
        return f"has {kind} targets with num_classes={info.num_classes}; binary needs 0/1 labels"
    return _untrained_problem(info) or _class_ids_problem(info.targets, 2)


def multilabel_problem(task: TaskConfig, info: DatasetInfo) -> str | None:
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


def regression_problem(task: TaskConfig, info: DatasetInfo) -> str | None:
    kind = info.target_kind
    if kind == "float" or kind == "classes":  # regression on class ids is a choice, allowed
        return None
    return f"has {kind} targets; regression needs numeric targets"


def _untrained_problem(info: DatasetInfo) -> str | None:
    """A label only a validation or test file holds would be a class with no training rows: the
    model could never predict it, and its metrics would count it as always wrong."""
    if not info.untrained_labels:
        return None
    more = len(info.untrained_labels) - 1
    return (
        f"has label {info.untrained_labels[0]}{f' and {more} more' if more else ''} only in a "
        "validation or test file, never in the training data: its class would have no training "
        "rows; add training rows of it, or remove those rows"
    )


def _numbering_problem(info: DatasetInfo) -> str | None:
    """Integer class ids that do not start at 0 (1..k, a score 3..9): the largest id + 1
    outputs would include classes no example has, listed by predict with made-up
    probabilities. Keras takes ids 0..k-1; names (strings) are numbered by tfrecipe."""
    smallest, targets = info.smallest_class_id, info.targets
    if smallest is None and targets is not None and targets.size and not info.class_names:
        smallest = int(targets.min()) if targets.dtype.kind in "iu" else None
    if not smallest or smallest < 0:
        return None
    largest = info.num_classes - 1
    empty = "class 0" if smallest == 1 else f"classes 0..{smallest - 1}"
    return (
        f"has class ids {smallest}..{largest}, none of them 0: the model would get "
        f"{info.num_classes} outputs, {smallest} of them for {empty} that no example has; "
        f"number the classes from 0 (subtract {smallest}: 0..{largest - smallest}), or use "
        "task=regression to predict the number"
    )


def _class_ids_problem(targets: np.ndarray | None, num_classes: int) -> str | None:
    if targets is None:
        return None
    if targets.dtype.kind not in "iub":
        return f"has {targets.dtype} labels; class ids must be integers"
    bad = targets[(targets < 0) | (targets >= num_classes)]
    if bad.size:
        return f"has class id {int(bad.reshape(-1)[0])} outside [0, num_classes={num_classes})"
    return None
