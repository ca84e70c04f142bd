"""The user's table files (CSV or Parquet), read in Arrow record batches with pyarrow.

Nothing here holds a whole table: `read` streams one *unit* (a CSV file, or one row group of a
Parquet file) as record batches, each with the index of its first row in its file, so callers
can stream, shard and split by row without materializing. A bad cell raises one `ValueError`
line naming the file, its line (CSV) or row (Parquet) and the column: Arrow's own messages name
neither, so the reader finds the cell itself (`_locate_csv_cell`), on that rare path only.

No TensorFlow here: the statistics pass and `tfrecipe validate` read files without it.
"""

from __future__ import annotations

import csv as csvlib
import dataclasses
import glob
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from tfrecipe import reading
from tfrecipe.data import booleans, csv_text
from tfrecipe.data.listing import folder_files
from tfrecipe.data.values import CellError, number_fault

Format = Literal["csv", "parquet"]

# Arrow parses CSV files in blocks of this many bytes; a row must fit in one. Larger blocks
# parse no faster here (2-core machines) and hold more memory per reader.
CSV_BLOCK_BYTES = 4 << 20
CSV_SUFFIXES = (".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz", ".txt.gz")
PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


@dataclasses.dataclass(frozen=True)
class Unit:
    """The smallest piece of a table a worker reads on its own: a file, or a Parquet row group."""

    file: str
    row_group: int | None = None  # Parquet only
    first_row: int = 0  # the index in `file` of this unit's first row
    num_rows: int | None = None  # known up front for Parquet, not for CSV


@dataclasses.dataclass(frozen=True)
class CsvOptions:
    delimiter: str = ","
    header: bool = True
    column_names: tuple[str, ...] | None = None
    na_values: tuple[str, ...] = ()

    def __post_init__(self):
        # a tab cannot be typed in a Hydra override: `dataset.delimiter='\t'` arrives as "\\t"
        if self.delimiter == "\\t":
            object.__setattr__(self, "delimiter", "\t")
        if not isinstance(self.delimiter, str) or len(self.delimiter) != 1:
            raise ValueError(
                f"delimiter={self.delimiter!r}: one character separates the values "
                "(',', ';', '|', or '\\t' for a tab)"
            )


@dataclasses.dataclass(frozen=True)
class Table:
    """A table's files, as the config named them, and their columns.

    Attributes:
      key: the config key that named the files (for messages: `path`, `validation_path`, ...).
      root: the directory the files' names are taken relative to (their split hash uses that
        name, so moving the whole table keeps every row's split).
      partitions: hive partition columns (`DIR/year=2024/...`), whose values come from the path.
    """

    format: Format
    key: str
    files: tuple[str, ...]
    columns: tuple[str, ...]
    root: str
    csv: CsvOptions = CsvOptions()
    partitions: tuple[str, ...] = ()
    boolean_columns: tuple[str, ...] = ()  # CSV columns of true/false words (booleans.py)

    def relative(self, file: str) -> str:
        return os.path.relpath(file, self.root)

    def units(self) -> list[Unit]:
        """Every unit of the table, in a fixed order (files sorted, row groups in order)."""
        if self.format == "csv":
            return [Unit(file) for file in self.files]
        import pyarrow.parquet as pq

        units = []
        for file in self.files:
            try:
                metadata = pq.ParquetFile(file).metadata
            except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ...
                raise ValueError(
                    f"{file}: not a readable Parquet file ({_first_line(error)})"
                ) from None
            first = 0
            for group in range(metadata.num_row_groups):
                rows = metadata.row_group(group).num_rows
                units.append(Unit(file, group, first, rows))
                first += rows
        return units


def open_table(
    path: str, *, format: Format, key: str = "path", csv: CsvOptions = CsvOptions()
) -> Table:
    """The table at `path`: a file, a directory (every table file in it, recursively; hive
    partitions for Parquet) or a glob.

    Raises:
      ValueError: one line: nothing matches, a file of the wrong kind or not a regular file (a
        link to /dev/zero, a FIFO), an unreadable header, a column named twice, files whose
        columns differ.
    """
    files, root = _files(path, format=format, key=key)
    for file in files:  # streamed: no size cap, but a link to /dev/zero or a FIFO is refused
        reading.check_file(file, what=f"a {format} file of {key}")
    partitions = _partitions(files, root) if format == "parquet" else ()
    columns = [_columns(file, format=format, csv=csv) for file in files]
    for file, names in zip(files, columns, strict=True):
        if names != columns[0]:
            raise ValueError(
                f"{file}: columns ({', '.join(names)}) differ from those of {files[0]} "
                f"({', '.join(columns[0])}); every file of {key}={path!r} needs the same columns"
            )
    flags = _booleans(files[0], columns[0], csv) if format == "csv" else ()
    return Table(format, key, tuple(files), columns[0] + partitions, root, csv, partitions, flags)


def _files(path: str, *, format: Format, key: str) -> tuple[list[str], str]:
    expanded = str(Path(path).expanduser())
    suffixes = CSV_SUFFIXES if format == "csv" else PARQUET_SUFFIXES
    if os.path.isdir(expanded):
        # the folder's list as the fingerprint takes it (hidden files and folders left out),
        # less Spark's and Hive's `_SUCCESS`-style markers
        listed = folder_files(expanded, suffixes)
        files = [str(f) for f in listed if not f.name.startswith("_")]
        if not files:
            raise ValueError(
                f"{key}={path!r}: a directory with no {format} file in it (looked for "
                f"{', '.join('*' + s for s in suffixes)}); name a file, a directory or a glob"
            )
        return files, expanded
    files = sorted(glob.glob(expanded, recursive=True))
    if not files:
        raise ValueError(f"{key}={path!r}: no file matches it")
    folders = [file for file in files if os.path.isdir(file)]
    if folders:
        raise ValueError(
            f"{key}={path!r}: matches the directory {folders[0]}; a glob must match files "
            "(name the directory itself to read every file in it)"
        )
    root = os.path.dirname(os.path.commonpath(files)) if len(files) == 1 else None
    return files, root or os.path.commonpath([os.path.dirname(f) for f in files])


def _partitions(files: list[str], root: str) -> tuple[str, ...]:
    """The hive partition columns (`key=value` folders) every file's path has below `root`."""
    names = [
        tuple(part.split("=", 1)[0] for part in Path(os.path.relpath(f, root)).parts[:-1])
        for f in files
    ]
    if not all(all("=" in p for p in Path(os.path.relpath(f, root)).parts[:-1]) for f in files):
        return ()
    return names[0] if len(set(names)) == 1 else ()


def partition_values(table: Table, file: str) -> dict[str, str]:
    parts = Path(table.relative(file)).parts[:-1]
    return dict(part.split("=", 1) for part in parts)


def _columns(file: str, *, format: Format, csv: CsvOptions) -> tuple[str, ...]:
    """A file's column names, checked to be unique."""
    if format == "parquet":
        import pyarrow.parquet as pq

        try:
            with reading.open_file(file, what="a parquet file") as handle:
                names = tuple(pq.ParquetFile(handle).schema_arrow.names)
        except reading.UnreadableFile:
            raise
        except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ...
            raise ValueError(
                f"{file}: not a readable Parquet file ({_first_line(error)})"
            ) from None
    elif not csv.header:
        if not csv.column_names:
            raise ValueError("header=false needs column_names: the names of the files' columns")
        names = tuple(csv.column_names)
    else:
        names = _csv_header(file, csv.delimiter)[0]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(
                f"{file}:1: column {name!r} appears twice in the header; every column needs its "
                "own name"
            )
        seen.add(name)
    return names


def _csv_header(file: str, delimiter: str) -> tuple[tuple[str, ...], int]:
    """The header's names, trimmed, and the number of lines up to its end (blank lines first
    included)."""
    try:
        with csv_text.open_text(file) as handle:
            reader = csv_text.reader(handle, delimiter)
            for values in reader:
                if values:
                    return tuple(name.strip() for name in values), reader.line_num
    except UnicodeDecodeError as error:
        raise ValueError(f"{file}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except (OSError, csvlib.Error, EOFError) as error:
        raise ValueError(f"{file}: cannot read it as CSV ({_first_line(error)})") from None
    raise ValueError(f"{file}: empty file; a CSV file needs a header line")


def _booleans(file: str, columns: tuple[str, ...], csv: CsvOptions) -> tuple[str, ...]:
    """The columns of true/false words, as the file's first rows show them."""
    records = (values for _, values in csv_text.records(file, csv.delimiter))
    try:
        if csv.header:
            next(records, None)
        return booleans.columns_of(records, columns, csv.na_values)
    except (UnicodeDecodeError, csvlib.Error):  # reading the file says it, with its line
        return ()


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


# --- reading --------------------------------------------------------------------------------------
def read(
    table: Table,
    unit: Unit,
    *,
    numeric: Sequence[str],
    strings: Sequence[str],
    batch_rows: int = 65_536,
) -> Iterator[tuple[int, object]]:
    """Yields `(first_row, record_batch)` for `unit`: the `numeric` columns as float32 (a
    missing cell null), the `strings` columns as UTF-8 strings (as written, surrounding spaces
    removed). `first_row` is the batch's first row's index in its file.

    Raises:
      ValueError: `file:line: column 'c': ...` for the first bad cell or ragged row.
    """
    if table.format == "csv":
        yield from _read_csv(table, unit.file, numeric, strings)
    else:
        yield from _read_parquet(table, unit, numeric, strings, batch_rows)


def _read_csv(table: Table, file: str, numeric: Sequence[str], strings: Sequence[str]):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    options = table.csv
    ragged: list[object] = []
    flags = table.boolean_columns

    def on_invalid_row(row) -> str:
        ragged.append(row)
        return "error"

    wanted = [*numeric, *strings]
    types = {name: pa.float32() for name in numeric} | {name: pa.string() for name in strings}
    types |= {name: pa.bool_() for name in numeric if name in flags}
    try:
        reader = pacsv.open_csv(
            file,
            read_options=pacsv.ReadOptions(
                block_size=CSV_BLOCK_BYTES,
                # the names as `_csv_header` read them (trimmed: `a, b` names `b`), the header
                # line skipped
                column_names=list(table.columns),
                skip_rows=_csv_header(file, options.delimiter)[1] if options.header else 0,
            ),
            # a quoted value may hold line breaks (spreadsheets export them), as Python's csv
            # module and pandas read it; on Arrow's serial reader this costs ~1% (docs/data.md)
            parse_options=pacsv.ParseOptions(
                delimiter=options.delimiter,
                newlines_in_values=True,
                invalid_row_handler=on_invalid_row,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                include_columns=wanted,
                null_values=list(options.na_values),
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                true_values=list(booleans.TRUE_WORDS),
                false_values=list(booleans.FALSE_WORDS),
            ),
        )
        first_row = 0
        for batch in reader:
            columns = [
                booleans.as_read(batch.column(i), string=name in strings, of_words=name in flags)
                for i, name in enumerate(batch.schema.names)
            ]
            batch = pa.RecordBatch.from_arrays(columns, names=batch.schema.names)
            yield first_row, batch
            first_row += batch.num_rows
    except pa.ArrowInvalid as error:
        raise _csv_problem(table, file, error, ragged) from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{file}: not UTF-8 text ({error.reason})") from None


def _csv_problem(table: Table, file: str, error, ragged: list) -> ValueError:
    """One line for Arrow's error: the row or cell it is about, with its line and column."""
    text = str(error)
    if ragged:
        row = ragged[0]
        line = _ragged_line(file, table, row.expected_columns)
        return ValueError(
            f"{file}:{line}: expected {row.expected_columns} values "
            f"({', '.join(table.columns)}), found {row.actual_columns}; every row needs one "
            "value per column"
        )
    if "straddling" in text or "block" in text:  # an unclosed quote runs to the file's end
        return ValueError(
            f'{file}: a quoted field that does not end (a " missing?); {_first_line(error)}'
        )
    # Arrow numbers a column by its place in the file
    match = re.search(r"column #(\d+): CSV conversion error", text)
    if match and int(match.group(1)) < len(table.columns):
        return _locate_csv_cell(table, file, table.columns[int(match.group(1))])
    return ValueError(f"{file}: cannot read it as CSV ({_first_line(error)})")


def _ragged_line(file: str, table: Table, width: int) -> int | str:
    """The line of the first row without `width` values (Arrow numbers rows only when it
    parses on one thread)."""
    records = csv_text.records(file, table.csv.delimiter)
    return next((line for line, values in records if len(values) != width), "?")


def _locate_csv_cell(table: Table, file: str, column: str) -> ValueError:
    """The first cell of `column` that is not a number, found by reading the file again with
    Python's csv module (the rare path: only after Arrow refused the file)."""
    index = table.columns.index(column)
    na = set(table.csv.na_values)
    records = csv_text.records(file, table.csv.delimiter)
    if table.csv.header:
        next(records, None)  # the header, wherever blank lines put it
    for line, values in records:
        cell = values[index] if index < len(values) else ""
        fault = number_fault(cell, na)
        if column in table.boolean_columns:  # a word Arrow reads; a number is not one
            fault = None if cell in booleans.WORDS else fault or "not a number"
        if fault:
            return CellError(f"{file}:{line}", column, cell, fault)
    return ValueError(f"{file}: column {column!r}: a cell is not a number")


def _physical_row(file: str, data_row: int, table: Table) -> tuple[int, list[str]]:
    """The line number (1-based) and cells of data row `data_row` (0-based, blank lines not
    counted): Python's csv module reads up to it, on the error path only."""
    first = 1 if table.csv.header else 0  # the header is the first record
    for row, (line, values) in enumerate(csv_text.records(file, table.csv.delimiter), start=-first):
        if row == data_row:
            return line, values
    return data_row + (2 if table.csv.header else 1), []


def bad_cell(table: Table, file: str, row: int, column: str) -> ValueError:
    """The error for the bad number at data row `row` (0-based) of `file`: a `CellError` that
    says where, what the cell holds and what is wrong with it."""
    if table.format == "parquet":
        return CellError(f"{file}: row {row + 1}", column, None, "missing or not finite")
    index = table.columns.index(column)
    line, values = _physical_row(file, row, table)
    cell = values[index] if index < len(values) else ""
    fault = number_fault(cell, frozenset())
    if fault is None:  # a number Python reads and Arrow did not
        return ValueError(f"{file}:{line}: column {column!r}: {cell!r} is not a number")
    return CellError(f"{file}:{line}", column, cell, fault)


def where(table: Table, file: str, row: int) -> str:
    """`file:line` of a CSV file's data row `row` (0-based), `file: row N` of a Parquet one."""
    if table.format == "csv":
        return f"{file}:{_physical_row(file, row, table)[0]}"
    return f"{file}: row {row + 1}"


def _read_parquet(table: Table, unit: Unit, numeric, strings, batch_rows: int):
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    partitions = partition_values(table, unit.file)
    stored = [c for c in (*numeric, *strings) if c not in partitions]
    parquet = pq.ParquetFile(unit.file)
    types = {field.name: field.type for field in parquet.schema_arrow}
    for name in numeric:
        if name in types and not _is_number(types[name]):
            raise ValueError(
                f"{unit.file}: column {name!r} holds {types[name]}, not numbers; list it in "
                "dataset.categorical if it holds categories"
            )
    first_row = unit.first_row
    for batch in _parquet_batches(parquet, unit, batch_rows, stored):
        columns = {}
        for name in numeric:
            if name in partitions:
                value = _partition_number(unit.file, name, partitions[name])
                columns[name] = pa.array(np.full(batch.num_rows, value, "float32"))
            else:
                columns[name] = pc.cast(batch.column(name), pa.float32())
        for name in strings:
            values = (
                pa.array(np.full(batch.num_rows, partitions[name], object), pa.string())
                if name in partitions
                else pc.cast(batch.column(name), pa.string())
            )
            columns[name] = pc.utf8_trim_whitespace(values)
        yield first_row, pa.RecordBatch.from_pydict(columns)
        first_row += batch.num_rows


def _parquet_batches(parquet, unit: Unit, batch_rows: int, columns: list[str]):
    """The record batches of a row group; a page that cannot be read (corrupt, truncated) is one
    line naming the file, the row group and its rows, not pyarrow's traceback."""
    import pyarrow as pa

    batches = parquet.iter_batches(
        batch_size=batch_rows, row_groups=[unit.row_group], columns=columns
    )
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as error:
            last = unit.first_row + (unit.num_rows or 0)
            raise ValueError(
                f"{unit.file}: row group {unit.row_group} (rows {unit.first_row + 1}-{last}) "
                f"cannot be read ({_first_line(error)}); the file is damaged: rewrite it, or "
                "leave it out"
            ) from None
        yield batch


def _is_number(arrow_type) -> bool:
    import pyarrow.types as t

    return t.is_integer(arrow_type) or t.is_floating(arrow_type) or t.is_boolean(arrow_type)


def _partition_number(file: str, name: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(
            f"{file}: partition column {name!r}={value!r} is not a number; list it in "
            "dataset.categorical"
        ) from None
