"""What a task fits on the training split: class weights (`task.class_weight`, added to each
example by the input pipeline, averaged alike by every loop) and target standardization
(`task.standardize_targets`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from tfrecipe.errors import ConfigError
from tfrecipe.tasks.config import TaskConfig
from tfrecipe.tasks.spec import spec_of

if TYPE_CHECKING:
    import tensorflow as tf

    from tfrecipe.data.splits import DatasetInfo


def training_targets(train: tf.data.Dataset, *, chunks: bool = False) -> np.ndarray:
    """The training split's targets (labels only, read once, in large batches), for statistics
    every dataset can give: in-memory arrays, TFDS, files, streamed tables (`chunks`: elements
    are chunks of rows)."""
    from tfrecipe.graph import plain

    targets = train.map(plain(lambda *example: example[1]))
    targets = targets.rebatch(8192) if chunks else targets.batch(8192)
    batches = [batch.numpy() for batch in targets]
    return np.concatenate(batches) if batches else np.zeros((0,), "float32")


def class_weights(
    task: TaskConfig, train: tf.data.Dataset, info: DatasetInfo, *, chunks: bool = False
) -> np.ndarray | None:
    """The loss weight of each class id's examples in training (None: unweighted).

    `balanced` gives class c the weight n / (k x count_c) over the training split's n examples
    and k classes (scikit-learn's and Keras' rule); a `{class_id: weight}` mapping weighs the
    classes it names, the others 1.

    Raises:
      ConfigError: a balanced weight for a class the training split does not hold.
    """
    spec = getattr(task, "class_weight", None)
    if spec is None:
        return None
    num_classes = spec_of(task).num_classes(info)
    if spec != "balanced":
        weights = np.ones(num_classes, "float32")
        weights[list(spec)] = list(spec.values())  # ids checked in check_targets
        return weights
    ids = training_targets(train, chunks=chunks).reshape(-1).astype("int64")
    counts = np.bincount(ids, minlength=num_classes)
    if not counts.all():
        absent = int(np.flatnonzero(counts == 0)[0])
        raise ConfigError(
            f"task.class_weight=balanced: class {absent} has no example in the training split "
            f"(n / (k x count) is undefined); give the weights as {{class_id: weight}}"
        )
    return (len(ids) / (num_classes * counts)).astype("float32")


def weigh_examples(weights: np.ndarray, *, after: Callable[[Any, Any], tuple[Any, Any]]):
    """A batch map `(x, y) -> (x, y, w)` (`after` first): each example's class weight as its
    sample weight, the form Keras' fit reads and the custom loops average with
    (`loops/objective.py`)."""
    import tensorflow as tf

    table = tf.constant(weights, tf.float32)

    def weigh(features, labels):
        features, labels = after(features, labels)
        ids = tf.reshape(tf.cast(labels, tf.int32), [-1])
        return features, labels, tf.gather(table, ids)

    return weigh


def target_scaling(
    task: TaskConfig, train: tf.data.Dataset, *, chunks: bool = False
) -> tuple[np.ndarray, np.ndarray] | None:
    """(mean, std) per output of the training split's targets with
    `task.standardize_targets` (a constant output keeps std 1), else None."""
    if not spec_of(task).standardizes_targets or not task.standardize_targets:
        return None
    targets = training_targets(train, chunks=chunks).astype("float64")
    targets = targets.reshape(len(targets), -1)
    mean, std = targets.mean(axis=0), targets.std(axis=0)
    return mean.astype("float32"), np.where(std > 0, std, 1.0).astype("float32")
