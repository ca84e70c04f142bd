"""What `logger=mlflow` costs a run: the wall time of the same training run with
`logger=[csv]` and `logger=[csv,mlflow]`, alternated in one process so both see the same machine
load; the ratio is the figure (docs/tracking.md).

    python scripts/bench_mlflow.py [--repeats 3] [--epochs 3]

Both arms train the default recipe (digits, the CNN) for `--epochs` epochs in a fresh run dir.
The MLflow arm uses its default store (a new sqlite file in the run dir: MLflow creates its
tables first, a one-off cost each new store pays) and logs artifacts; `--store` points both
MLflow runs of an arm at one sqlite file made beforehand, which measures the per-run cost alone
(a sweep's jobs share the sweep dir's store this way).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def one_run(overrides: list[str], run_dir: Path) -> float:
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    started = time.perf_counter()
    train(compose(["loop.verbose=0", *overrides]), run_dir=run_dir)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--store", action="store_true", help="one sqlite store made beforehand")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        common = [f"loop.epochs={options.epochs}"]
        mlflow = ["logger=[csv,mlflow]"]
        if options.store:
            uri = f"sqlite:///{root / 'shared.db'}"
            mlflow.append(f"logger.mlflow.tracking_uri={uri}")
            one_run([*common, *mlflow, "loop.epochs=1"], root / "warm-store")
        one_run([*common, "loop.epochs=1"], root / "warm-up")  # TensorFlow's first-run costs
        times: dict[str, list[float]] = {"csv": [], "csv+mlflow": []}
        for repeat in range(options.repeats):
            times["csv"].append(one_run([*common, "logger=[csv]"], root / f"csv{repeat}"))
            times["csv+mlflow"].append(one_run([*common, *mlflow], root / f"mlflow{repeat}"))
    base, tracked = (statistics.median(times[k]) for k in ("csv", "csv+mlflow"))
    for name, values in times.items():
        print(f"{name:11s} median {statistics.median(values):6.2f} s  runs {values}")
    print(f"ratio csv+mlflow / csv: {tracked / base:.2f}x  (+{tracked - base:.2f} s per run)")


if __name__ == "__main__":
    main()
