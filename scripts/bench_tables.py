"""Tables at any size: tfrecipe's dataset=csv / dataset=parquet on a generated table, against the
plain approaches a Keras user would write, in the same run.

    python scripts/bench_tables.py --rows 8000000          # issue 23's table (~700 MB as CSV)
    python scripts/bench_tables.py --rows 2000000 --only read

Generates (once, under --data-dir) a table of `--rows` rows: 10 numeric columns, 2 categorical
ones (8 cities, 3 plans) and a 0/1 label that depends on all of them, as CSV and as Parquet. Then:

- read: rows/s that reach the model's input (the training split's chunks rebatched to 1024
  rows, dict of columns) for tfrecipe's streamed reader (CSV and Parquet), and for tf.data's
  `TextLineDataset(...).batch(1024).map(decode_csv)` on the same CSV (the TensorFlow guide's
  way to stream a CSV file);
- train: `python -m tfrecipe dataset=csv|parquet task=binary model=mlp loop.steps_per_epoch=300`
  at batch 1024 with validation and test over their full splits, as a separate process: wall
  time, peak RSS (the process and its children), time to the first training step, test AUC;
  and a plain Keras script doing the same work the usual way (pyarrow reads the whole table
  into NumPy, `keras.Model.fit` on it): its wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
NUMERIC = [f"x{i}" for i in range(10)]
CATEGORICAL = ["city", "plan"]
CITIES = np.array(["Paris", "Lyon", "Lille", "Nantes", "Brest", "Nice", "Metz", "Tours"])
PLANS = np.array(["basic", "plus", "pro"])


def generate(rows: int, data_dir: Path) -> tuple[Path, Path]:
    """The table as CSV and as Parquet, written in chunks (bounded memory); kept for reruns."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    csv_path, parquet_path = data_dir / f"table{rows}.csv", data_dir / f"table{rows}.parquet"
    if csv_path.exists() and parquet_path.exists():
        return csv_path, parquet_path
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    csv_writer = parquet_writer = None
    for start in range(0, rows, 1_000_000):
        n = min(1_000_000, rows - start)
        chunk = _chunk(rng, n)
        if csv_writer is None:
            csv_writer = pacsv.CSVWriter(str(csv_path) + ".tmp", chunk.schema)
            parquet_writer = pq.ParquetWriter(str(parquet_path) + ".tmp", chunk.schema)
        csv_writer.write_table(chunk)
        parquet_writer.write_table(chunk, row_group_size=131_072)
    csv_writer.close()
    parquet_writer.close()
    os.replace(str(csv_path) + ".tmp", csv_path)
    os.replace(str(parquet_path) + ".tmp", parquet_path)
    del pa
    return csv_path, parquet_path


def _chunk(rng, n: int):
    import pyarrow as pa

    x = {name: rng.normal(size=n).astype("float32") for name in NUMERIC}
    city, plan = rng.integers(0, len(CITIES), n), rng.integers(0, len(PLANS), n)
    logit = 1.5 * x["x0"] - x["x1"] + 0.8 * x["x2"] * x["x3"] + 0.7 * (city % 3 - 1)
    logit += 0.9 * (plan - 1) + 0.5 * np.tanh(x["x4"] + x["x5"])
    label = (logit + 0.5 * rng.logistic(size=n) > 0).astype("int8")
    columns = {name: np.round(values, 4) for name, values in x.items()}
    return pa.table({**columns, "city": CITIES[city], "plan": PLANS[plan], "label": label})


# --- read -----------------------------------------------------------------------------------------
def read_rates(csv_path: Path, parquet_path: Path, seconds: float) -> dict[str, float]:
    import tensorflow as tf

    from tfrecipe.data import tabular

    rates = {}
    for name, builder, path in (
        ("tfrecipe csv", tabular.csv, csv_path),
        ("tfrecipe parquet", tabular.parquet, parquet_path),
    ):
        splits = builder(
            path=str(path),
            label="label",
            categorical=CATEGORICAL,
            stream=True,
            stats_rows=100_000,
        )
        rates[name] = _rows_per_s(splits.train.rebatch(1024).prefetch(4), seconds)

    defaults = [[0.0]] * len(NUMERIC) + [[""]] * len(CATEGORICAL) + [[0]]
    names = [*NUMERIC, *CATEGORICAL]

    def decode(lines):
        values = tf.io.decode_csv(lines, defaults)
        return dict(zip(names, values[:-1], strict=True)), values[-1]

    guide = (
        tf.data.TextLineDataset(str(csv_path))
        .skip(1)
        .batch(1024)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(4)
    )
    rates["tf.data TextLineDataset+decode_csv"] = _rows_per_s(guide, seconds)
    return rates


def _rows_per_s(dataset, seconds: float) -> float:
    rows, started = 0, time.perf_counter()
    for _, target in dataset:
        rows += int(target.shape[0])
        if time.perf_counter() - started > seconds:
            break
    return rows / (time.perf_counter() - started)


# --- train ----------------------------------------------------------------------------------------
def train_tfrecipe(kind: str, path: Path, out: Path) -> dict:
    run_dir = out / f"run-{kind}"
    args = [
        f"dataset={kind}",
        f"dataset.path={path}",
        "dataset.label=label",
        f"dataset.categorical=[{','.join(CATEGORICAL)}]",
        "task=binary",
        "model=mlp",
        "loop.epochs=1",
        "loop.steps_per_epoch=300",
        "loop.verbose=2",
        "batching.per_replica_batch_size=1024",
        "logger=none",
        f"hydra.run.dir={run_dir}",
    ]
    wall, peak, output = _measure([sys.executable, "-m", "tfrecipe", *args])
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "wall_s": wall,
        "peak_rss_gb": peak,
        "test_auc": summary["test"].get("auc"),
        "status": summary["status"],
        "statistics_pass_s": _statistics_pass(output),
    }


def train_keras(csv_path: Path) -> dict:
    """The usual way: the whole table into memory with pyarrow, then keras.Model.fit."""
    script = f"""
import numpy as np, pyarrow.csv as pc, keras
table = pc.read_csv({str(csv_path)!r})
n = table.num_rows
x = {{c: table[c].to_numpy().astype("float32") for c in {NUMERIC!r}}}
x |= {{c: table[c].to_numpy(zero_copy_only=False).astype(object) for c in {CATEGORICAL!r}}}
y = table["label"].to_numpy().astype("float32")
order = np.random.default_rng(0).permutation(n)
test, val, train = order[: n // 5], order[n // 5 : n // 5 + n // 10], order[n // 5 + n // 10 :]
inputs, parts = {{}}, []
for c in {NUMERIC!r}:
    inputs[c] = keras.Input(shape=(), name=c)
    norm = keras.layers.Normalization(axis=None, mean=x[c][train].mean(), variance=x[c][train].var())
    parts.append(keras.ops.expand_dims(norm(inputs[c]), -1))
for c in {CATEGORICAL!r}:
    inputs[c] = keras.Input(shape=(), dtype="string", name=c)
    parts.append(keras.layers.StringLookup(vocabulary=sorted(set(x[c][train][:100000])), output_mode="one_hot")(inputs[c]))
h = keras.layers.Concatenate()(parts)
for units in (256, 256):
    h = keras.layers.Dense(units, activation="relu")(h)
model = keras.Model(inputs, keras.layers.Dense(1)(h))
model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True),
              metrics=[keras.metrics.AUC(from_logits=True)])
take = lambda idx: {{c: v[idx] for c, v in x.items()}}
model.fit(take(train), y[train], batch_size=1024, steps_per_epoch=300, epochs=1,
          validation_data=(take(val), y[val]), verbose=2)
print("test", model.evaluate(take(test), y[test], batch_size=1024, verbose=0))
"""
    wall, peak, output = _measure([sys.executable, "-c", script])
    test = [line for line in output.splitlines() if line.startswith("test ")]
    return {"wall_s": wall, "peak_rss_gb": peak, "test [loss, auc]": test[-1:]}


def _measure(command: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS in GB of the command's largest process, and its output. A fresh
    Python parent runs it, so the peak is this command's alone (RUSAGE_CHILDREN only grows)."""
    with tempfile.NamedTemporaryFile("r", suffix=".peak") as peak_file:
        parent = (
            "import resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
            "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN)"
            ".ru_maxrss)); sys.exit(code)"
        )
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-c", parent, peak_file.name, *command],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        wall = time.perf_counter() - started
        peak_kb = int(Path(peak_file.name).read_text() or 0)
    if result.returncode:
        raise SystemExit(f"{command[:4]} failed:\n{result.stderr[-3000:]}")
    return wall, peak_kb / 1e6, result.stdout + result.stderr


def _statistics_pass(output: str) -> float | None:
    for line in output.splitlines():
        if "statistics pass:" in line:
            return float(line.rsplit(" in ", 1)[1].split("s")[0])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8_000_000)
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "tfrecipe-bench"
    )
    parser.add_argument("--only", choices=["read", "train", "keras"], default=None)
    parser.add_argument("--read-seconds", type=float, default=10.0)
    parser.add_argument("--no-keras", action="store_true", help="skip the plain Keras script")
    args = parser.parse_args()
    csv_path, parquet_path = generate(args.rows, args.data_dir)
    print(
        f"table: {args.rows:,} rows; CSV {csv_path.stat().st_size / 1e6:.0f} MB, "
        f"Parquet {parquet_path.stat().st_size / 1e6:.0f} MB",
        flush=True,
    )
    if args.only in (None, "read"):
        for name, rate in read_rates(csv_path, parquet_path, args.read_seconds).items():
            print(f"read  {name:36s} {rate / 1e3:8.0f}k rows/s", flush=True)
    if args.only in (None, "train"):
        with tempfile.TemporaryDirectory() as out:
            for kind, path in (("csv", csv_path), ("parquet", parquet_path)):
                print(f"train tfrecipe {kind}: {train_tfrecipe(kind, path, Path(out))}", flush=True)
    if args.only in (None, "keras") and not args.no_keras:
        print(f"train plain keras (csv in memory): {train_keras(csv_path)}", flush=True)


if __name__ == "__main__":
    main()
