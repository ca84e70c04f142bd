"""One streaming pass over a table: its splits' row counts, the training split's preprocessing
statistics (means, variances, vocabularies) and what its label holds.

Memory stays bounded whatever the table's size: numbers are folded into running moments batch
by batch (Chan et al.'s pairwise update), categories into counts (capped), labels into their
distinct values (capped). The pass also reads every cell it is given, so a bad cell anywhere is
found here, before training, with its file, line and column (`table_files`).

Rows are assigned to splits by a seeded hash of (file name, row index) (`assign`): no split is
ever materialized, every worker and every pass agrees on each row's split, and the same files
split the same way on any machine. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfrecipe import rundir
from tfrecipe.data import table_files
from tfrecipe.data.table_files import Table, Unit

SPLITS = ("train", "validation", "test")
TRAIN, VALIDATION, TEST = 0, 1, 2
# A label with more distinct values than this is not a set of classes (ids, or names).
MAX_CLASSES = 10_000
# A categorical column with more distinct values than this is an identifier, not a category.
MAX_DISTINCT = 1_000_000
STATS_FILE = rundir.DATA_STATS


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which table gives which split: `train` always; `validation` and `test` their own tables,
    or (None) rows of the training table carved out by the seeded hash at these fractions."""

    train: Table
    validation: Table | None
    test: Table | None
    validation_fraction: float
    test_fraction: float
    seed: int

    def tables(self) -> list[tuple[Table, int | None]]:
        """Every table with the split all its rows belong to (None: the hash decides)."""
        out: list[tuple[Table, int | None]] = [(self.train, None)]
        out += [(t, s) for t, s in ((self.validation, VALIDATION), (self.test, TEST)) if t]
        return out

    @property
    def carved(self) -> tuple[float, float]:
        return (
            0.0 if self.validation else self.validation_fraction,
            0.0 if self.test else self.test_fraction,
        )


def assign(layout: Layout, table: Table, split: int | None, file: str, rows: np.ndarray):
    """The split (TRAIN, VALIDATION, TEST) of each row index `rows` of `file`."""
    if split is not None:
        return np.full(len(rows), split, "int8")
    validation, test = layout.carved
    if validation == test == 0:
        return np.zeros(len(rows), "int8")
    u = uniform(rows, salt=_salt(table.relative(file), layout.seed))
    return np.where(u < validation, VALIDATION, np.where(u < validation + test, TEST, TRAIN))


def uniform(rows: np.ndarray, *, salt: int) -> np.ndarray:
    """A uniform draw in [0, 1) per row index: splitmix64 of (salt + index), vectorized."""
    x = rows.astype("uint64") + np.uint64(salt)
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype("float64") * (1.0 / (1 << 53))


def _salt(name: str, seed: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


# --- the statistics -------------------------------------------------------------------------------
@dataclasses.dataclass
class Moments:
    """Count, mean and sum of squared deviations of a column's present values."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    missing: int = 0

    def add(self, values: np.ndarray) -> None:
        present = values[~np.isnan(values)].astype("float64")
        self.missing += len(values) - len(present)
        if not len(present):
            return
        n, mean = len(present), float(present.mean())
        m2 = float(((present - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def variance(self) -> float:
        return self.m2 / self.count if self.count else 0.0


@dataclasses.dataclass
class TableStats:
    """What the pass found. `label_kind`: "classes" | "binary" | "multi_hot" | "float";
    `class_names`: string labels' names by id (sorted)."""

    rows: dict[str, int]
    numeric: dict[str, Moments]
    vocabularies: dict[str, list[str]]
    label_kind: str
    num_classes: int
    class_names: tuple[str, ...]
    # training rows per label value as written (class labels; a value seen only outside the
    # training split counts 0): sparse, so ids in the billions cost no more than small ones
    label_counts: dict[str, int]
    label_moments: list[Moments]  # per target column, training rows (float labels)
    sampled_rows: int | None  # training rows the feature statistics come from (stats_rows)
    # class labels found only in a validation or test file, never in the training files:
    # label -> where it is first (`file:line`); a class task refuses them (no rows to learn)
    untrained_labels: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"class_names": list(self.class_names)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableStats:
        """The statistics `to_json` wrote.

        Raises:
          ValueError: `data` is not what `compute` gives (another version's file, or one
            edited by hand: e.g. class names out of their sorted order, or counts that do not
            add up), so it must not be used.
        """
        try:
            data = dict(data)
            data["numeric"] = {k: Moments(**v) for k, v in data["numeric"].items()}
            data["label_moments"] = [Moments(**m) for m in data["label_moments"]]
            data["class_names"] = tuple(data["class_names"])
            stats = cls(**data)
            stats.check()
        except (TypeError, KeyError, AttributeError) as error:
            raise ValueError(f"not a table's statistics ({error})") from None
        return stats

    def check(self) -> None:
        """Raises ValueError where these statistics break what `compute` guarantees."""
        names, counts = self.class_names, self.label_counts
        problems = {
            "class names not sorted and distinct": list(names) != sorted(set(names)),
            "class names not one per class": bool(names) and len(names) != self.num_classes,
            "class names not the label's values": bool(names) and set(names) != set(counts),
            "label counts above the training rows": sum(counts.values()) > self.rows["train"],
            "negative row counts": min(self.rows.values(), default=0) < 0,
            "vocabularies not sorted and distinct": any(
                list(v) != sorted(set(v)) for v in self.vocabularies.values()
            ),
            "an unknown label kind": self.label_kind
            not in ("classes", "binary", "multi_hot", "float"),
        }
        found = [what for what, bad in problems.items() if bad]
        if found:
            raise ValueError(f"inconsistent statistics: {', '.join(found)}")


@dataclasses.dataclass(frozen=True)
class Columns:
    """The columns the pass reads and how."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    labels: tuple[str, ...]
    na_values: frozenset[str]  # CSV cells that mean "missing"
    allow_missing: bool  # a missing number is the training mean (else an error)
    max_vocabulary: int


def compute(layout: Layout, columns: Columns, *, stats_rows: int | None = None) -> TableStats:
    """The statistics of `layout`'s splits (see the module docstring); with `stats_rows`, the
    feature statistics come from about that many training rows, read in a seeded order of the
    table's units, and the other rows are read for their labels only.

    Raises:
      ValueError: one line for the first bad cell, a missing label or a label that is not a
        set of classes nor numbers.
    """
    state = _Pass(layout, columns, stats_rows)
    for table, split in layout.tables():
        units = table.units()
        if stats_rows is not None and split is None:
            rng = np.random.default_rng(layout.seed)
            units = [units[i] for i in rng.permutation(len(units))]
        for unit in units:
            state.read(table, split, unit)
    return state.result()


class _Pass:
    """The running state of `compute`."""

    def __init__(self, layout: Layout, columns: Columns, stats_rows: int | None):
        self.layout, self.columns, self.stats_rows = layout, columns, stats_rows
        self.rows = Counter({name: 0 for name in SPLITS})
        self.numeric = {name: Moments() for name in columns.numeric}
        self.counts: dict[str, Counter] = {name: Counter() for name in columns.categorical}
        self.labels = _Labels(columns.labels, columns.na_values)
        self.sampled = 0

    def read(self, table: Table, split: int | None, unit: Unit) -> None:
        sampling = self.stats_rows is None or self.sampled < self.stats_rows
        features = self.columns if sampling else Columns((), (), (), frozenset(), False, 0)
        numeric = (*features.numeric, *self.labels.numeric_columns)
        strings = (*features.categorical, *self.labels.string_columns)
        for first, batch in table_files.read(table, unit, numeric=numeric, strings=strings):
            indices = np.arange(first, first + batch.num_rows)
            splits = assign(self.layout, table, split, unit.file, indices)
            for s, n in enumerate(np.bincount(splits, minlength=3)):
                self.rows[SPLITS[s]] += int(n)
            train = splits == TRAIN
            self.labels.add(table, unit.file, batch, indices, train, own_split=split is not None)
            if sampling and train.any():
                self._add_features(table, unit.file, batch.filter(train), indices[train])

    def _add_features(self, table: Table, file: str, batch, indices: np.ndarray) -> None:
        for name in self.columns.numeric:
            values = numbers(table, file, batch, indices, name, self.columns.allow_missing)
            self.numeric[name].add(values)
        for name in self.columns.categorical:
            self.counts[name].update(value_counts(batch.column(name)))
            if len(self.counts[name]) > MAX_DISTINCT:
                raise ValueError(
                    f"categorical={name!r}: more than {MAX_DISTINCT:,} distinct values; an "
                    "identifier is not a category (leave it out of dataset.features)"
                )
        self.sampled += batch.num_rows

    def result(self) -> TableStats:
        kind, num_classes, names, label_counts, label_moments = self.labels.result()
        return TableStats(
            rows=dict(self.rows),
            numeric=self.numeric,
            vocabularies={
                name: vocabulary(counts, self.columns.na_values, self.columns.max_vocabulary)
                for name, counts in self.counts.items()
            },
            label_kind=kind,
            num_classes=num_classes,
            class_names=names,
            label_counts=label_counts,
            label_moments=label_moments,
            sampled_rows=self.sampled if self.stats_rows is not None else None,
            untrained_labels=self.labels.untrained() if kind in ("classes", "binary") else {},
        )


def numbers(table: Table, file: str, batch, rows: np.ndarray, name: str, allow_missing: bool):
    """A numeric column of a record batch as float32, a missing cell (null) as NaN.

    Raises:
      values.CellError: `file:line: column 'c': ...` for the first cell that is NaN or Inf
        as written (never a number), or missing where `allow_missing` is false (a ValueError).
    """
    column = batch.column(name)
    values = np.asarray(column.to_numpy(zero_copy_only=False), "float32")
    nulls = np.asarray(column.is_null().to_numpy(zero_copy_only=False))
    bad = (~np.isfinite(values) & ~nulls) | (nulls & (not allow_missing))
    if bad.any():
        raise table_files.bad_cell(table, file, int(rows[bad.argmax()]), name)
    return values


def value_counts(values) -> dict[str, int]:
    """{value: count} of an Arrow array, counted in C++."""
    import pyarrow.compute as pc

    counts = pc.value_counts(values)
    names, numbers = counts.field("values").to_pylist(), counts.field("counts").to_pylist()
    return dict(zip(names, numbers, strict=True))


def vocabulary(counts: Mapping[str, int], na_values, cap: int) -> list[str]:
    """The `cap` most frequent categories (ties by name), sorted by name; missing markers are
    left out (they map to the any-other slot)."""
    kept = [(-n, value) for value, n in counts.items() if value not in na_values]
    kept = sorted(kept)[:cap]
    return sorted(value for _, value in kept)


class _Labels:
    """What the label column(s) hold: one column read as strings (numbers or names, decided at
    the end), or several numeric 0/1 columns (multi-hot)."""

    def __init__(self, names: Sequence[str], na_values: frozenset[str]):
        self.names, self.na_values = tuple(names), na_values
        self.multi = len(names) > 1
        self.distinct: Counter = Counter()  # value -> training rows (while <= MAX_CLASSES)
        self.too_many = False
        self.numbers = True  # every value so far is a finite number
        self.integral = True
        self.minimum = math.inf
        self.moments = [Moments() for _ in names]
        self.in_training_files: set[str] = set()  # values of the training table(s), any split
        self.first_outside: dict[str, str] = {}  # value -> `file:line`, validation/test files

    @property
    def string_columns(self) -> tuple[str, ...]:
        return () if self.multi else self.names

    @property
    def numeric_columns(self) -> tuple[str, ...]:
        return self.names if self.multi else ()

    def add(
        self,
        table: Table,
        file: str,
        batch,
        indices: np.ndarray,
        train: np.ndarray,
        *,
        own_split: bool = False,
    ) -> None:
        """`own_split`: the batch is from a validation or test file (not the training one)."""
        if self.multi:
            return self._add_multi_hot(table, file, batch, indices, train)
        import pyarrow as pa
        import pyarrow.compute as pc

        name = self.names[0]
        cells = batch.column(name)
        missing = pc.equal(cells, "")
        for marker in self.na_values:
            missing = pc.or_(missing, pc.equal(cells, marker))
        if pc.any(missing).as_py():
            row = int(indices[np.flatnonzero(missing.to_numpy(zero_copy_only=False))[0]])
            raise ValueError(
                f"{table_files.where(table, file, row)}: column {name!r}: missing label; remove "
                "the row"
            )
        if self.numbers:
            try:
                values = pc.cast(cells, pa.float64()).to_numpy()
            except pa.ArrowInvalid:
                self.numbers = False
            else:
                if not np.isfinite(values).all():
                    self.numbers = False
                else:
                    self.integral &= bool((values == np.round(values)).all())
                    self.minimum = min(self.minimum, float(values.min()))
                    self.moments[0].add(values[train])
        if not self.too_many:
            self.distinct.update(value_counts(cells.filter(pa.array(train))))
            for value in set(pc.unique(cells).to_pylist()) - set(self.distinct):
                self.distinct[value] += 0  # seen outside the training split
            self._where_seen(table, file, cells, indices, own_split)
            self.too_many = len(self.distinct) > MAX_CLASSES
            if self.too_many:
                self.distinct.clear()
                self.first_outside.clear()

    def _where_seen(self, table, file, cells, indices, own_split: bool) -> None:
        """Which values the training files hold; where a value of a validation or test file that
        they do not hold is first (the training table is read first)."""
        import pyarrow.compute as pc

        values = set(pc.unique(cells).to_pylist())
        if not own_split:
            self.in_training_files |= values
            return
        for value in sorted(values - self.in_training_files - self.first_outside.keys()):
            row = int(indices[pc.index(cells, value).as_py()])
            self.first_outside[value] = table_files.where(table, file, row)

    def untrained(self) -> dict[str, str]:
        """Class labels of the validation or test files that no training file holds."""
        return {v: where for v, where in self.first_outside.items() if not self.distinct[v]}

    def _add_multi_hot(self, table, file, batch, indices, train) -> None:
        for column, moments in zip(self.names, self.moments, strict=True):
            values = np.asarray(batch.column(column).to_numpy(zero_copy_only=False), "float32")
            bad = np.flatnonzero(~np.isin(values, (0, 1)))
            if bad.size:
                raise ValueError(
                    f"{table_files.where(table, file, int(indices[bad[0]]))}: column {column!r}: "
                    f"{values[bad[0]]:g} is not 0 or 1; several label columns make a multi-hot "
                    "target of 0/1 values"
                )
            moments.add(values[train])

    def result(self):
        """(kind, num_classes, class names, training rows per label value, moments per
        column)."""
        if self.multi:
            return "multi_hot", len(self.names), (), {}, self.moments
        name = self.names[0]
        if not self.numbers:
            if self.too_many:
                raise ValueError(
                    f"label={name!r}: more than {MAX_CLASSES:,} distinct names; string labels "
                    "must be classes"
                )
            names = tuple(sorted(self.distinct))
            kind = "binary" if len(names) == 2 else "classes"
            return kind, len(names), names, dict(self.distinct), []
        if not self.integral or self.too_many:
            return "float", 0, (), {}, self.moments
        ids = {int(float(value)): n for value, n in self.distinct.items()}
        if self.minimum < 0:
            raise ValueError(
                f"label={name!r}: class id {int(self.minimum)} is negative; class ids are "
                "0, 1, ..., num_classes - 1"
            )
        # No list of num_classes counts: ids in the billions are refused by the head's memory
        # check (a class task) or taken as numbers (task=regression), never counted one by one.
        num_classes = 2 if set(ids) <= {0, 1} else max(ids) + 1
        kind = "binary" if set(ids) <= {0, 1} else "classes"
        return kind, num_classes, (), dict(self.distinct), []


# --- the cache in the run dir ---------------------------------------------------------------------
def fingerprint(layout: Layout, columns: Columns, stats_rows: int | None) -> str:
    """What the statistics depend on: the files (names, sizes and contents, as the run's data
    fingerprint hashes them: a rewrite that keeps size and modification time changes it too)
    and the options that change them."""
    from tfrecipe.data.fingerprint import MAX_HASHED_BYTES, WHOLE_FILE_BYTES, file_digest

    files, budget = [], MAX_HASHED_BYTES  # past it (thousands of files), size and mtime only
    for table, _ in layout.tables():
        for f in table.files:
            info = Path(f).stat()
            budget -= min(info.st_size, WHOLE_FILE_BYTES)
            content = file_digest(f) if budget >= 0 else (info.st_mtime_ns,)
            files.append((table.key, f, info.st_size, *content))
    options = (
        layout.validation_fraction,
        layout.test_fraction,
        layout.seed,
        {**dataclasses.asdict(columns), "na_values": sorted(columns.na_values)},
        stats_rows,
    )
    return hashlib.sha256(json.dumps([files, options], default=str).encode()).hexdigest()
