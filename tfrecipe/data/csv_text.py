"""A CSV file as an editor shows it, read with Python's csv module: its records, each with the
line it starts on (blank lines and a quoted value's line breaks counted).

Arrow parses the files fast (`table_files`) but numbers neither lines nor rows; the header, the
true/false columns and every error's line come from here. No TensorFlow, no pyarrow.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
from collections.abc import Iterator

from tfrecipe import reading


def reader(handle, delimiter: str):
    """Python's csv reader (the error paths' exact line numbers) without its 128 KiB field
    limit: Arrow reads longer fields, so the error path must too."""
    csv.field_size_limit(2**31 - 1)
    return csv.reader(handle, delimiter=delimiter)


def records(file: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """Each record of `file` that is not a blank line, with the line it starts on (as an editor
    numbers lines: blank lines before the header, and a quoted value's line breaks, counted)."""
    with open_text(file) as handle:
        rows = reader(handle, delimiter)
        start = 1
        for values in rows:
            if values:
                yield start, values
            start = rows.line_num + 1


@contextlib.contextmanager
def open_text(file: str) -> Iterator[io.TextIOWrapper]:
    """A CSV file as text, opened by the one reader (a regular file only); utf-8-sig drops a
    byte-order mark (Excel writes one), as Arrow does."""
    with reading.open_file(file, what="a csv file") as raw:
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if file.endswith(".gz") else raw
        with io.TextIOWrapper(stream, encoding="utf-8-sig", newline="") as text:
            yield text
