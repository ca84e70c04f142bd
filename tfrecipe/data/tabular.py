"""Tabular data from the user's files: `dataset=csv` and `dataset=parquet`.

Both read with pyarrow (`table_files`) and start with one streaming pass over the files
(`table_stats`): it checks every cell (a bad one is refused with its file, line and column),
counts the splits' rows, and gathers what the model's encoders need from the training split
(means and variances, vocabularies) and what the label holds. Then:

- a small table (`stream: auto`, at most `IN_MEMORY_CELLS` cells) is held in memory and split
  by seeded, stratified fractions, as tables always were here;
- a larger one, or one with its own validation/test files, streams (`table_stream`): rows are
  split by a seeded hash of (file, row index), each worker reads its own share, and memory stays
  a few chunks of rows whatever the table's size.

Features reach the model raw, as a dict of columns (float32 numbers, strings for categorical
columns); its first layers encode them (`column_encoders`: numbers standardized, categories
one-hot), so the exported model takes raw rows.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from tfrecipe import files, reading
from tfrecipe.config.targets import config_target
from tfrecipe.data import table_layout, table_stats
from tfrecipe.data.splits import DatasetInfo, Holdout, Splits, from_arrays
from tfrecipe.data.table_files import Table
from tfrecipe.data.table_layout import Named
from tfrecipe.data.table_stats import Columns, Layout, TableStats

log = logging.getLogger("tfrecipe")

# Up to this many cells (rows x columns read), `stream: auto` holds the table in memory.
IN_MEMORY_CELLS = 5_000_000
# How long a worker other than the chief (or the sidecar evaluator) waits for the chief's
# statistics (data_stats.json) before computing them itself.
STATS_WAIT_S = 300.0


class StatsCache:
    """Where a run keeps its table statistics (`RUN_DIR/data_stats.json`): the chief writes
    them (only into a run dir that exists: a run that stops on a config error leaves none),
    a resume and the other workers read them instead of passing over the table again.

    They are used only for the same files with the same contents (the key hashes them as the
    data fingerprint does) and only as computed: a file whose digest does not match its
    statistics, or whose statistics break what the pass guarantees (class names out of their
    sorted order, counts that do not add up), was edited, and is computed again."""

    def __init__(self, run_dir: Path, *, chief: bool, wait_s: float = 0.0):
        """`wait_s`: how long to wait for the chief's statistics (another worker of the run)
        before computing them here; the chief writes them, the others only read."""
        self.path = Path(run_dir) / table_stats.STATS_FILE
        self.chief, self.wait_s = chief, wait_s

    def get(self, key: str, compute: Callable[[], TableStats]) -> TableStats:
        cached = self._read(key, wait_s=self.wait_s if self.path.parent.is_dir() else 0.0)
        if cached is not None:
            return cached
        try:
            stats = compute()
        except ValueError as error:
            self._write(key, {"error": str(error)})  # the waiting workers stop with it too
            raise
        self._write(key, {"stats": stats.to_json()})
        return stats

    def _read(self, key: str, *, wait_s: float) -> TableStats | None:
        deadline = time.monotonic() + wait_s
        while True:
            data = _read_json(self.path)
            if data is not None and data.get("fingerprint") == key:
                if "error" in data:
                    raise ValueError(data["error"])
                try:
                    return _verified(data)
                except ValueError as error:
                    log.warning("%s: %s; computing the statistics again", self.path, error)
                    return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.2)

    def _write(self, key: str, content: dict) -> None:
        if self.chief and self.path.parent.is_dir():
            digest = _digest(content["stats"]) if "stats" in content else None
            files.write_atomic(
                self.path, json.dumps({"fingerprint": key, **content, "digest": digest})
            )


def _digest(stats: dict) -> str:
    return hashlib.sha256(json.dumps(stats, sort_keys=True).encode()).hexdigest()


def _verified(data: dict) -> TableStats:
    """The statistics of a data_stats.json, if they are as the pass computed them.

    Raises:
      ValueError: what is wrong with them.
    """
    stats = data.get("stats")
    if not isinstance(stats, dict) or data.get("digest") != _digest(stats):
        raise ValueError("the statistics do not match their digest (edited after they were made)")
    return TableStats.from_json(stats)


def _read_json(path: Path) -> dict | None:
    """The cached statistics, or None where there are none yet (the chief has not written them,
    or is writing them). A file that is there but is not one tfrecipe wrote (a link to a device,
    a file too large, damaged JSON) is refused, not silently recomputed over."""
    try:
        data = reading.read_json(path, what=f"a run's {table_stats.STATS_FILE}")
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise reading.UnreadableFile(f"{path}: holds no statistics tfrecipe wrote (a JSON object)")
    return data


@config_target
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
    validation_path: str | None = None,
    test_path: str | None = None,
    stats_rows: int | None = None,
    max_vocabulary: int = 10_000,
    stream: Literal["auto"] | bool = "auto",
    stats_cache: StatsCache | None = None,
) -> Splits:
    """Rows of CSV files (plain or `.gz`) as `({column: value}, target)` examples.

    Args:
      path: a file, a directory (every `.csv`/`.tsv`/`.txt`, `.gz` too, in it) or a glob; the
        files are read in sorted order and must share their columns.
      label: the target column; several 0/1 columns make a multi-hot target. A column of
        floats gives float targets, of integers class ids (0/1 only: binary), of strings
        class ids in the sorted order of the names (`DatasetInfo.class_names`).
      features: the input columns; None: every column but the label.
      categorical: input columns read as strings and one-hot encoded (the others are numbers).
      na_values: cells that mean "missing": a missing number becomes the training mean, a
        missing category the out-of-vocabulary one. Empty: a missing number is an error.
      header: the first row of each file names the columns; false: `column_names` does.
      validation_path, test_path: files holding that split (else carved out of `path` by
        `validation_fraction`/`test_fraction`).
      stats_rows: the encoders' statistics from about this many training rows (a seeded
        sample of the table's files) instead of all; the other rows are checked as they stream.
      max_vocabulary: the most frequent categories each categorical column keeps; the others
        share the any-other slot.
      stream: "auto": in memory up to `IN_MEMORY_CELLS` cells, else streamed; true/false.
      stats_cache: given by the run: where its statistics are kept.

    Raises:
      ValueError: one line naming the file, line and column of the first bad cell, or the
        unknown column and the columns the file has.
    """
    open_table = table_layout.csv_opener(
        delimiter=delimiter, header=header, column_names=column_names, na_values=na_values
    )
    return _table(
        open_table,
        paths=(path, validation_path, test_path),
        named=Named(label=label, features=features, categorical=categorical),
        missing=(frozenset(na_values), bool(na_values)),
        split=(validation_fraction, test_fraction, split_seed),
        stats_rows=stats_rows,
        max_vocabulary=max_vocabulary,
        stream=stream,
        stats_cache=stats_cache,
    )


@config_target
def parquet(
    *,
    path: str,
    label: str | Sequence[str],
    features: Sequence[str] | None = None,
    categorical: Sequence[str] = (),
    allow_missing: bool = False,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    split_seed: int = 0,
    validation_path: str | None = None,
    test_path: str | None = None,
    stats_rows: int | None = None,
    max_vocabulary: int = 10_000,
    stream: Literal["auto"] | bool = "auto",
    stats_cache: StatsCache | None = None,
) -> Splits:
    """Rows of Parquet files: a file, a directory (hive partitions `year=2024/` become
    columns) or a glob. `allow_missing`: a null number becomes the training mean (else an
    error), a null category the any-other slot. The other arguments are `csv`'s."""
    return _table(
        table_layout.parquet_opener(),
        paths=(path, validation_path, test_path),
        named=Named(label=label, features=features, categorical=categorical),
        missing=(frozenset(), allow_missing),
        split=(validation_fraction, test_fraction, split_seed),
        stats_rows=stats_rows,
        max_vocabulary=max_vocabulary,
        stream=stream,
        stats_cache=stats_cache,
    )


def _table(
    open_table: Callable[..., Table],
    *,
    paths: tuple[str, str | None, str | None],
    named: Named,
    missing: tuple[frozenset[str], bool],
    split: tuple[float, float, int],
    stats_rows: int | None,
    max_vocabulary: int,
    stream: Literal["auto"] | bool,
    stats_cache: StatsCache | None,
) -> Splits:
    """The splits of a table: its files opened (`missing`: the cells meaning "missing", and
    whether a missing number is allowed), one statistics pass, then held in memory or streamed.
    `split`: (validation fraction, test fraction, seed)."""
    path, validation_path, test_path = paths
    layout = Layout(
        train=open_table(path, key="path"),
        validation=open_table(validation_path, key="validation_path") if validation_path else None,
        test=open_table(test_path, key="test_path") if test_path else None,
        validation_fraction=split[0],
        test_fraction=split[1],
        seed=split[2],
    )
    table_layout.check_fractions(*split[:2])
    table_layout.check_counts(stats_rows=stats_rows, max_vocabulary=max_vocabulary)
    inputs = table_layout.input_columns([table for table, _ in layout.tables()], named)
    columns = Columns(
        numeric=tuple(name for name in inputs if name not in set(named.categorical)),
        categorical=tuple(named.categorical),
        labels=tuple(named.labels),
        na_values=missing[0],
        allow_missing=missing[1],
        max_vocabulary=max_vocabulary,
    )
    in_memory = functools.partial(
        _held_in_memory, stream=stream, width=len(inputs) + len(columns.labels), layout=layout
    )
    key = table_stats.fingerprint(layout, columns, stats_rows)
    compute = functools.partial(_statistics, layout, columns, stats_rows, in_memory)
    stats = stats_cache.get(key, compute) if stats_cache else compute()
    for key, file, name in (("path", path, "train"), *_own_files(paths[1:])):
        if stats.rows[name] == 0:  # an empty split file would leave that split out, unsaid
            raise ValueError(f"{key}={file!r}: no {'training ' if key == 'path' else ''}rows")
    if in_memory(stats):
        return _in_memory(layout, columns, stats, split[:2], split[2])
    return _streamed(layout, columns, stats)


def _own_files(paths: tuple[str | None, str | None]) -> list[tuple[str, str, str]]:
    """(key, file, split) of the validation and test splits given their own files."""
    named = zip(("validation_path", "test_path"), paths, ("validation", "test"), strict=True)
    return [(key, file, split) for key, file, split in named if file]


def _held_in_memory(stats: TableStats, *, stream, width: int, layout: Layout) -> bool:
    """Whether the table is held in memory (and split by stratified fractions), not streamed:
    `stream` false, or auto and at most IN_MEMORY_CELLS cells; never with split files of its
    own."""
    if layout.validation or layout.test:
        return False
    cells = sum(stats.rows.values()) * width
    return stream is False or (stream == "auto" and cells <= IN_MEMORY_CELLS)


def _statistics(
    layout: Layout, columns: Columns, stats_rows: int | None, in_memory: Callable
) -> TableStats:
    """The statistics pass, and its line: the rows it read, and the split's rows for a streamed
    table (a table held in memory is split afterwards, by stratified fractions: `_in_memory`
    says those counts; the pass's hash counts are not its split)."""
    started = time.perf_counter()
    stats = table_stats.compute(layout, columns, stats_rows=stats_rows)
    seconds, total = time.perf_counter() - started, f"{sum(stats.rows.values()):,}"
    if in_memory(stats):
        log.info("statistics pass: %s rows in %.1fs; held in memory", total, seconds)
    else:
        counts = (f"{n:,}" for n in stats.rows.values())
        log.info(
            "statistics pass: %s rows (train %s, validation %s, test %s) in %.1fs; streamed",
            total,
            *counts,
            seconds,
        )
    return stats


def _info(columns: Columns, stats: TableStats, rows: tuple[int, int, int], targets=None):
    kind = stats.label_kind
    shape = {"multi_hot": (len(columns.labels),), "float": (1,)}.get(kind, ())
    return DatasetInfo(
        # a table's raw columns: the model's encoders decide the width its body sees
        input_shape=(len(columns.numeric) + len(columns.categorical),),
        num_classes=stats.num_classes,
        num_train=rows[0],
        num_validation=rows[1],
        num_test=rows[2],
        target_kind=kind,
        target_shape=shape,
        targets=targets,
        class_names=stats.class_names,
        untrained_labels=_untrained(stats),
        smallest_class_id=_smallest_class_id(stats),
    )


def _smallest_class_id(stats: TableStats) -> int | None:
    """The smallest integer class id of the table's rows (None: named classes, or numbers)."""
    if stats.label_kind not in ("classes", "binary") or stats.class_names:
        return None
    return min((int(float(value)) for value in stats.label_counts), default=None)


def _untrained(stats: TableStats) -> tuple[str, ...]:
    """`DatasetInfo.untrained_labels`: each as `'label' (first at FILE:LINE)`."""
    return tuple(f"{label!r} (first at {where})" for label, where in stats.untrained_labels.items())


# --- small tables: in memory, stratified ----------------------------------------------------------
def _in_memory(layout, columns: Columns, stats: TableStats, fractions, split_seed) -> Splits:
    """Every row in memory, split by seeded fractions (stratified for class targets), the
    encoders adapted on the training split: what tables always did here."""
    from tfrecipe.data import table_stream

    everything = Layout(layout.train, None, None, 0.0, 0.0, layout.seed)
    parts = list(table_stream.read_split(everything, columns, stats, table_stats.TRAIN))
    features = {name: np.concatenate([chunk[name] for chunk, _ in parts]) for name in parts[0][0]}
    for name in columns.categorical:  # raw strings, as a dict column of Python strings
        features[name] = np.array([v.decode("utf-8") for v in features[name]], dtype=object)
    targets = np.concatenate([target for _, target in parts])
    splits = from_arrays(
        features,
        targets,
        num_classes=stats.num_classes,
        target_kind=stats.label_kind,
        class_names=stats.class_names,
        preprocessing=functools.partial(encode_columns, columns=columns),
        holdout=Holdout(*fractions, split_seed),
    )
    info = splits.info
    log.info(
        "in memory: train %s, validation %s, test %s rows (seeded fractions%s)",
        *(f"{n:,}" for n in (info.num_train, info.num_validation, info.num_test)),
        ", stratified by class" if stats.label_kind in ("classes", "binary") else "",
    )
    return splits


# --- large tables: streamed -----------------------------------------------------------------------
def _streamed(layout: Layout, columns: Columns, stats: TableStats) -> Splits:
    from tfrecipe.data import table_stream

    def for_worker(index: int, count: int) -> Splits:
        shard = table_stream.Shard(index, count)

        def split(which: int, **kwargs):
            if not stats.rows[table_stats.SPLITS[which]]:
                return None
            return table_stream.split_dataset(layout, columns, stats, which, shard=shard, **kwargs)

        return Splits(
            train=split(table_stats.TRAIN, shuffle_seed=layout.seed),
            validation=split(table_stats.VALIDATION),
            test=split(table_stats.TEST),
            info=_info(columns, stats, tuple(stats.rows[s] for s in table_stats.SPLITS)),
            preprocessing=lambda _train: column_encoders(columns, stats),
            batched=True,
            for_worker=for_worker,
        )

    return for_worker(0, 1)


# --- in the model ---------------------------------------------------------------------------------
def encode_columns(train, *, columns: Columns):
    """`Splits.preprocessing` of an in-memory table: the encoders' statistics from the training
    split `train`, then `column_encoders`."""
    data = _training_columns(train)
    moments = {}
    for name in columns.numeric:
        values = data[name]
        moments[name] = table_stats.Moments()
        moments[name].add(values)
    vocabularies = {
        name: table_stats.vocabulary(
            dict(zip(*np.unique(data[name].astype(str), return_counts=True), strict=True)),
            columns.na_values,
            columns.max_vocabulary,
        )
        for name in columns.categorical
    }
    stats = TableStats({}, moments, vocabularies, "", 0, (), {}, [], None)
    return column_encoders(columns, stats)


def column_encoders(columns: Columns, stats: TableStats):
    """The model's raw-row inputs and their encoding: each numeric column standardized with
    the training split's mean and variance (a missing one, NaN, becomes 0: the training mean),
    each categorical one one-hot over its vocabulary plus one slot for any other.

    Returns:
      `(inputs, encoded)`: a dict of scalar `keras.Input`s named by column, and the
      `[batch, width]` float32 encoding.
    """
    import keras

    inputs, parts = {}, []
    for name in columns.numeric:
        inputs[name] = keras.Input(shape=(), dtype="float32", name=name)
        moments = stats.numeric[name]
        normalize = keras.layers.Normalization(
            axis=None, mean=float(moments.mean), variance=float(moments.variance), dtype="float32"
        )
        x = normalize(inputs[name])
        if columns.allow_missing:  # NaN after standardizing stays NaN: missing is the mean, 0
            x = keras.ops.where(keras.ops.isnan(x), 0.0, x)
        parts.append(keras.ops.expand_dims(x, -1))
    for name in columns.categorical:
        inputs[name] = keras.Input(shape=(), dtype="string", name=name)
        lookup = keras.layers.StringLookup(
            vocabulary=stats.vocabularies[name], output_mode="one_hot", name=f"{name}_lookup"
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
