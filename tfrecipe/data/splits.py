"""Train/validation/test splits: what every dataset builder returns."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    input_shape: tuple[int, ...]
    num_classes: int
    num_train: int
    num_validation: int
    num_test: int


@dataclasses.dataclass(frozen=True)
class Splits:
    """Unbatched `(features, label)` datasets; validation and test may be None."""

    train: tf.data.Dataset
    validation: tf.data.Dataset | None
    test: tf.data.Dataset | None
    info: DatasetInfo


def split_indices(
    labels: np.ndarray, validation_fraction: float, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A stratified, seeded train/validation/test split of example indices."""
    from sklearn.model_selection import train_test_split

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
    indices = np.arange(len(labels))
    held_out = validation_fraction + test_fraction
    if held_out == 0:
        return indices, indices[:0], indices[:0]
    train, rest = train_test_split(indices, test_size=held_out, random_state=seed, stratify=labels)
    if validation_fraction == 0 or test_fraction == 0:
        empty = rest[:0]
        return (train, rest, empty) if test_fraction == 0 else (train, empty, rest)
    validation, test = train_test_split(
        rest, test_size=test_fraction / held_out, random_state=seed, stratify=labels[rest]
    )
    return train, validation, test


def from_arrays(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    num_classes: int,
    validation_fraction: float,
    test_fraction: float,
    split_seed: int,
) -> Splits:
    """Splits in-memory arrays into train/validation/test datasets."""
    train, validation, test = split_indices(labels, validation_fraction, test_fraction, split_seed)

    def make(idx: np.ndarray) -> tf.data.Dataset | None:
        if len(idx) == 0:
            return None
        return tf.data.Dataset.from_tensor_slices((features[idx], labels[idx]))

    info = DatasetInfo(
        input_shape=tuple(features.shape[1:]),
        num_classes=num_classes,
        num_train=len(train),
        num_validation=len(validation),
        num_test=len(test),
    )
    return Splits(make(train), make(validation), make(test), info)
