"""`task.positive_class`: which of a binary dataset's two classes is 1, the class the model's
logit, `auc`, `precision` and `recall` are about.

Without it class 1 is the second name in sorted order (`churn`/`stay`: `stay`), or the label 1.
With it the other class's examples are relabelled: the split is the same (drawn before), the
class names swap, and every reader of the splits (training, `evaluate`, the sidecar evaluator,
`export`, `baseline`) sees the same orientation because the factory applies it when it loads
the dataset.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tfrecipe.errors import ConfigError, Problem
from tfrecipe.tasks.config import TaskConfig
from tfrecipe.tasks.spec import has_positive_class

if TYPE_CHECKING:
    from tfrecipe.data.splits import DatasetInfo, Splits

# The names of numeric 0/1 labels.
_IDS = ("0", "1")


def class_names(info: DatasetInfo) -> tuple[str, ...]:
    """A binary dataset's two class names by id (its labels' names, else "0" and "1")."""
    return info.class_names if len(info.class_names) == 2 else _IDS


def positive_class(task: TaskConfig, info: DatasetInfo) -> str | None:
    """The name of class 1 of a binary task (None for other tasks)."""
    return class_names(info)[1] if has_positive_class(task) else None


def orient(task: TaskConfig, splits: Splits, *, dataset: str) -> Splits:
    """`splits` with `task.positive_class` as class 1 (as they are when it is null or already so).

    Raises:
      ConfigError: the class is not one of the dataset's two, named with the ones it has.
    """
    wanted = getattr(task, "positive_class", None)
    if wanted is None:
        return splits
    names = class_names(splits.info)
    if str(wanted) not in names or splits.info.num_classes != 2:
        raise ConfigError(
            Problem(
                "task.positive_class",
                wanted,
                f"not a class of dataset {dataset}; its classes are {', '.join(names)}",
            )
        )
    return splits if names.index(str(wanted)) == 1 else _swapped(splits, names)


def _swapped(splits: Splits, names: tuple[str, ...]) -> Splits:
    """Class 0 becomes 1 and 1 becomes 0, in every split and in the dataset's description."""

    from tfrecipe.graph import plain

    def swap(dataset):
        return None if dataset is None else dataset.map(plain(lambda x, y: (x, 1 - y)))

    info = dataclasses.replace(
        splits.info,
        class_names=(names[1], names[0]),
        targets=None if splits.info.targets is None else 1 - splits.info.targets,
    )
    for_worker = splits.for_worker
    return dataclasses.replace(
        splits,
        train=swap(splits.train),
        validation=swap(splits.validation),
        test=swap(splits.test),
        info=info,
        for_worker=None
        if for_worker is None
        else lambda index, count: _swapped(for_worker(index, count), names),
    )
