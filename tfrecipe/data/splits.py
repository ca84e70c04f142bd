"""Train/validation/test splits: what every dataset builder returns."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import tensorflow as tf

TargetKind = Literal["classes", "binary", "multi_hot", "float"]


@dataclasses.dataclass(frozen=True)
class Holdout:
    """The validation and test splits carved out of one set of examples: seeded fractions (a
    dataset's `validation_fraction`, `test_fraction` and `split_seed`)."""

    validation_fraction: float
    test_fraction: float
    seed: int


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds. Its targets: `target_kind` (integer class ids, 0/1 labels, multi-hot
    vectors or floats) of shape `target_shape` per example; `targets` all of them when they are
    in memory, so the task can check their values before training (tfrecipe/tasks/)."""

    input_shape: tuple[int, ...]
    num_classes: int
    num_train: int
    num_validation: int
    num_test: int
    target_kind: TargetKind = "classes"
    target_shape: tuple[int, ...] = ()
    targets: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)
    # String labels' names, by class id (sorted): the targets are ids, but only a class task
    # can learn them (a regression on them is refused).
    class_names: tuple[str, ...] = ()
    # The names of a feature vector's columns (a bundled table's), for reading new rows by name.
    feature_names: tuple[str, ...] = ()
    # Class labels that only a validation or test file holds (`'label' (first at FILE:LINE)`):
    # a class task refuses them, as their class would have no training rows.
    untrained_labels: tuple[str, ...] = ()
    # The smallest integer class id of the examples, where `targets` does not hold
    # them (a streamed table's, from its statistics); None: not known, or not integer ids.
    smallest_class_id: int | None = None


@dataclasses.dataclass(frozen=True)
class Splits:
    """Unbatched `(features, label)` datasets; validation and test may be None."""

    train: tf.data.Dataset
    validation: tf.data.Dataset | None
    test: tf.data.Dataset | None
    info: DatasetInfo
    # Encoders that belong in the model (so the exported model takes raw rows): called with the
    # training split inside the strategy's scope, adapts its layers on it and returns the
    # model's `(inputs, encoded)` Keras tensors; the model builder then sees the encoded shape.
    preprocessing: Callable[[tf.data.Dataset], tuple[Any, Any]] | None = None
    # Streamed tables (tfrecipe/data/tabular.py): elements are chunks of rows of any length,
    # not single examples (the pipeline shuffles and rebatches them vectorized), read by Python
    # (a parameter-server worker cannot run them: the coordinator feeds their batches).
    batched: bool = False
    # The splits worker `index` of `count` reads, for datasets that shard themselves (each
    # worker reads only its share) instead of through tf.data's auto-sharding.
    for_worker: Callable[[int, int], Splits] | None = None


def batch(dataset: tf.data.Dataset, size: int, *, chunks: bool = False) -> tf.data.Dataset:
    """A split in batches of `size` examples: batched, or (`chunks`: a streamed table's chunks
    of rows, `Splits.batched`) rebatched."""
    return dataset.rebatch(size) if chunks else dataset.batch(size)


def split_indices(
    labels: np.ndarray,
    validation_fraction: float,
    test_fraction: float,
    seed: int,
    *,
    stratify: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A seeded train/validation/test split of example indices, stratified by `labels` (class
    ids) unless `stratify` is False (float or multi-hot targets)."""
    for name, value in (
        ("validation_fraction", validation_fraction),
        ("test_fraction", test_fraction),
    ):
        if not 0 <= value < 1:
            raise ValueError(f"{name} must be in [0, 1), received {name}={value}")
    if validation_fraction + test_fraction >= 1:
        raise ValueError(
            "validation_fraction + test_fraction must leave training data, received "
            f"{validation_fraction} + {test_fraction}"
        )
    held_out = validation_fraction + test_fraction
    if held_out == 0:
        indices = np.arange(len(labels))
        return indices, indices[:0], indices[:0]
    try:
        return _split(labels, validation_fraction, test_fraction, seed, stratify=stratify)
    except ValueError as error:  # scikit-learn's words: "The test_size = 1 should be ..."
        strata = ""
        if stratify:
            counts = np.unique(labels, return_counts=True)[1]
            strata = (
                f" stratified by {len(counts)} classes (the smallest: {min(counts)} example(s))"
            )
        raise ValueError(
            f"validation_fraction={validation_fraction}, test_fraction={test_fraction}: cannot "
            f"hold these out of {len(labels)} examples{strata} ({error}); "
            "change the fractions (0: none held out) or add examples"
        ) from None


def _split(
    labels: np.ndarray,
    validation_fraction: float,
    test_fraction: float,
    seed: int,
    *,
    stratify: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    indices = np.arange(len(labels))
    held_out = validation_fraction + test_fraction
    strata = labels if stratify else None
    train, rest = train_test_split(indices, test_size=held_out, random_state=seed, stratify=strata)
    if validation_fraction == 0 or test_fraction == 0:
        empty = rest[:0]
        return (train, rest, empty) if test_fraction == 0 else (train, empty, rest)
    validation, test = train_test_split(
        rest,
        test_size=test_fraction / held_out,
        random_state=seed,
        stratify=labels[rest] if stratify else None,
    )
    return train, validation, test


def from_arrays(
    features: np.ndarray | Mapping[str, np.ndarray],
    labels: np.ndarray,
    *,
    num_classes: int,
    holdout: Holdout,
    target_kind: TargetKind = "classes",
    preprocessing: Callable[[tf.data.Dataset], tuple[Any, Any]] | None = None,
    class_names: tuple[str, ...] = (),
    feature_names: tuple[str, ...] = (),
) -> Splits:
    """Splits in-memory arrays into train/validation/test datasets (stratified by class for
    class and 0/1 targets).

    Args:
      features: one array [N, ...], or named columns of N values each (a table's raw columns,
        which `preprocessing` encodes inside the model).
      holdout: the validation and test splits' fractions and seed.
      preprocessing: the encoders the model starts with (`Splits.preprocessing`);
        `standardize_in_model` scales each feature to zero mean and unit variance with the
        training split's statistics, inside the model: the exported model takes unscaled rows.
    """
    stratify = target_kind in ("classes", "binary")
    indices = split_indices(
        labels, holdout.validation_fraction, holdout.test_fraction, holdout.seed, stratify=stratify
    )
    info = DatasetInfo(
        **_shapes_and_sizes(features, labels, indices),
        num_classes=num_classes,
        target_kind=target_kind,
        class_names=class_names,
        feature_names=feature_names,
    )
    train, validation, test = (_dataset(features, labels, idx) for idx in indices)
    return Splits(train, validation, test, info, preprocessing=preprocessing)


def _shapes_and_sizes(
    features: np.ndarray | Mapping[str, np.ndarray],
    labels: np.ndarray,
    indices: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> dict[str, Any]:
    """The `DatasetInfo` fields that the arrays and the split indices decide."""
    train, validation, test = indices
    columns = isinstance(features, Mapping)
    return {
        # a table's raw columns: the model's encoders decide the width its body sees
        "input_shape": (len(features),) if columns else tuple(features.shape[1:]),
        "num_train": len(train),
        "num_validation": len(validation),
        "num_test": len(test),
        "target_shape": tuple(labels.shape[1:]),
        "targets": labels,
    }


def _dataset(
    features: np.ndarray | Mapping[str, np.ndarray], labels: np.ndarray, idx: np.ndarray
) -> tf.data.Dataset | None:
    """The examples at `idx` as a dataset of (features, label); None when there are none."""
    if len(idx) == 0:
        return None
    rows = (
        {k: v[idx] for k, v in features.items()} if isinstance(features, Mapping) else features[idx]
    )
    return tf.data.Dataset.from_tensor_slices((rows, labels[idx]))


def standardize_in_model(train: tf.data.Dataset) -> tuple[Any, Any]:
    """`Splits.preprocessing` that standardizes each feature with the training split's mean and
    variance: a Normalization layer, the model's first, so it takes unscaled inputs."""
    import keras

    features = np.concatenate([x for x, _ in train.batch(65536).as_numpy_iterator()])
    inputs = keras.Input(shape=features.shape[1:], dtype="float32", name="features")
    normalize = keras.layers.Normalization(
        axis=-1, mean=features.mean(axis=0), variance=features.var(axis=0), dtype="float32"
    )
    return inputs, normalize(inputs)
