"""`tfrecipe baseline RUN_DIR [key=value ...]`: scikit-learn's baselines for a finished run.

Fits the task's standard baselines (tfrecipe/training/baselines.py) on the run's own split and
preprocessing, as `baseline=auto` does at the end of a run: the run's resolved config
(`RUN_DIR/config.yaml`) builds the data, its table statistics (`data_stats.json`) are reused,
and overrides change it (e.g. `baseline.max_rows=20000`, `dataset.path=...` on another machine).
Prints each baseline's metrics beside the model's and records them in `summary.json`
(`baselines`), where `tfrecipe compare` shows them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tfrecipe import rundir
from tfrecipe.config.grants import Grants
from tfrecipe.data.fingerprint import check_run_data
from tfrecipe.errors import ConfigError
from tfrecipe.runs import RunDir
from tfrecipe.training.dataset import load_splits


def baselines_of_run(run_dir: Path, overrides: list[str]) -> dict:
    """The baselines of the run in `run_dir`, recorded in its summary.json."""
    from tfrecipe.data.tabular import StatsCache
    from tfrecipe.training import baselines

    home = RunDir.at(run_dir)
    run = home.config(overrides, command="baseline")
    summary = home.summary()
    if summary is None:
        raise ConfigError(
            f"baseline: {run_dir} holds no {rundir.SUMMARY} (is it a tfrecipe run dir?)"
        )
    home.lock(command="baseline")  # refused while a run trains there: its summary is the run's
    # fitted beside the model's numbers: on the data the model was trained on, or allowed
    check_run_data(home, run, command="baseline")
    grants = Grants.of(run.allowed_targets)
    splits = load_splits(
        run.dataset,
        grants=grants,
        stats_cache=StatsCache(run_dir, chief=False),  # the run's own table statistics
        task=run.task,
    )
    baselines.check_fitting(
        splits, run.baseline, dataset=run.dataset.target, task=run.task, command="baseline"
    )
    fitted = baselines.fit_baselines(
        splits,
        task=run.task,
        pipeline=run.pipeline,
        max_rows=run.baseline.max_rows,
        seed=run.seed,
        grants=grants,
    )
    summary["baselines"] = fitted
    home.write_summary(summary)
    return fitted


def main(args: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="tfrecipe baseline", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("overrides", nargs="*", help="key=value changes to the run's config")
    parser.add_argument("--json", action="store_true", help="print the baselines as JSON")
    options = parser.parse_intermixed_args(args)
    if not options.run_dir.is_dir():
        raise ConfigError(f"baseline: {options.run_dir} is not a directory")
    fitted = baselines_of_run(options.run_dir, options.overrides)
    if options.json:
        print(json.dumps(fitted, indent=2))
        return
    from tfrecipe.training.baselines import lines

    summary = RunDir.at(options.run_dir).summary() or {}
    print("\n".join(lines(fitted, summary.get("test"))))
    print(f"recorded in {options.run_dir / rundir.SUMMARY}")
