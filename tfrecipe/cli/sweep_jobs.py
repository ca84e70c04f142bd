"""A sweep's bookkeeping of its jobs: each job appends one line (its run dir, overrides, status,
main metrics) to a file the sweep's process reads when Hydra returns, and hands an optimizing
sweeper the value it optimizes.

A file, not this process's memory: jobs may run in other processes (the joblib launcher's
workers), which inherit its name through the environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from tfrecipe.rundir import summary_value

SWEEP_JOBS_ENV = "TFRECIPE_SWEEP_JOBS"


@contextlib.contextmanager
def jobs_file() -> Iterator[Callable[[], list[dict]]]:
    """A fresh SWEEP_JOBS_ENV file for this invocation; yields a function reading its records."""
    descriptor, path = tempfile.mkstemp(prefix="tfrecipe-sweep-jobs-", suffix=".jsonl")
    os.close(descriptor)
    os.environ[SWEEP_JOBS_ENV] = path
    try:
        yield lambda: [json.loads(line) for line in Path(path).read_text().splitlines()]
    finally:
        os.environ.pop(SWEEP_JOBS_ENV, None)
        Path(path).unlink(missing_ok=True)


def note_job(run_dir: Path, status: str, metrics: dict[str, float | None]) -> None:
    """Records a finished sweep job in SWEEP_JOBS_ENV's file (nothing outside a sweep)."""
    from hydra.core.hydra_config import HydraConfig

    path = os.environ.get(SWEEP_JOBS_ENV)
    if not path:
        return
    job = HydraConfig.get()
    overrides = dict(o.split("=", 1) for o in job.overrides.task if "=" in o)
    record = {"job": job.job.num, "run_dir": str(run_dir), "overrides": overrides}
    line = json.dumps({**record, "status": status, "metrics": metrics})
    with open(path, "a") as jobs:  # one write per line, appended: jobs never interleave
        jobs.write(f"{line}\n")


def main_metrics(summary: dict, objective: str) -> dict[str, float | None]:
    """What the table at the end of a sweep shows of a job: the objective the sweep optimizes
    and the test split's first metric (test_accuracy, test_mae, ...)."""
    tested = [f"test_{name}" for name in summary.get("test") or {} if name != "loss"]
    return {name: summary_value(summary, name) for name in dict.fromkeys([objective, *tested[:1]])}


def objective(summary: dict, metric: str) -> float:
    """The value optimizing sweepers minimize/maximize (NaN when the run has no such metric)."""
    value = summary_value(summary, metric)
    return float("nan") if value is None else value
