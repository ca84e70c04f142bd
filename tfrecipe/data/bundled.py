"""Datasets that need no download: scikit-learn's bundled digits, breast cancer, diabetes and
wine sets, and generated data (with targets for every task)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tfrecipe.config.targets import config_target
from tfrecipe.data.splits import Holdout, Splits, TargetKind, from_arrays, standardize_in_model


@config_target
def digits(
    *,
    validation_fraction: float,
    test_fraction: float,
    split_seed: int,
    classes: Sequence[int] | None = None,
) -> Splits:
    """scikit-learn's bundled handwritten digits: 1,797 8x8 images in [0, 1], 10 classes.

    Args:
      classes: only these digits, relabelled 0..k-1 in the order given (e.g. [5, 6, 7, 8, 9]:
        5 becomes class 0), for a pretrain-on-some, fine-tune-on-others recipe; None: all ten.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images / 16.0).astype("float32")[..., np.newaxis]
    labels = bunch.target.astype("int32")
    if classes is not None:
        images, labels = _only_digits(images, labels, _check_digit_classes(classes))
    return from_arrays(
        images,
        labels,
        num_classes=10 if classes is None else len(classes),
        holdout=Holdout(validation_fraction, test_fraction, split_seed),
    )


def _check_digit_classes(classes: Sequence[int]) -> list[int]:
    digits_ = list(classes)
    valid = all(isinstance(d, int) and 0 <= d <= 9 for d in digits_)
    if not valid or len(set(digits_)) != len(digits_) or len(digits_) < 2:
        raise ValueError(
            f"dataset.classes={digits_}: expected at least two distinct digits from 0 to 9 "
            "(e.g. [0,1,2,3,4]), or null for all ten"
        )
    return digits_


def _only_digits(
    images: np.ndarray, labels: np.ndarray, classes: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The examples of `classes`, each labelled by its digit's position in `classes`."""
    keep = np.isin(labels, classes)
    relabel = np.full(10, -1, dtype="int32")
    relabel[classes] = np.arange(len(classes), dtype="int32")
    return images[keep], relabel[labels[keep]]


def _tabular(
    features: np.ndarray,
    targets: np.ndarray,
    *,
    num_classes: int,
    target_kind: TargetKind,
    standardize: bool,
    holdout: Holdout,
    feature_names: tuple[str, ...] = (),
) -> Splits:
    """A bundled table's splits, each feature scaled inside the model with `standardize`."""
    return from_arrays(
        features.astype("float32"),
        targets,
        num_classes=num_classes,
        target_kind=target_kind,
        preprocessing=standardize_in_model if standardize else None,
        holdout=holdout,
        feature_names=feature_names,
    )


@config_target
def breast_cancer(
    *, standardize: bool, validation_fraction: float, test_fraction: float, split_seed: int
) -> Splits:
    """scikit-learn's Wisconsin breast cancer set: 569 examples, 30 features, 0/1 labels
    (1 = benign)."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return _tabular(
        bunch.data,
        bunch.target.astype("int32"),
        num_classes=2,
        target_kind="binary",
        standardize=standardize,
        holdout=Holdout(validation_fraction, test_fraction, split_seed),
        feature_names=tuple(bunch.feature_names),
    )


@config_target
def diabetes(
    *, standardize: bool, validation_fraction: float, test_fraction: float, split_seed: int
) -> Splits:
    """scikit-learn's diabetes set: 442 examples, 10 features, one float target (disease
    progression after a year, 25 to 346)."""
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes()
    return _tabular(
        bunch.data,
        bunch.target.astype("float32")[:, np.newaxis],
        num_classes=0,
        target_kind="float",
        standardize=standardize,
        holdout=Holdout(validation_fraction, test_fraction, split_seed),
        feature_names=tuple(bunch.feature_names),
    )


@config_target
def wine(
    *, standardize: bool, validation_fraction: float, test_fraction: float, split_seed: int
) -> Splits:
    """scikit-learn's wine set: 178 examples, 13 features, 3 classes."""
    from sklearn.datasets import load_wine

    bunch = load_wine()
    return _tabular(
        bunch.data,
        bunch.target.astype("int32"),
        num_classes=3,
        target_kind="classes",
        standardize=standardize,
        holdout=Holdout(validation_fraction, test_fraction, split_seed),
        feature_names=tuple(bunch.feature_names),
    )


SYNTHETIC_TARGETS = ("classes", "binary", "multi_hot", "regression")


@config_target
def synthetic(
    *,
    num_examples: int,
    shape: Sequence[int],
    num_classes: int,
    validation_fraction: float,
    test_fraction: float,
    split_seed: int,
    targets: str = "classes",
) -> Splits:
    """Generated images or vectors: each cluster a random mean plus unit noise (learnable).

    Args:
      num_classes: the number of clusters (and of classes, or of multi-hot labels).
      targets: classes (the cluster), binary (cluster in the first half), multi_hot (a fixed
        random label set per cluster, num_classes wide) or regression (one float, linear in
        the features).
    """
    _check_synthetic(num_examples, shape, num_classes=num_classes, targets=targets)
    features, labels = _draw_clusters(
        np.random.default_rng(split_seed), num_examples, shape, num_classes
    )
    split = functools.partial(
        from_arrays, holdout=Holdout(validation_fraction, test_fraction, split_seed)
    )
    if targets == "classes":  # the draws above stay as they were before other targets
        return split(features, labels, num_classes=num_classes)
    derived, kind, classes = _synthetic_targets(targets, labels, features, num_classes, split_seed)
    return split(features, derived, num_classes=classes, target_kind=kind)


def _check_synthetic(
    num_examples: int, shape: Sequence[int], *, num_classes: int, targets: str
) -> None:
    """Refuses an unknown target kind, empty or negative sizes, data that would not fit in
    memory and classes without examples, before anything is drawn."""
    if targets not in SYNTHETIC_TARGETS:
        raise ValueError(
            f"dataset.targets={targets}: expected one of {', '.join(SYNTHETIC_TARGETS)}"
        )
    if num_examples <= 0 or num_classes < 2 or not shape or min(shape) <= 0:
        raise ValueError(
            "synthetic data needs num_examples > 0, num_classes >= 2 and a non-empty positive "
            f"shape, received num_examples={num_examples}, num_classes={num_classes}, "
            f"shape={list(shape)}"
        )
    _check_fits_in_memory(num_examples, shape, num_classes=num_classes, targets=targets)
    _check_every_class_has_examples(num_examples, num_classes)


def _draw_clusters(
    rng: np.random.Generator, num_examples: int, shape: Sequence[int], num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """(features, cluster ids): a random mean per cluster, the ids balanced and shuffled, and
    each example its cluster's mean plus unit noise."""
    means = _normal_float32(rng, (num_classes, *shape))
    labels = (np.arange(num_examples) % num_classes).astype("int32")
    rng.shuffle(labels)
    # The noise is drawn in chunks, in place (the same numbers as one draw): float32 arrays of
    # the data's size only, no float64 one twice as big.
    features = np.empty((num_examples, *shape), dtype="float32")
    for start in range(0, num_examples, _CHUNK):
        chunk = slice(start, start + _CHUNK)
        features[chunk] = rng.normal(0.0, 1.0, size=features[chunk].shape)
        features[chunk] += means[labels[chunk]]
    return features, labels


def _synthetic_targets(
    targets: str, clusters: np.ndarray, features: np.ndarray, num_classes: int, seed: int
) -> tuple[np.ndarray, TargetKind, int]:
    """Targets other than the cluster id, from their own seeded stream: (targets, kind, classes)."""
    rng = np.random.default_rng([seed, 1])
    if targets == "binary":
        return (clusters < num_classes // 2).astype("int32"), "binary", 2
    if targets == "multi_hot":
        codes = np.empty((num_classes, num_classes), "float32")
        for start in range(0, num_classes, _CHUNK):  # the same draws as one, no float64 square
            codes[start : start + _CHUNK] = rng.random(codes[start : start + _CHUNK].shape) < 0.5
        codes[np.arange(num_classes), np.arange(num_classes)] = 1.0  # no label is never present
        return codes[clusters], "multi_hot", num_classes
    flat = features.reshape(len(features), -1)
    weights = rng.normal(0.0, 1.0, size=flat.shape[1]).astype("float32")
    return (flat @ weights / np.sqrt(flat.shape[1]))[:, np.newaxis], "float", 0


_CHUNK = 1024  # examples of noise (class means, multi-hot codes) drawn at once


def _normal_float32(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """`rng.normal(0, 1, shape).astype("float32")` drawn _CHUNK rows at a time: the same numbers
    without the float64 array twice the result's size."""
    out = np.empty(shape, "float32")
    for start in range(0, shape[0], _CHUNK):
        out[start : start + _CHUNK] = rng.normal(0.0, 1.0, size=out[start : start + _CHUNK].shape)
    return out


# Peak memory of synthetic data over the features' size: the features, their per-split copies
# and the tensors made from those (measured 3.46: 8,000 and 16,000 64x64x3 examples, peak RSS
# growth / feature bytes).
_SYNTHETIC_PEAK_FACTOR = 3.5


def synthetic_bytes(*, num_examples: int, shape: Sequence[int]) -> int:
    """The size of synthetic data's float32 features."""
    return num_examples * math.prod(shape) * np.dtype("float32").itemsize


def synthetic_class_bytes(
    *, num_examples: int, shape: Sequence[int], num_classes: int, targets: str = "classes"
) -> int:
    """What synthetic data holds per class beside the features: one float32 mean of the data's
    shape per cluster, and for multi-hot targets a num_classes-wide code per cluster and per
    example (negligible for a few classes, not for a million). The examples' codes are split
    and made tensors as the features are: their peak is `_SYNTHETIC_PEAK_FACTOR` times their
    size (measured 2026-11-29 on a 2-core Intel Xeon: 6,000 examples of 3,000 labels peaked at
    266 MB, 3.2x the codes' 72 MB beside the 36 MB square; counted once, they were
    under-estimated 2.1x and 15,000 labels were killed by the kernel)."""
    size = num_classes * math.prod(shape)
    # NumPy draws float64: a chunk of means (or of codes) is twice its float32 size meanwhile.
    drawn = min(num_classes, _CHUNK) * math.prod(shape) * 2
    if targets == "multi_hot":
        size += num_classes * num_classes
        size += math.ceil(_SYNTHETIC_PEAK_FACTOR * num_examples * num_classes)
        drawn = max(drawn, min(num_classes, _CHUNK) * num_classes * 2)
    return (size + drawn) * np.dtype("float32").itemsize


def available_memory(
    *, cgroup_root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")
) -> int | None:
    """Bytes this process can still allocate: the kernel's MemAvailable, or less when a cgroup
    (a container, a SLURM job, systemd) limits it, v1 or v2, at its own level or above; None
    where none of these can be read.

    Args:
      cgroup_root: where the cgroup file systems are mounted (a test passes a fake tree).
      proc: where /proc is (`self/cgroup` names this process's cgroups, `meminfo` the kernel's).
    """
    limits = []
    with contextlib.suppress(OSError, ValueError, StopIteration):
        meminfo = (proc / "meminfo").read_text().splitlines()
        line = next(line for line in meminfo if line.startswith("MemAvailable:"))
        limits.append(int(line.split()[1]) * 1024)
    for version, path in _own_cgroups(proc):
        if version == 2:
            limits += _cgroup_room(cgroup_root, path, "memory.max", "memory.current")
        else:
            limits += _cgroup_room(
                cgroup_root / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes"
            )
    return min(limits) if limits else None


# A cgroup v1 memory limit at or above this is "unlimited" (the kernel writes a page-rounded
# LONG_MAX).
_UNLIMITED = 1 << 60


def _own_cgroups(proc: Path) -> list[tuple[int, str]]:
    """(version, path) of this process's memory cgroups: `0::/path` (v2) and `N:...memory...:/path`
    (v1); the root's when /proc/self/cgroup cannot be read."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return [(2, "/"), (1, "/")]
    found = []
    for line in lines:
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if number == "0" and controllers == "":
            found.append((2, path or "/"))
        elif "memory" in controllers.split(","):
            found.append((1, path or "/"))
    return found


def _cgroup_room(root: Path, path: str, limit_file: str, usage_file: str) -> list[int]:
    """limit - usage of the cgroup at `path` under `root` and of every cgroup above it (a limit
    anywhere on the way holds); a container sees its own cgroup as the root, so `path` may not
    exist there: then the root's own files count."""
    folder = root / path.strip("/")
    if not folder.is_dir():
        folder = root
    room = []
    while True:
        with contextlib.suppress(OSError, ValueError):
            limit = (folder / limit_file).read_text().strip()
            if limit != "max" and int(limit) < _UNLIMITED:
                used = int((folder / usage_file).read_text())
                room.append(max(int(limit) - used, 0))
        if folder == root or root not in folder.parents:
            return room
        folder = folder.parent


def _check_fits_in_memory(
    num_examples: int, shape: Sequence[int], *, num_classes: int, targets: str
) -> None:
    """Refuses synthetic data whose generation would not fit in memory, before allocating."""
    size = synthetic_bytes(num_examples=num_examples, shape=shape)
    per_class = synthetic_class_bytes(
        num_examples=num_examples, shape=shape, num_classes=num_classes, targets=targets
    )
    needed, available = int(size * _SYNTHETIC_PEAK_FACTOR) + per_class, available_memory()
    if available is None or needed <= available:
        return
    if per_class > size:  # the classes, not the examples, are what does not fit
        raise ValueError(
            f"dataset.num_classes={num_classes}: {targets} data of dataset.shape={list(shape)} "
            f"with that many classes take about {human_bytes(per_class)} (a mean per class"
            f"{', multi-hot codes' if targets == 'multi_hot' else ''}), but "
            f"{human_bytes(available)} of memory is available; lower dataset.num_classes"
        )
    raise ValueError(
        f"dataset.num_examples={num_examples} of dataset.shape={list(shape)}: the data take "
        f"{human_bytes(size)} as float32 and about {human_bytes(needed)} while they are made and "
        f"split, but {human_bytes(available)} of memory is available; lower "
        "dataset.num_examples or dataset.shape"
    )


def _check_every_class_has_examples(num_examples: int, num_classes: int) -> None:
    """Example i is of class i % num_classes: more classes than examples leave classes with none
    (and a head of that many outputs, which a typo in the billions cannot fit)."""
    if num_classes > num_examples:
        raise ValueError(
            f"dataset.num_classes={num_classes}: more classes than dataset.num_examples="
            f"{num_examples}, so some classes would have no example; lower dataset.num_classes "
            "or raise dataset.num_examples"
        )


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.3g} {unit}"
        size /= 1000
    raise AssertionError("unreachable")
