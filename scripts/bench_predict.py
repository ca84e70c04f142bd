"""`tfrecipe predict` throughput on a generated CSV against `model.predict` on the same rows, and
the checked exports of a digits model (max abs difference, sizes, quantized accuracy).

    python scripts/bench_predict.py                  # 200k rows, 3 repeats
    python scripts/bench_predict.py --rows 1000000 --repeats 5

Trains two small runs in a temporary folder: the customers CSV (binary, numeric and categorical
columns) and an mlp on digits exported to every format with each LiteRT quantization. The CSV is
the customers' rows repeated to `--rows`. `predict` is timed in-process (TensorFlow already
loaded, model load included), reading the file and writing a CSV; `model.predict` gets the same
rows as in-memory columns (the file read once beforehand, not timed), batch size 1024 for both.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CUSTOMERS = REPO / "tests" / "data" / "customers.csv"
COLUMNS = ["age", "income", "visits", "city", "plan"]
QUICK = ["loop.epochs=3", "loop.verbose=0", "model=mlp"]


def _train(run_dir: Path, *overrides: str) -> dict:
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    return train(compose([*QUICK, *overrides]), run_dir=run_dir)


def _generated_csv(path: Path, rows: int) -> None:
    lines = CUSTOMERS.read_text().splitlines()
    header, body = lines[0], lines[1:]
    with open(path, "w") as f:
        f.write(header + "\n")
        for start in range(0, rows, len(body)):
            f.write("\n".join(body[: min(len(body), rows - start)]) + "\n")


def bench_predict(work: Path, rows: int, repeats: int) -> dict:
    import keras
    import numpy as np
    import pyarrow.csv as pa_csv

    from tfrecipe.cli.main import main

    run_dir = work / "customers"
    _train(
        run_dir,
        "dataset=csv",
        f"dataset.path={CUSTOMERS}",
        "dataset.label=churned",
        f"dataset.features=[{','.join(COLUMNS)}]",
        "dataset.categorical=[city,plan]",
        "task=binary",
    )
    table = work / "rows.csv"
    _generated_csv(table, rows)
    data = pa_csv.read_csv(table)
    columns = {
        name: data.column(name)
        .to_numpy(zero_copy_only=False)
        .astype(object if name in ("city", "plan") else "float32")
        for name in COLUMNS
    }
    model = keras.saving.load_model(run_dir / "model.keras")
    ours, theirs = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        main(
            [
                "predict",
                str(run_dir),
                str(table),
                "-o",
                str(work / "out.csv"),
                "--batch-size",
                "1024",
            ]
        )
        ours.append(rows / (time.perf_counter() - started))
        started = time.perf_counter()
        model.predict(columns, batch_size=1024, verbose=0)
        theirs.append(rows / (time.perf_counter() - started))
    assert np.isfinite(ours).all()
    return {
        "rows": rows,
        "predict_rows_per_s": statistics.median(ours),
        "model_predict_rows_per_s": statistics.median(theirs),
        "ratio": statistics.median(a / b for a, b in zip(ours, theirs, strict=True)),
    }


def bench_exports(work: Path) -> dict:
    results = {}
    formats = "export.formats=[keras,saved_model,onnx,litert]"
    for quantize in ("dynamic", "float16", "int8"):
        summary = _train(
            work / f"digits-{quantize}",
            formats,
            "model.hidden_units=[256]",
            "loop.epochs=10",
            f"export.litert.quantize={quantize}",
        )
        results[quantize] = summary["exports"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        report = {
            "machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} CPUs",
            "predict": bench_predict(work, args.rows, args.repeats),
            "exports": bench_exports(work),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
