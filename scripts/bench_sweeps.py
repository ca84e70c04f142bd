"""What tfrecipe's Optuna sweeper saves: the wall time of a sweep with and without pruning, and
the idle share of `n_jobs=2` workers when one trial is about five times slower than the rest,
against the batch launch of today's stock plugin (measured in the same run: Hydra's basic
sweeper with `max_batch_size=2` on the joblib launcher, which, like the stock optuna sweeper,
launches two jobs and waits for both before the next two).

    python scripts/bench_sweeps.py [--trials 12] [--epochs 8] [--skip-pruning] [--skip-idle]

Every sweep is a real `python -m tfrecipe -m ...` on digits (model=mlp) in a temporary dir; the
figures are printed as a Markdown table. Idle share: the share of the two workers' time in which they held no trial while trials were
still waiting to start (from when both had begun their first trial, process start-up excluded for
both launches, to when the last trial started).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Six trials of 3 full digits epochs; one sleeps SLOW_S at each epoch's end
# (tests/helpers/slow_steps.py), which makes it five or more times as long as the others on the
# loaded 2-core machine (the others sleep 0-4 ms: a grid needs distinct values).
SLEEPS = ("0.0", "0.001", "0.002", "0.003", "0.004")
SLOW_S = "30.0"


def _sweep(args: list[str], sweep_dir: Path) -> tuple[float, list[dict]]:
    """Runs one sweep; (wall seconds, each job's summary, with `ended`: when it was written)."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "tfrecipe", "-m", *args, f"hydra.sweep.dir={sweep_dir}"]
    result = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    files = [d / "summary.json" for d in sorted(sweep_dir.iterdir()) if d.name.isdigit()]
    summaries = [
        {**json.loads(f.read_text()), "ended": f.stat().st_mtime} for f in files if f.is_file()
    ]
    return wall, summaries


def pruning(root: Path, trials: int, epochs: int) -> list[tuple[str, ...]]:
    """A `trials`-trial TPE sweep (seed 0) of the learning rate, without and with the median
    pruner (3 startup trials, 2 warm-up epochs)."""
    common = [
        "hydra/sweeper=optuna",
        f"hydra.sweeper.n_trials={trials}",
        "hydra.sweeper.sampler.seed=0",
        "model=mlp",
        f"loop.epochs={epochs}",
        "loop.verbose=0",
        "optimizer.learning_rate=tag(log,interval(1e-5,1.0))",
    ]
    pruned = [
        "hydra/sweeper/pruner=median",
        "hydra.sweeper.pruner.n_startup_trials=3",
        "hydra.sweeper.pruner.n_warmup_steps=2",
    ]
    rows = []
    for name, extra in (("no pruning", []), ("median pruner", pruned)):
        wall, jobs = _sweep([*common, *extra], root / name.replace(" ", "_"))
        epochs_run = sum(job["epochs_completed"] for job in jobs)
        best = max(
            (j["metrics"].get("val_accuracy", 0) for j in jobs if j["status"] == "completed"),
            default=None,
        )
        n_pruned = sum(job["status"] == "pruned" for job in jobs)
        rows.append(
            (
                name,
                f"{wall:.0f}",
                f"{epochs_run}/{trials * epochs}",
                str(n_pruned),
                f"{best:.4f}" if best is not None else "-",
            )
        )
    base = float(rows[0][1])
    return [(*row, f"{base / float(row[1]):.2f}x") for row in rows]


def idle(root: Path) -> list[tuple[str, ...]]:
    """Six trials, two workers, one trial ~5x the others: tfrecipe's sweeper against a batch
    launch. Each trial runs from its end (summary.json written) back over its wall time; the idle
    share is that of the steady state (`_idle_share`)."""
    common = [
        "model=mlp",
        "loop.epochs=3",
        "loop.verbose=0",
        "allowed_targets=[tests.helpers]",
        "callbacks.backup.enabled=true",  # as the optuna sweeper runs its trials
        "+callbacks.extra.slow._target_=tests.helpers.slow_steps.SlowEpochs",
    ]
    sleeps = ",".join((SLOW_S, *SLEEPS))
    runs = {
        "optuna, n_jobs=2 (tfrecipe)": [
            "hydra/sweeper=optuna",
            "hydra/sweeper/sampler=grid",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.n_trials=6",
            f"+callbacks.extra.slow.seconds=choice({sleeps})",
            *common,
        ],
        "batches of 2 (stock: launch 2, wait for both)": [
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "hydra.sweeper.max_batch_size=2",
            f"+callbacks.extra.slow.seconds={sleeps}",
            *common,
        ],
    }
    rows = []
    for name, args in runs.items():
        sweep_dir = root / name.split(",")[0].split(" ")[0]
        wall, jobs = _sweep(args, sweep_dir)
        busy = [job["wall_time_s"] for job in jobs]
        spans = [(job["ended"] - job["wall_time_s"], job["ended"]) for job in jobs]
        share, steady = _idle_share(spans, workers=2)
        ordered = sorted(busy)
        rows.append(
            (
                name,
                f"{wall:.0f}",
                f"{steady:.0f}",
                f"{ordered[-1]:.1f} / {ordered[len(ordered) // 2]:.1f}",
                f"{share:.0%}",
            )
        )
    return rows


def _idle_share(spans: list[tuple[float, float]], workers: int) -> tuple[float, float]:
    """(idle share, seconds) of the time trials were still waiting to start: from when every
    worker had begun its first trial (process start-up excluded, for both launches) to when the
    last trial started. A worker idle then waits for nothing but its batch; after it, idling is
    the sweep's tail, the same for any launcher."""
    starts = sorted(start for start, _ in spans)
    begin, end = starts[workers - 1], starts[-1]
    points = sorted({begin, end, *(t for span in spans for t in span if begin < t < end)})
    idle = 0.0
    for left, right in itertools.pairwise(points):
        running = sum(start <= left and ended >= right for start, ended in spans)
        idle += max(0, workers - running) * (right - left)
    return idle / (workers * (end - begin)) if end > begin else 0.0, end - begin


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--skip-pruning", action="store_true")
    parser.add_argument("--skip-idle", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sweeps-") as root:
        if not options.skip_pruning:
            header = (
                "sweep",
                "wall s",
                "epochs trained",
                "pruned",
                "best val_accuracy",
                "speed-up",
            )
            print(_table(header, pruning(Path(root), options.trials, options.epochs)), flush=True)
        if not options.skip_idle:
            header = (
                "2 workers, 6 trials",
                "wall s",
                "s until the last trial started",
                "slowest / median trial s",
                "idle share",
            )
            print(_table(header, idle(Path(root))), flush=True)


if __name__ == "__main__":
    main()
