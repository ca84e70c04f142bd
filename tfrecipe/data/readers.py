"""New examples for a trained model, read from the kinds of files training reads, in batches.

`open_sources` checks every input against the run's signature (`tfrecipe/signature.py`) before
TensorFlow is imported: the files exist, a table has the columns the model takes (by name; a
label column is ignored) with values of the right kind, arrays have the model's shape. Tables
(CSV, Parquet) stream in record batches through pyarrow, so a file larger than memory is fine;
their number columns are read once to check every cell before TensorFlow, and again to predict.
`.npz` arrays are read whole, as training reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tfrecipe import reading
from tfrecipe.data.listing import folder_files
from tfrecipe.data.table_files import CSV_SUFFIXES, PARQUET_SUFFIXES
from tfrecipe.data.table_layout import delimiter_hint
from tfrecipe.data.values import CellError, check_finite_array, fault_text
from tfrecipe.errors import ConfigError

# tfrecipe.data.image_folder's, repeated: that module imports TensorFlow.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
# The tables training reads (tfrecipe.data.table_files: .csv.gz, .tsv, ...), but a .txt file
# is a text (one example of a text model).
TABLE_SUFFIXES = tuple(s for s in (*CSV_SUFFIXES, *PARQUET_SUFFIXES) if not s.startswith(".txt"))
# gzipped too (.tfrecord.gz: TFX and Beam write them), as training reads them
TFRECORD_SUFFIXES = tuple(
    s + gz for s in (".tfrecord", ".tfrecords", ".tfrec") for gz in ("", ".gz")
)
# Rows of an array file checked at a time (a mapped .npy larger than memory is checked in pieces).
CHECK_ROWS = 65_536


@dataclasses.dataclass(frozen=True)
class Batch:
    """A batch of examples: what the model takes, and the columns copied to the output."""

    features: np.ndarray | dict[str, np.ndarray]
    passthrough: dict[str, np.ndarray]


class Source(Protocol):
    def num_rows(self) -> int | None: ...

    def batches(self, batch_size: int) -> Iterator[Batch]: ...


def open_sources(
    paths: Sequence[Path], record: Mapping[str, Any], *, dataset: Mapping[str, Any], keep=()
) -> Source:
    """The examples in `paths` (files or folders, all of one kind) for a model of `record`'s
    signature; `dataset` is the run's dataset config (how training read its files).

    Raises:
      ConfigError: a path is missing or of a kind the model cannot take, a column is missing, a
        value is of the wrong kind, `keep` names a column of an input that has none.
    """
    for path in paths:
        if not path.exists():
            raise ConfigError(f"predict: INPUT={path}: no such file or folder")
        if not path.is_dir():
            _check_file(path, limit=None)  # a regular file (each kind caps its size as it reads)
    inputs = record["inputs"]
    kinds = {path: _kind(path, inputs) for path in paths}
    if len(set(kinds.values())) > 1:
        found = ", ".join(f"{p} ({k})" for p, k in kinds.items())
        raise ConfigError(f"predict: INPUT: give inputs of one kind, received {found}")
    kind = next(iter(kinds.values()))
    if keep and kind != "table":
        raise ConfigError(
            f"predict: --keep={','.join(keep)}: only tables (CSV, Parquet) have columns to keep; "
            f"{kind} inputs get their path instead"
        )
    if kind == "table":
        stacked = inputs["kind"] == "array"  # a bundled table's vector, from named columns
        tables = _list_files(paths, TABLE_SUFFIXES, kind, limit=None)  # streamed: no cap
        return Table(tables, _table_columns(inputs), keep, dataset=dataset, stacked=stacked)
    if kind == "npz":
        return Arrays(list(paths), inputs["shape"], key=dataset.get("x_key", "x"))
    if kind == "tfrecord":
        return Records(list(paths), inputs["shape"], dataset=dataset)
    if kind == "images":
        images = _list_files(paths, IMAGE_SUFFIXES, kind, limit=reading.MAX_IMAGE_BYTES)
        return Images(images, inputs["shape"])
    return Texts(_list_files(paths, (".txt",), kind, limit=reading.MAX_TEXT_BYTES))


def _kind(path: Path, inputs: Mapping[str, Any]) -> str:
    """What a path holds, and whether the model can take it."""
    suffix = path.suffix.lower()
    shape, model_kind = inputs.get("shape"), inputs["kind"]
    images = model_kind == "array" and len(shape) == 3
    tables = model_kind == "columns" or bool(inputs.get("feature_names"))
    if path.is_dir():  # a folder holds what the model takes, as training reads folders
        kind = "texts" if model_kind == "text" else "images" if images else None
        kind = "table" if tables else kind
    elif path.name.lower().endswith(TABLE_SUFFIXES):
        kind = "table"
    elif suffix in (".npz", ".npy"):
        kind = "npz"
    elif path.name.lower().endswith(TFRECORD_SUFFIXES):
        kind = "tfrecord"
    elif suffix in IMAGE_SUFFIXES:
        kind = "images"
    elif suffix == ".txt":
        kind = "texts"
    else:
        kind = None
    arrays = ["npz", "tfrecord"]
    if images:
        arrays.append("images")
    if inputs.get("feature_names"):
        arrays.append("table")
    takes = {"columns": ["table"], "text": ["texts"], "array": arrays}[model_kind]
    if kind not in takes:
        what = {
            "columns": "table columns (CSV, Parquet)",
            "text": "text (.txt files or folders of them)",
            "array": f"arrays of shape {shape} ({', '.join(takes)})",
        }[model_kind]
        raise ConfigError(
            f"predict: INPUT={path}: {kind or 'an unknown kind of file'}, but the run's model "
            f"takes {what}"
        )
    return kind


def _list_files(
    paths: Sequence[Path], suffixes: Sequence[str], kind: str, *, limit: int
) -> list[Path]:
    """Files, and the files under folders (sorted, recursively) with one of `suffixes`, each a
    regular file of at most `limit` bytes (a link to /dev/zero among them is refused, not read)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = folder_files(path, suffixes)  # hidden ones left out, as training does
            if not found:
                raise ConfigError(
                    f"predict: INPUT={path}: a folder without {kind} ({', '.join(suffixes)})"
                )
            files += found
        else:
            files.append(path)
    for file in files:
        _check_file(file, limit=limit)
    return files


def _check_file(path: Path, *, limit: int | None) -> None:
    try:
        reading.check_file(path, limit=limit, what="an input of predict")
    except reading.UnreadableFile as error:
        raise ConfigError(f"predict: {error}") from None


# --- tables -------------------------------------------------------------------------------------
def _table_columns(inputs: Mapping[str, Any]) -> dict[str, str]:
    """The columns a table needs: name -> "string" or a number type."""
    if inputs["kind"] == "columns":
        return dict(inputs["columns"])
    return dict.fromkeys(inputs["feature_names"], "float32")  # stacked into one vector


class Table:
    """Rows of CSV or Parquet files, read as training reads them (`tfrecipe.data.table_files`:
    the same parser, options and one-line errors naming file, line and column). A model of named
    columns gets a dict of them; a model of one vector (a bundled table's) gets its named
    columns stacked in order."""

    def __init__(
        self,
        files: list[Path],
        columns: dict[str, str],
        keep: Sequence[str],
        *,
        dataset: Mapping[str, Any],
        stacked: bool,
    ):
        from tfrecipe.data import table_files

        self.columns, self.keep, self.stacked = columns, tuple(keep), stacked
        # what training took as missing (the training mean); any other NaN, Inf or number beyond
        # float32 is refused with its file, line and column, as training refuses it
        self.allow_missing = bool(dataset.get("na_values")) or bool(dataset.get("allow_missing"))
        self.numeric = [name for name, kind in columns.items() if kind != "string"]
        self.strings = [name for name, kind in columns.items() if kind == "string"]
        self.strings += [name for name in self.keep if name not in columns]
        options = table_files.CsvOptions(
            delimiter=dataset.get("delimiter", ","),
            header=dataset.get("header", True),
            column_names=tuple(dataset.get("column_names") or ()) or None,
            na_values=tuple(dataset.get("na_values") or ()),
        )
        self.tables = [self._open(file, options) for file in files]
        self._check_cells()

    def _check_cells(self) -> None:
        """Reads every number cell once, before TensorFlow is imported (a bad cell at the end of
        a large file is a mistake found in a second, not after the model loads)."""
        for table in self.tables:
            for _ in self._record_batches(table, strings=()):
                pass

    def _open(self, file: Path, options):
        from tfrecipe.data import table_files

        kind = "parquet" if file.suffix.lower() in PARQUET_SUFFIXES else "csv"
        try:
            table = table_files.open_table(str(file), format=kind, key="INPUT", csv=options)
        except ValueError as error:
            raise ConfigError(f"predict: {error}") from None
        if any(name not in table.columns for name in (*self.columns, *self.keep)):
            error = missing_columns(str(file), list(self.columns), table.columns, keep=self.keep)
            raise ConfigError(error.messages[0] + delimiter_hint(table, predict=True))
        return table

    def num_rows(self) -> int | None:
        if any(table.format == "csv" for table in self.tables):
            return None  # unknown until read
        return sum(unit.num_rows for table in self.tables for unit in table.units())

    def batches(self, batch_size: int) -> Iterator[Batch]:
        for table in self.tables:
            yield from _rebatch(self._record_batches(table), batch_size, self._batch)

    def _record_batches(self, table, strings: Sequence[str] | None = None):
        """The table's record batches (the number columns and `strings`, all strings columns
        when None), every number checked as training checks it.

        Raises:
          ConfigError: `predict: file:line: column 'c': 'x' is not a number; ...` for the first
            bad cell, in words for new input (the run's model is fixed: the cell must change).
        """
        from tfrecipe.data import table_files, table_stats

        strings = self.strings if strings is None else strings
        try:
            for unit in table.units():
                for first, batch in table_files.read(
                    table, unit, numeric=self.numeric, strings=strings
                ):
                    rows = np.arange(first, first + batch.num_rows)
                    for name in self.numeric:  # training's own check (the statistics pass)
                        table_stats.numbers(table, unit.file, batch, rows, name, self.allow_missing)
                    yield batch
        except CellError as error:
            problem = fault_text(error.fault, error.cell, error.column, predict=True)
            raise ConfigError(f"predict: {error.where}: {problem}") from None
        except ValueError as error:  # a ragged row, a file that is not CSV
            raise ConfigError(f"predict: {error}") from None

    def _batch(self, table) -> Batch:
        columns = {name: _column(table, name, t) for name, t in self.columns.items()}
        features = np.stack(list(columns.values()), axis=1) if self.stacked else columns
        passthrough = {name: _column(table, name, "string") for name in self.keep}
        return Batch(features, passthrough)


def missing_columns(
    where: str, columns: Sequence[str], present: Sequence[str], *, keep: Sequence[str] = ()
) -> ConfigError:
    """`predict: WHERE: missing the model's column(s) ...; the model takes ...` (a file's, a
    served request's)."""
    missing = [name for name in (*columns, *keep) if name not in present]
    wanted = "the model's" if any(m in columns for m in missing) else "--keep"
    return ConfigError(
        f"predict: {where}: missing {wanted} column(s) {', '.join(missing)}; the model takes "
        f"{', '.join(columns)}"
    )


def _column(table, name: str, dtype: str) -> np.ndarray:
    values = table.column(name).to_numpy(zero_copy_only=False)
    return values.astype(object) if dtype == "string" else values.astype(dtype)


def _rebatch(record_batches, batch_size: int, make) -> Iterator[Batch]:
    """pyarrow's record batches (sizes of its choosing) as batches of `batch_size` rows."""
    import pyarrow as pa

    pending = []
    rows = 0
    for batch in record_batches:
        pending.append(batch)
        rows += batch.num_rows
        while rows >= batch_size:
            table = pa.Table.from_batches(pending)
            yield make(table.slice(0, batch_size))
            rest = table.slice(batch_size)
            pending, rows = rest.to_batches(), rest.num_rows
    if rows:
        yield make(pa.Table.from_batches(pending))


# --- arrays, images, texts, records ---------------------------------------------------------------
def check_shape(where: str, shape: Sequence[int], expected: Sequence[int]) -> None:
    if list(shape) != list(expected):
        raise ConfigError(
            f"predict: {where}: examples of shape {list(shape)}, the model takes {list(expected)}"
        )


class Arrays:
    """Examples in `.npz` files (the array `key`, or a file's only array) or `.npy` files."""

    def __init__(self, files: list[Path], shape: Sequence[int], *, key: str):
        self.files, self.shape, self.key = files, list(shape), key
        self.sizes = [self._check(file) for file in files]

    def _array(self, file: Path) -> np.ndarray:
        try:
            if file.suffix.lower() == ".npy":
                return np.load(file, mmap_mode="r", allow_pickle=False)  # read as it is sliced
            reading.check_npz(file)  # sizes from its directory and headers, before inflating
            return self._load(file)
        except reading.UnreadableFile as error:
            raise ConfigError(f"predict: {error}") from None
        except (OSError, ValueError, EOFError) as error:  # NumPy's word for a damaged file
            raise ConfigError(
                f"predict: {file}: not a readable array file ({reading.first_line(error)})"
            ) from None

    def _load(self, file: Path) -> np.ndarray:
        with reading.open_file(file) as handle, np.load(handle, allow_pickle=False) as loaded:
            if isinstance(loaded, np.ndarray):
                return loaded
            names = list(loaded.keys())
            key = self.key if self.key in names else names[0] if len(names) == 1 else None
            if key is None:
                raise ConfigError(
                    f"predict: {file}: holds no array {self.key!r} (it has {', '.join(names)})"
                )
            return loaded[key]

    def _check(self, file: Path) -> int:
        """The file's example count, its shape and every value checked (before TensorFlow)."""
        array = self._array(file)
        check_shape(str(file), array.shape[1:], self.shape)
        if not np.issubdtype(array.dtype, np.number) or array.dtype.kind == "c":
            raise ConfigError(f"predict: {file}: holds {array.dtype}, not real numbers")
        name = self.key if file.suffix.lower() == ".npz" else "x"
        for start in range(0, len(array), CHECK_ROWS):  # a mapped .npy in pieces
            try:
                check_finite_array(
                    str(file), name, np.asarray(array[start : start + CHECK_ROWS]), first_row=start
                )
            except ValueError as error:  # training's own line (tfrecipe.data.npz)
                raise ConfigError(f"predict: {error}") from None
        return len(array)

    def num_rows(self) -> int:
        return sum(self.sizes)

    def batches(self, batch_size: int) -> Iterator[Batch]:
        for file in self.files:
            array = self._array(file)
            for start in range(0, len(array), batch_size):
                chunk = np.asarray(array[start : start + batch_size])
                index = np.arange(start, start + len(chunk))
                yield Batch(chunk, {"path": np.full(len(chunk), str(file), object), "index": index})


class Images:
    """Image files, decoded and resized to the model's [height, width, channels] as training's
    image folders are (uint8 pixels; the run's normalization scales them)."""

    def __init__(self, files: list[Path], shape: Sequence[int]):
        self.files, self.shape = files, list(shape)

    def num_rows(self) -> int:
        return len(self.files)

    def batches(self, batch_size: int) -> Iterator[Batch]:
        import tensorflow as tf

        from tfrecipe.data import image_folder

        height, width, channels = self.shape
        for start in range(0, len(self.files), batch_size):
            chunk = self.files[start : start + batch_size]
            images = []
            for file in chunk:
                try:
                    data = reading.read_bytes(file, limit=reading.MAX_IMAGE_BYTES, what="an image")
                    image = image_folder.decode(data, channels)
                except reading.UnreadableFile as error:
                    raise ConfigError(f"predict: {error}") from None
                except tf.errors.OpError as error:
                    reason = reading.op_reason(error)
                    raise ConfigError(f"predict: {file}: not a readable image ({reason})") from None
                image = tf.image.resize(image, [height, width])
                images.append(tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8))
            paths = np.array([str(f) for f in chunk], dtype=object)
            yield Batch(np.stack([i.numpy() for i in images]), {"path": paths})


class Texts:
    """Text files, one example each, as raw strings (the model tokenizes them); each read once
    before TensorFlow to refuse one that is not UTF-8, as training's text folders refuse it."""

    def __init__(self, files: list[Path]):
        self.files = files
        for file in files:
            try:
                reading.read_text(file, limit=reading.MAX_TEXT_BYTES, what="a text example")
            except reading.UnreadableFile as error:
                raise ConfigError(f"predict: {error}") from None

    def num_rows(self) -> int:
        return len(self.files)

    def batches(self, batch_size: int) -> Iterator[Batch]:
        for start in range(0, len(self.files), batch_size):
            chunk = self.files[start : start + batch_size]
            try:
                texts = [reading.read_bytes(f, limit=reading.MAX_TEXT_BYTES) for f in chunk]
            except reading.UnreadableFile as error:
                raise ConfigError(f"predict: {error}") from None
            texts = np.array(texts, dtype=object)
            yield Batch(texts, {"path": np.array([str(f) for f in chunk], dtype=object)})


class Records:
    """TFRecord files of `tf.train.Example`s, parsed as the run's `dataset=tfrecord` config says
    (its feature key and kind; a label feature is not needed)."""

    def __init__(self, files: list[Path], shape: Sequence[int], *, dataset: Mapping[str, Any]):
        if not dataset.get("_target_", "").endswith("tfrecord.load"):
            raise ConfigError(
                f"predict: INPUT={files[0]}: TFRecord files need a run trained on dataset=tfrecord "
                "(its config names the feature to read)"
            )
        self.files, self.shape = files, list(shape)
        self.key, self.kind = (
            dataset.get("feature_key", "image"),
            dataset.get("feature_kind", "image"),
        )

    def num_rows(self) -> None:
        return None

    def batches(self, batch_size: int) -> Iterator[Batch]:
        import tensorflow as tf

        from tfrecipe import graph
        from tfrecipe.data import image_folder
        from tfrecipe.data.tfrecord import compression_of

        feature = {
            "image": tf.io.FixedLenFeature([], tf.string),
            "float": tf.io.FixedLenFeature(self.shape, tf.float32),
            "int": tf.io.FixedLenFeature(self.shape, tf.int64),
        }[self.kind]

        def decode(raw):
            if self.kind != "image":
                return raw
            image = image_folder.decode(raw, self.shape[2])
            return tf.ensure_shape(image, self.shape)

        for file in self.files:
            gzip = compression_of(file.name)
            records = tf.data.TFRecordDataset(str(file), compression_type=gzip).map(
                graph.plain(
                    lambda r: decode(tf.io.parse_single_example(r, {self.key: feature})[self.key])
                )
            )
            start = 0
            try:
                for chunk in records.batch(batch_size).as_numpy_iterator():
                    if self.kind == "float":  # as training's statistics would refuse them
                        _check_finite(file, self.key, chunk, start)
                    index = np.arange(start, start + len(chunk))
                    start += len(chunk)
                    paths = np.full(len(chunk), str(file), object)
                    yield Batch(chunk, {"path": paths, "index": index})
            except tf.errors.OpError as error:
                reason = reading.op_reason(error)
                raise ConfigError(f"predict: {file}: record {start}: {reason}") from None


def _check_finite(file: Path, name: str, values: np.ndarray, first_row: int) -> None:
    try:
        check_finite_array(str(file), name, values, first_row=first_row)
    except ValueError as error:
        raise ConfigError(f"predict: {error}") from None
