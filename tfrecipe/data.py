"""Datasets: builders that return train/validation/test splits, and the one helper that
batches and distributes them with the strategy (used by every loop)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path

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


def digits(*, validation_fraction: float, test_fraction: float, split_seed: int) -> Splits:
    """scikit-learn's bundled handwritten digits: 1,797 8x8 images in [0, 1], 10 classes."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images / 16.0).astype("float32")[..., np.newaxis]
    return from_arrays(
        images,
        bunch.target.astype("int32"),
        num_classes=10,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
        split_seed=split_seed,
    )


def synthetic(
    *,
    num_examples: int,
    shape: Sequence[int],
    num_classes: int,
    validation_fraction: float,
    test_fraction: float,
    split_seed: int,
) -> Splits:
    """Generated images or vectors: each class a random mean plus unit noise (learnable)."""
    if num_examples <= 0 or num_classes < 2 or not shape or min(shape) <= 0:
        raise ValueError(
            "synthetic data needs num_examples > 0, num_classes >= 2 and a non-empty positive "
            f"shape, received num_examples={num_examples}, num_classes={num_classes}, "
            f"shape={list(shape)}"
        )
    _check_fits_in_memory(num_examples, shape)
    rng = np.random.default_rng(split_seed)
    means = rng.normal(0.0, 1.0, size=(num_classes, *shape)).astype("float32")
    labels = (np.arange(num_examples) % num_classes).astype("int32")
    rng.shuffle(labels)
    # The noise is drawn in chunks, in place (the same numbers as one draw): float32 arrays of
    # the data's size only, no float64 one twice as big.
    features = np.empty((num_examples, *shape), dtype="float32")
    for start in range(0, num_examples, _CHUNK):
        chunk = slice(start, start + _CHUNK)
        features[chunk] = rng.normal(0.0, 1.0, size=features[chunk].shape)
        features[chunk] += means[labels[chunk]]
    return from_arrays(
        features,
        labels,
        num_classes=num_classes,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
        split_seed=split_seed,
    )


_CHUNK = 1024  # examples of noise drawn at once
# Peak memory of synthetic data over the features' size: the features, their per-split copies
# and the tensors made from those (measured 3.46: 8,000 and 16,000 64x64x3 examples, peak RSS
# growth / feature bytes).
_SYNTHETIC_PEAK_FACTOR = 3.5


def synthetic_bytes(*, num_examples: int, shape: Sequence[int]) -> int:
    """The size of synthetic data's float32 features (the labels are negligible)."""
    return num_examples * math.prod(shape) * np.dtype("float32").itemsize


def available_memory() -> int | None:
    """Bytes this process can still allocate: the kernel's MemAvailable, or less when a cgroup
    (a container, a SLURM job) limits it; None where neither can be read."""
    limits = []
    with contextlib.suppress(OSError, ValueError, StopIteration):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        line = next(line for line in meminfo if line.startswith("MemAvailable:"))
        limits.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            limits.append(int(limit) - int((cgroup / "memory.current").read_text()))
    return min(limits) if limits else None


def _check_fits_in_memory(num_examples: int, shape: Sequence[int]) -> None:
    """Refuses synthetic data whose generation would not fit in memory, before allocating."""
    size = synthetic_bytes(num_examples=num_examples, shape=shape)
    needed, available = int(size * _SYNTHETIC_PEAK_FACTOR), available_memory()
    if available is not None and needed > available:
        raise ValueError(
            f"dataset.num_examples={num_examples} of dataset.shape={list(shape)}: the data take "
            f"{_human(size)} as float32 and about {_human(needed)} while they are made and "
            f"split, but {_human(available)} of memory is available; lower "
            "dataset.num_examples or dataset.shape"
        )


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.3g} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def distribute(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    *,
    global_batch_size: int,
    drop_remainder: bool = False,
    repeat: bool = False,
    auto_shard_policy: str = "auto",
    batch_map: Callable | None = None,
    skip: int = 0,
) -> tf.distribute.DistributedDataset:
    """Batches `dataset` by the global batch and splits each batch over the replicas.

    Every loop gets its data from here; shuffling, augmentation and normalization happen before
    (`tfrecipe.pipeline.prepare`). The replicas of one step together see one global batch,
    exactly as a single replica would, and the distributed dataset's cardinality counts global
    steps (which `Model.fit` relies on; `distribute_datasets_from_function` would count
    per-replica batches). `repeat` makes the data endless, for loops that count steps per epoch
    themselves. `batch_map` transforms each global batch (normalization, vectorized).

    On several workers TensorFlow shards the input by `auto_shard_policy` (docs/data.md):
    "file" gives each worker its own files (needs at least as many files as workers), "data"
    has every worker read everything and keep every N-th element, "auto" tries files and falls
    back to data, "off" gives every worker all the data.
    `skip` global batches are dropped from the start of the (endless) stream: a run restored at
    step N continues where the interrupted one stopped (the order is seeded, so the same).
    That order is the dataset's first iteration: every further `iter()` reshuffles (the seeded
    shuffle's generator belongs to the dataset), so loops train on the first one and never open
    another to peek (`tfrecipe.keras_fixes.fix_fit_under_strategy` keeps `fit` from it).
    """
    dataset = dataset.batch(global_batch_size, drop_remainder=drop_remainder)
    if batch_map is not None:
        dataset = dataset.map(batch_map, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if repeat:
        dataset = dataset.repeat()
    if skip:
        # Global batches, before the strategy splits them: every worker skips the same ones.
        dataset = dataset.skip(skip)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = _AUTO_SHARD[auto_shard_policy]
    dataset = dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
    if not repeat and isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return dataset  # the coordinator evaluates inline, on the plain batched dataset
    return strategy.experimental_distribute_dataset(dataset)


_AUTO_SHARD = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}
