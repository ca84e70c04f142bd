"""Small generated tables (CSV, Parquet) whose 0/1 label depends on every column, with an `id`
column, for the table-reading tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def table(rows: int, *, seed: int = 0, first_id: int = 0):
    """A pyarrow table: id, x0..x2 (numbers), city (8 categories), y (0/1, learnable)."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3)).astype("float32").round(4)
    city = rng.integers(0, 8, rows)
    logit = 2 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] + (city % 2) - 0.5
    return pa.table(
        {
            "id": np.arange(first_id, first_id + rows),
            "x0": x[:, 0],
            "x1": x[:, 1],
            "x2": x[:, 2],
            "city": np.array([f"c{c}" for c in city]),
            "y": (logit > 0).astype("int8"),
        }
    )


def write(path: Path, rows: int, **kwargs) -> Path:
    """The table as CSV or Parquet (by `path`'s suffix); Parquet in row groups of 256 rows."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    data = table(rows, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(data, path, row_group_size=256)
    else:
        pacsv.write_csv(data, path, pacsv.WriteOptions(quoting_style="none"))
    return path


def spreadsheet_export(path: Path, *, bad_last_row: bool = False) -> list[list[str]]:
    """A CSV as a spreadsheet exports notes of several lines (in quotes, their line breaks
    kept), past the first block of Arrow's CSV reader, with a long note across that block's
    end; columns x (a number), note (a category), y (0/1). With `bad_last_row` its last row's x
    is 'old'. Returns its rows as Python's csv module reads them, the header left out."""
    import csv

    from tfrecipe.data.table_files import CSV_BLOCK_BYTES

    call_log = "\n".join(f"call {i}: no answer" for i in range(40))  # 800 bytes, 40 lines
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["x", "note", "y"])
        row = 0
        while handle.tell() < CSV_BLOCK_BYTES * 1.1:
            lines = [f"visit {row % 4}", "called back", "asked for a refund"][: 1 + row % 3]
            near_the_end = 0 < CSV_BLOCK_BYTES - handle.tell() < 400
            writer.writerow([row % 7, call_log if near_the_end else "\n".join(lines), row % 2])
            row += 1
        if bad_last_row:
            writer.writerow(["old", "one\nmore", 1])
    with path.open(newline="") as handle:
        return list(csv.reader(handle))[1:]
