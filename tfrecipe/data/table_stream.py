"""A table's splits as tf.data datasets that stream: Arrow record batches in, chunks of rows out.

Elements are *chunks* of rows (`({column: [n]}, [n] targets)`, any n), not single rows: tf.data
pays tens of microseconds per element, more than a row costs to read, so the pipeline keeps
rows in chunks all the way (`pipeline.prepare` shuffles them vectorized, `distribute` rebatches
them to the global batch). Memory holds a few chunks per reader, whatever the table's size.

Each worker reads its share only (`Shard`): its own units (files, Parquet row groups) when there
are at least as many as workers, else every row whose index in its file is its own modulo the
workers. The training split's unit order is reshuffled each epoch from a seeded stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from tfrecipe import graph
from tfrecipe.data import table_files, table_stats
from tfrecipe.data.table_files import Table
from tfrecipe.data.table_stats import Columns, Layout, TableStats
from tfrecipe.data.values import number_problem

# Marks a bad cell found while streaming (the statistics pass read a sample only): the run
# reports it as a data error (`data_error`), not as a crash.
DATA_ERROR = "tfrecipe-data-error: "
_DICTIONARY = "/dictionary"  # a categorical column's distinct strings, beside its ids


@dataclasses.dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1


def split_dataset(
    layout: Layout,
    columns: Columns,
    stats: TableStats,
    split: int,
    *,
    shard: Shard = Shard(),
    shuffle_seed: int | None = None,
) -> tf.data.Dataset:
    """One split as a dataset of row chunks. With `shuffle_seed`, each iteration (epoch) reads
    the units in a new seeded order."""
    reader = _Reader(layout, columns, stats, split, shard)
    signature = reader.signature(encoded=True)
    if shuffle_seed is None:
        chunks = tf.data.Dataset.from_generator(
            lambda: reader.chunks(None, encoded=True), output_signature=signature
        )
    else:
        seeds = tf.data.Dataset.random(seed=shuffle_seed, rerandomize_each_iteration=True)
        chunks = seeds.take(1).flat_map(
            lambda seed: tf.data.Dataset.from_generator(
                lambda seed: reader.chunks(seed, encoded=True),
                args=(seed,),
                output_signature=signature,
            )
        )
    return chunks.map(graph.plain(_decode_categories))


def _decode_categories(features, targets):
    """Categorical columns arrive dictionary-encoded (ids into a chunk's few distinct strings):
    made strings here, in TensorFlow, instead of one Python object per cell (3x the rows/s)."""
    decoded = {}
    for name, values in features.items():
        if name.endswith(_DICTIONARY):
            continue
        dictionary = features.get(name + _DICTIONARY)
        decoded[name] = values if dictionary is None else tf.gather(dictionary, values)
    return decoded, targets


def read_split(layout: Layout, columns: Columns, stats: TableStats, split: int):
    """One split's chunks of rows, in file order, as NumPy arrays (no tf.data)."""
    return _Reader(layout, columns, stats, split, Shard()).chunks(None)


def data_error(error: BaseException) -> str | None:
    """The one-line message of a bad cell met while streaming, if `error` is one."""
    text = str(error)
    if DATA_ERROR not in text:
        return None
    return text.split(DATA_ERROR, 1)[1].splitlines()[0]


class _Reader:
    """The Python side of a split: which units and rows it reads, and their conversion."""

    def __init__(self, layout, columns: Columns, stats: TableStats, split: int, shard: Shard):
        self.layout, self.columns, self.stats = layout, columns, stats
        self.split, self.shard = split, shard
        self.class_ids = {name: i for i, name in enumerate(stats.class_names)}

    def signature(self, *, encoded: bool = False):
        features = {name: tf.TensorSpec([None], tf.float32) for name in self.columns.numeric}
        for name in self.columns.categorical:
            if encoded:
                features[name] = tf.TensorSpec([None], tf.int32)
                features[name + _DICTIONARY] = tf.TensorSpec([None], tf.string)
            else:
                features[name] = tf.TensorSpec([None], tf.string)
        kind = self.stats.label_kind
        if kind == "multi_hot":
            target = tf.TensorSpec([None, len(self.columns.labels)], tf.float32)
        elif kind == "float":
            target = tf.TensorSpec([None, 1], tf.float32)
        else:
            target = tf.TensorSpec([None], tf.int32)
        return features, target

    def _units(self, seed) -> list[tuple[Table, int | None, table_files.Unit, bool]]:
        """(table, its split or None, unit, keep every row of it?) this shard reads."""
        units = [
            (table, split, unit)
            for table, split in self.layout.tables()
            if split == self.split or (split is None and self._carved_from_training_table())
            for unit in table.units()
        ]
        if self.shard.count > 1 and len(units) >= self.shard.count:
            units = units[self.shard.index :: self.shard.count]
            whole = True
        else:
            whole = self.shard.count == 1
        if seed is not None:
            rng = np.random.default_rng(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
            units = [units[i] for i in rng.permutation(len(units))]
        return [(*unit, whole) for unit in units]

    def _carved_from_training_table(self) -> bool:
        """Whether rows of this split come from the training table (a split with its own files
        has none there: its reader never parses the training table)."""
        validation, test = self.layout.carved
        return {
            table_stats.TRAIN: True,
            table_stats.VALIDATION: validation > 0,
            table_stats.TEST: test > 0,
        }[self.split]

    def chunks(self, seed, *, encoded: bool = False):
        """Yields `({column: values}, targets)` chunks of NumPy arrays; `encoded`: categorical
        columns as int32 ids plus their dictionary (`_decode_categories`)."""
        try:
            yield from self._chunks(seed, encoded)
        except ValueError as error:  # a bad cell: one line that names it, marked
            self._fail(str(error).removeprefix(DATA_ERROR))

    def _chunks(self, seed, encoded: bool) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        numeric = (*self.columns.numeric, *self._numeric_labels())
        strings = (*self.columns.categorical, *self._string_labels())
        for table, split, unit, whole in self._units(seed):
            for first, batch in table_files.read(table, unit, numeric=numeric, strings=strings):
                rows = np.arange(first, first + batch.num_rows)
                keep = table_stats.assign(self.layout, table, split, unit.file, rows) == self.split
                if not whole:
                    keep &= rows % self.shard.count == self.shard.index
                if not keep.all():
                    import pyarrow as pa

                    batch, rows = batch.filter(pa.array(keep)), rows[keep]
                if batch.num_rows:
                    yield self._convert(table, unit.file, batch, rows, encoded)

    def _numeric_labels(self) -> tuple[str, ...]:
        return self.columns.labels if self.stats.label_kind == "multi_hot" else ()

    def _string_labels(self) -> tuple[str, ...]:
        return () if self.stats.label_kind == "multi_hot" else self.columns.labels

    def _convert(self, table, file, batch, rows, encoded: bool):
        features = {}
        allow_missing = self.columns.allow_missing
        for name in self.columns.numeric:  # a bad cell: ValueError, marked by chunks()
            features[name] = table_stats.numbers(table, file, batch, rows, name, allow_missing)
        for name in self.columns.categorical:
            column = batch.column(name).cast("binary")  # bytes: TensorFlow takes them as they are
            if encoded:
                column = column.dictionary_encode()
                features[name + _DICTIONARY] = column.dictionary.to_numpy(zero_copy_only=False)
                column = column.indices.cast("int32")
            features[name] = column.to_numpy(zero_copy_only=False)
        return features, self._targets(table, file, batch, rows)

    def _targets(self, table, file, batch, rows) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.compute as pc

        kind, labels = self.stats.label_kind, self.columns.labels
        if kind == "multi_hot":
            return np.stack(
                [
                    np.asarray(batch.column(n).to_numpy(zero_copy_only=False), "float32")
                    for n in labels
                ],
                axis=1,
            )
        cells = batch.column(labels[0])
        if self.stats.class_names:
            ids = pc.index_in(cells, value_set=pa.array(self.stats.class_names))
            if ids.null_count:
                row = int(np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))[0])
                self._fail(
                    f"{table_files.where(table, file, int(rows[row]))}: column {labels[0]!r}: "
                    f"{cells[row].as_py()!r} is not among the classes the statistics pass saw "
                    f"({', '.join(self.stats.class_names[:10])}); set dataset.stats_rows=null"
                )
            return ids.to_numpy(zero_copy_only=False).astype("int32")
        try:
            values = pc.cast(cells, pa.float64()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:
            numbers = [number_problem(c, labels[0], ()) for c in cells.to_pylist()]
            row = next(i for i, problem in enumerate(numbers) if problem)
            self._fail(f"{table_files.where(table, file, int(rows[row]))}: {numbers[row]}")
        if kind == "float":
            return values.astype("float32")[:, np.newaxis]
        outside = (values < 0) | (values >= self.stats.num_classes) | (values != np.round(values))
        if outside.any():
            row = int(outside.argmax())
            self._fail(
                f"{table_files.where(table, file, int(rows[row]))}: column {labels[0]!r}: "
                f"{values[row]:g} is not a class id in [0, {self.stats.num_classes}) the "
                "statistics pass saw; set dataset.stats_rows=null"
            )
        return values.astype("int32")

    @staticmethod
    def _fail(message: str):
        raise ValueError(DATA_ERROR + message)
