"""Tabular data from the user's CSV files (`dataset=csv`).

The files are parsed with Python's `csv` module, in memory, so that every problem names the
file, the line and the column. Features are yielded raw, as a dict of columns (float32 numbers,
strings for categorical columns); the model's first layers encode them (`encode_columns`:
numeric columns standardized, categorical ones one-hot), adapted on the training split only, so
the exported model takes raw rows.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tfrecipe.data.splits import Splits, TargetKind, from_arrays


@dataclasses.dataclass(frozen=True)
class _Table:
    """Every data row of the files as strings, with where each came from (`file:line`)."""

    columns: tuple[str, ...]
    rows: list[list[str]]
    where: list[str]


def csv(
    *,
    path: str,
    label: str | Sequence[str],
    features: Sequence[str] | None = None,
    categorical: Sequence[str] = (),
    na_values: Sequence[str] = (),
    delimiter: str = ",",
    header: bool = True,
    column_names: Sequence[str] | None = None,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    split_seed: int = 0,
) -> Splits:
    """Rows of CSV files as `({column: value}, target)` examples, split by seeded fractions.

    Args:
      path: a file or a glob (the files are read in sorted order and must share their columns).
      label: the target column; several 0/1 columns make a multi-hot target. A column of
        floats gives float targets, of integers class ids (0/1 only: binary), of strings
        class ids in the sorted order of the names (`DatasetInfo.class_names`).
      features: the input columns; None: every column but the label.
      categorical: input columns read as strings and one-hot encoded (the others are numbers).
      na_values: cells that mean "missing": a missing number becomes the training mean, a
        missing category the out-of-vocabulary one. Empty: a missing number is an error.
      header: the first row of each file names the columns; false: `column_names` does.

    Raises:
      ValueError: one line naming the file, line and column of the first bad cell, or the
        unknown column and the columns the file has.
    """
    table = _read(_files(path), delimiter=delimiter, header=header, column_names=column_names)
    labels = [label] if isinstance(label, str) else list(label)
    inputs = _input_columns(table, labels, features, categorical)
    numeric = [name for name in inputs if name not in set(categorical)]
    na = frozenset(na_values)
    columns = {name: _numbers(table, name, na) for name in numeric}
    columns |= {name: _strings(table, name) for name in categorical}
    targets, kind, num_classes, class_names = _targets(table, labels, na)
    encode = functools.partial(
        encode_columns, numeric=tuple(numeric), categorical=tuple(categorical), na_values=na
    )
    return from_arrays(
        columns,
        targets,
        num_classes=num_classes,
        target_kind=kind,
        class_names=class_names,
        preprocessing=encode,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
        split_seed=split_seed,
    )


# --- reading --------------------------------------------------------------------------------------
def _files(path: str) -> list[str]:
    files = sorted(glob.glob(str(Path(path).expanduser())))
    if not files:
        raise ValueError(f"path={path!r}: no file matches it")
    return files


def _read(
    files: list[str], *, delimiter: str, header: bool, column_names: Sequence[str] | None
) -> _Table:
    """The rows of every file, checked to have one value per column."""
    if not header and not column_names:
        raise ValueError("header=false needs column_names: the names of the files' columns")
    columns = None if header else tuple(column_names)
    rows, where = [], []
    for file in files:
        names, file_rows = _read_file(file, delimiter=delimiter, header=header)
        if columns is None:
            columns = names
        elif header and names != columns:
            raise ValueError(
                f"{file}:1: columns ({', '.join(names)}) differ from those of {files[0]} "
                f"({', '.join(columns)}); every file needs the same columns"
            )
        for at, values in file_rows:
            if len(values) != len(columns):
                raise ValueError(
                    f"{at}: expected {len(columns)} values ({', '.join(columns)}), found "
                    f"{len(values)}; every row needs one value per column"
                )
            rows.append(values)
            where.append(at)
    if not rows:
        raise ValueError(f"path={', '.join(files)}: no data rows")
    return _Table(columns, rows, where)


def _read_file(
    file: str, *, delimiter: str, header: bool
) -> tuple[tuple[str, ...], list[tuple[str, list[str]]]]:
    """A file's header (empty without one) and its non-blank rows with their `file:line`."""
    import csv as csvlib

    names: tuple[str, ...] = ()
    rows = []
    with open(file, newline="", encoding="utf-8") as handle:
        reader = csvlib.reader(handle, delimiter=delimiter)
        for values in reader:
            if not values:  # a blank line
                continue
            if header and not names:
                names = tuple(name.strip() for name in values)
                continue
            rows.append((f"{file}:{reader.line_num}", values))
    return names, rows


def _input_columns(
    table: _Table,
    labels: list[str],
    features: Sequence[str] | None,
    categorical: Sequence[str],
) -> list[str]:
    """The feature columns, every named column checked to exist."""
    for key, names in (
        ("label", labels),
        ("features", features or ()),
        ("categorical", categorical),
    ):
        for name in names:
            if name not in table.columns:
                raise ValueError(
                    f"{key}={name!r}: {table.where[0].rsplit(':', 1)[0]} has no such column; "
                    f"its columns are: {', '.join(table.columns)}"
                )
    if not labels:
        raise ValueError("label=[]: name the target column (or several 0/1 columns)")
    inputs = (
        list(features) if features is not None else [c for c in table.columns if c not in labels]
    )
    for key, names in (("features", inputs), ("categorical", categorical)):
        both = [name for name in names if name in labels]
        if both:
            raise ValueError(f"{key}: {both[0]!r} is the label; a column is a feature or the label")
    outside = [name for name in categorical if name not in inputs]
    if outside:
        raise ValueError(
            f"categorical={outside[0]!r}: not among the features ({', '.join(inputs)})"
        )
    if not inputs:
        raise ValueError("features=[]: the model needs at least one input column")
    return inputs


# --- parsing --------------------------------------------------------------------------------------
def _column(table: _Table, name: str) -> list[str]:
    index = table.columns.index(name)
    return [row[index] for row in table.rows]


def _numbers(table: _Table, name: str, na_values: frozenset[str]) -> np.ndarray:
    """A numeric column as float32; a missing value (one of `na_values`) becomes NaN."""
    values = np.empty(len(table.rows), dtype="float32")
    for i, cell in enumerate(_column(table, name)):
        values[i] = math.nan if cell in na_values else _number(cell, table.where[i], name)
    return values


def _number(cell: str, at: str, name: str) -> float:
    text = cell.strip()
    if not text:
        raise ValueError(
            f"{at}: column {name!r}: missing value; list its marker in dataset.na_values "
            "(e.g. ['']) to fill it with the training mean, or fill it in the file"
        )
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"{at}: column {name!r}: {cell!r} is not a number; list the column in "
            "dataset.categorical if it holds categories, or the marker in dataset.na_values"
        ) from None
    if not math.isfinite(value):
        raise ValueError(
            f"{at}: column {name!r}: {cell!r} is not a finite number; list it in "
            "dataset.na_values to treat it as missing"
        )
    return value


def _strings(table: _Table, name: str) -> np.ndarray:
    return np.array([cell.strip() for cell in _column(table, name)], dtype=object)


def _targets(
    table: _Table, labels: list[str], na_values: frozenset[str]
) -> tuple[np.ndarray, TargetKind, int, tuple[str, ...]]:
    """(targets, kind, num_classes, class names): see `csv`'s `label`."""
    if len(labels) > 1:
        columns = [_numbers(table, name, frozenset()) for name in labels]  # none missing
        for name, values in zip(labels, columns, strict=True):
            bad = np.flatnonzero(~np.isin(values, (0, 1)))
            if bad.size:
                raise ValueError(
                    f"{table.where[bad[0]]}: column {name!r}: {values[bad[0]]:g} is not 0 or 1; "
                    "several label columns make a multi-hot target of 0/1 values"
                )
        return np.stack(columns, axis=1).astype("float32"), "multi_hot", len(labels), ()
    name = labels[0]
    cells = [cell.strip() for cell in _column(table, name)]
    for i, cell in enumerate(cells):
        if not cell or cell in na_values:
            raise ValueError(f"{table.where[i]}: column {name!r}: missing label; remove the row")
    numbers = _as_numbers(cells)
    if numbers is None:  # string labels: class ids in the sorted order of the names
        names = tuple(sorted(set(cells)))
        ids = np.searchsorted(np.array(names, dtype=object), np.array(cells, dtype=object))
        kind: TargetKind = "binary" if len(names) == 2 else "classes"
        return ids.astype("int32"), kind, len(names), names
    if not np.all(numbers == np.round(numbers)):
        return numbers.astype("float32")[:, np.newaxis], "float", 0, ()
    ids = numbers.astype("int32")
    if set(np.unique(ids)) <= {0, 1}:
        return ids, "binary", 2, ()
    return ids, "classes", int(ids.max()) + 1, ()


def _as_numbers(cells: list[str]) -> np.ndarray | None:
    """The cells as float64 when every one is a finite number, else None (string labels)."""
    try:
        values = np.array([float(cell) for cell in cells], dtype="float64")
    except ValueError:
        return None
    return values if np.isfinite(values).all() else None


# --- in the model ---------------------------------------------------------------------------------
def encode_columns(
    train,
    *,
    numeric: tuple[str, ...],
    categorical: tuple[str, ...],
    na_values: frozenset[str],
):
    """The model's raw-row inputs and their encoding, adapted on the training split `train`:
    each numeric column standardized (a missing one, NaN, becomes 0: the training mean), each
    categorical one one-hot over the training split's categories plus one for any other.

    Returns:
      `(inputs, encoded)`: a dict of scalar `keras.Input`s named by column, and the
      `[batch, width]` float32 encoding.
    """
    import keras

    columns = _training_columns(train)
    inputs, parts = {}, []
    for name in numeric:
        inputs[name] = keras.Input(shape=(), dtype="float32", name=name)
        values = columns[name][~np.isnan(columns[name])]
        normalize = keras.layers.Normalization(
            axis=None, mean=float(values.mean()), variance=float(values.var()), dtype="float32"
        )
        x = normalize(inputs[name])
        if na_values:  # NaN after standardizing stays NaN: missing is the mean, 0
            x = keras.ops.where(keras.ops.isnan(x), 0.0, x)
        parts.append(keras.ops.expand_dims(x, -1))
    for name in categorical:
        inputs[name] = keras.Input(shape=(), dtype="string", name=name)
        vocabulary = sorted({str(v) for v in columns[name]} - set(na_values))
        lookup = keras.layers.StringLookup(
            vocabulary=vocabulary, output_mode="one_hot", name=f"{name}_lookup"
        )
        parts.append(keras.ops.cast(lookup(inputs[name]), "float32"))
    encoded = parts[0] if len(parts) == 1 else keras.layers.Concatenate(dtype="float32")(parts)
    return inputs, encoded


def _training_columns(train) -> dict[str, np.ndarray]:
    """The training split's feature columns as NumPy arrays (strings decoded)."""
    collected: dict[str, list[np.ndarray]] = {}
    for features, _ in train.batch(65536).as_numpy_iterator():
        for name, values in features.items():
            if values.dtype.kind in "OS":
                values = np.array([v.decode("utf-8") for v in values], dtype=object)
            collected.setdefault(name, []).append(values)
    return {name: np.concatenate(parts) for name, parts in collected.items()}
