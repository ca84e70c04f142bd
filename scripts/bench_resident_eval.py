"""Held against streamed validation and test, whole runs in one process, runs alternating.

    python scripts/bench_resident_eval.py                      # wine_tabular and the MLP, 3 each
    python scripts/bench_resident_eval.py --jobs mlp --repeats 5

Both sides are the same job with its training split held (`pipeline.resident=auto` holds the
dense models' on a CPU): `held` also holds its validation and test splits and evaluates each in
one call (the default since this script's commit); `streamed` evaluates them through tf.data,
batch by batch, as before (`residency.evaluation` answers "streamed" for that run). Rounds
alternate the sides (and which runs first), so the machine's load falls on both; per side, the median over the rounds
of summary.json's `wall_time_s`, `perf.wall_split.validation` (the steady epochs' share in
validation) and `examples_per_sec`, and the test metrics (equal within float tolerance).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout runs its own tfrecipe

JOBS = {"recipe:wine_tabular": ["recipe=wine_tabular"], "mlp": ["model=mlp"]}


def one_run(overrides: list[str], *, held: bool) -> dict:
    """One training run of `overrides`; its evaluation splits held or streamed."""
    from tfrecipe.config.compose import compose
    from tfrecipe.data import residency
    from tfrecipe.train import train

    original = residency.evaluation
    if not held:
        residency.evaluation = lambda *a, **k: residency.Choice(False, "streamed (benchmark)")
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            summary = train(compose([*overrides, "loop.verbose=0"]), run_dir=Path(run_dir) / "r")
    finally:
        residency.evaluation = original
    return {
        "wall_time_s": summary["wall_time_s"],
        "validation_share": (summary.get("perf", {}).get("wall_split") or {}).get("validation"),
        "examples_per_sec": summary["examples_per_sec"],
        "test": summary.get("test"),
        "evaluation_held": summary["resident"]["evaluation"]["resident"],
    }


def compare(overrides: list[str], repeats: int) -> dict:
    """`repeats` rounds of (held, streamed); the medians per side and the held/streamed ratios."""
    runs: dict[str, list[dict]] = {"held": [], "streamed": []}
    for round_ in range(repeats):  # the first side alternates: neither always runs first
        for side in sorted(runs, reverse=bool(round_ % 2)):
            runs[side].append(one_run(overrides, held=side == "held"))
    result = {}
    for side, side_runs in runs.items():
        result[side] = {
            key: statistics.median(run[key] for run in side_runs)
            for key in ("wall_time_s", "validation_share", "examples_per_sec")
        }
        result[side]["test"] = side_runs[0]["test"]
        result[side]["evaluation_held"] = side_runs[0]["evaluation_held"]
    result["wall_ratio"] = result["held"]["wall_time_s"] / result["streamed"]["wall_time_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="*", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    for name in options.jobs:
        print(json.dumps({"job": name, **compare(JOBS[name], options.repeats)}), flush=True)


if __name__ == "__main__":
    main()
