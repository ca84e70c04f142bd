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
