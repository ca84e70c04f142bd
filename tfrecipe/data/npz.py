"""The user's NumPy arrays: `dataset=npz` reads `.npz` (or `.npy`-in-zip) files of inputs and
integer labels, held in memory (data that fit in memory; use TFRecord files for more)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from tfrecipe.config.targets import config_target
from tfrecipe.data.splits import DatasetInfo, Splits, split_indices
from tfrecipe.data.values import check_finite_array
from tfrecipe.reading import check_npz, open_file


@config_target
def load(
    *,
    path: str,
    x_key: str = "x",
    y_key: str = "y",
    validation_path: str | None = None,
    test_path: str | None = None,
    num_classes: int | None = None,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.0,
    split_seed: int = 0,
) -> Splits:
    """Reads arrays `x_key` (inputs, first axis = examples) and `y_key` (int labels).

    Args:
      path: the training file; its examples are split by the fractions below.
      x_key, y_key: the array names inside each file.
      validation_path, test_path: separate files for those splits; when given, the
        corresponding fraction of `path` is not held out (the file is that split).
      num_classes: labels must lie in [0, num_classes); None: the largest label + 1.
      validation_fraction, test_fraction, split_seed: a seeded stratified split of `path`.

    Raises:
      ValueError: a file is missing or unreadable, lacks a key, or its arrays do not fit.
    """
    x, y = _read(path, x_key, y_key)
    files = {"validation": validation_path, "test": test_path}
    extra = {split: _read(file, x_key, y_key) if file else None for split, file in files.items()}
    held_out = [(files[split], arrays) for split, arrays in extra.items() if arrays is not None]
    _check_shapes(path, x, x_key, held_out)
    labelled = [(path, y), *((file, arrays[1]) for file, arrays in held_out)]
    num_classes = num_classes or int(max(labels.max() for _, labels in labelled)) + 1
    for file, labels in labelled:
        _check_labels(file, y_key, labels, num_classes)
    # A split read from its own file is that split: no fraction of `path` is held out for it.
    validation_fraction = 0.0 if validation_path else validation_fraction
    test_fraction = 0.0 if test_path else test_fraction
    indices = split_indices(y, validation_fraction, test_fraction, split_seed)
    datasets = _split_arrays(x, y, indices, extra)
    return _splits(datasets, input_shape=tuple(x.shape[1:]), num_classes=num_classes)


def _check_shapes(
    path: str, x: np.ndarray, x_key: str, held_out: list[tuple[str, tuple[np.ndarray, np.ndarray]]]
) -> None:
    """Refuses a validation or test file whose examples differ in shape from `path`'s."""
    for file, arrays in held_out:
        if arrays[0].shape[1:] != x.shape[1:]:
            raise ValueError(
                f"{file}: {x_key} has examples of shape {list(arrays[0].shape[1:])}, "
                f"{path} of {list(x.shape[1:])}"
            )


def _split_arrays(
    x: np.ndarray,
    y: np.ndarray,
    indices: tuple[np.ndarray, np.ndarray, np.ndarray],
    extra: dict[str, tuple[np.ndarray, np.ndarray] | None],
) -> dict[str, tuple[np.ndarray, np.ndarray] | None]:
    """The train/validation/test arrays: a held-out split's own file, else its share of (x, y),
    else None."""
    train, validation, test = indices
    held_out = {"validation": validation, "test": test}
    return {
        "train": (x[train], y[train]),
        **{
            split: extra[split] or ((x[idx], y[idx]) if len(idx) else None)
            for split, idx in held_out.items()
        },
    }


def _splits(
    datasets: dict[str, tuple[np.ndarray, np.ndarray] | None],
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
) -> Splits:
    """In-memory `train`/`validation`/`test` arrays (the last two may be None) as `Splits`."""

    def size(split: str) -> int:
        return len(datasets[split][1]) if datasets[split] else 0

    info = DatasetInfo(
        input_shape=input_shape,
        num_classes=num_classes,
        num_train=size("train"),
        num_validation=size("validation"),
        num_test=size("test"),
    )
    return Splits(
        *(
            tf.data.Dataset.from_tensor_slices(arrays) if arrays else None
            for arrays in datasets.values()
        ),
        info,
    )


def _read(path: str, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    if not Path(path).exists():
        raise ValueError(f"{path}: no such file (path={path!r})")
    check_npz(path)  # a regular file whose arrays are measured before anything is inflated
    try:
        # No pickles: a data file must not be able to run code.
        with (
            open_file(path, what="an .npz file") as handle,
            np.load(handle, allow_pickle=False) as arrays,
        ):
            missing = [k for k in (x_key, y_key) if k not in arrays.files]
            if missing:
                raise ValueError(
                    f"{path}: has no array {', '.join(map(repr, missing))} (its arrays: "
                    f"{', '.join(arrays.files) or 'none'}); set dataset.x_key / dataset.y_key"
                )
            x, y = arrays[x_key], arrays[y_key]
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        raise ValueError(f"{path}: not a readable .npz file ({error})") from None
    except ValueError as error:
        if str(error).startswith(path):
            raise
        raise ValueError(f"{path}: cannot read its arrays ({error})") from None
    if x.ndim < 1 or y.ndim != 1 or len(x) != len(y) or len(y) == 0:
        raise ValueError(
            f"{path}: expected {x_key} of shape [N, ...] and {y_key} of shape [N] with N > 0, "
            f"received {x_key}{list(x.shape)} and {y_key}{list(y.shape)}"
        )
    if not np.issubdtype(x.dtype, np.number) or x.dtype.kind == "c":
        raise ValueError(f"{path}: {x_key} must hold real numbers, received dtype {x.dtype}")
    _check_label_type(path, y_key, y)
    # NaN, Inf or beyond float32 (Inf once converted): refused, as `tfrecipe predict` refuses them
    check_finite_array(path, x_key, x)
    x = x if x.dtype == np.uint8 else x.astype("float32")
    return x, y.astype("int32")


def _check_label_type(path: str, key: str, y: np.ndarray) -> None:
    """Integer labels that int32 holds: the cast would wrap 2**32 + 1 to class 1."""
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{path}: {key} must hold integer class labels, received {y.dtype}")
    wide = np.flatnonzero((y < 0) | (y > np.iinfo(np.int32).max))
    if wide.size:
        raise ValueError(
            f"{path}: label {key}[{wide[0]}]={int(y[wide[0]])} is out of range; labels are "
            "class ids 0, 1, ... (num_classes at most 2**31 - 1)"
        )


def _check_labels(path: str, key: str, labels: np.ndarray, num_classes: int) -> None:
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        first = int(np.argmax(bad))
        raise ValueError(
            f"{path}: label {key}[{first}]={int(labels[first])} is out of range; labels must be "
            f"in [0, num_classes={num_classes})"
        )
