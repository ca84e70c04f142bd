"""What measuring a run's performance costs: the default job with the step clock on (as shipped)
and off, alternating in one process, with a warm perf cache (FLOPs and peak cached, as on any
run after a machine's first).

    python scripts/bench_perf_overhead.py --pairs 3 --epochs 5

Reported: per pair, steady-state examples/s and wall time of both; the medians of the ratios
(on / off: throughput, wall) and the end-of-run measuring (`perf.overhead_s`) against wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(epochs: int, clock: bool) -> dict:
    from tfrecipe.config.compose import compose
    from tfrecipe.loops import fit
    from tfrecipe.perf import clock as clocks
    from tfrecipe.train import train

    fit.time_train_step = clocks.time_train_step if clock else (lambda model, c: False)
    with tempfile.TemporaryDirectory() as run_dir:
        summary = train(
            compose([f"loop.epochs={epochs}", "loop.verbose=0"]), run_dir=Path(run_dir) / "r"
        )
    return {
        "clock": clock,
        "examples_per_sec": summary["examples_per_sec"],
        "wall_time_s": summary["wall_time_s"],
        "overhead_s": summary["perf"]["overhead_s"],
        "input_wait": summary["perf"]["input_wait_fraction"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    options = parser.parse_args()
    run(2, True)  # warms the perf cache (FLOPs, peak) and the process
    throughput, wall, end = [], [], []
    for pair in range(options.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        results = {clock: run(options.epochs, clock) for clock in order}
        print(json.dumps(list(results.values())))
        on, off = results[True], results[False]
        throughput.append(on["examples_per_sec"] / off["examples_per_sec"])
        wall.append(on["wall_time_s"] / off["wall_time_s"])
        end.append(on["overhead_s"] / on["wall_time_s"])
    print(json.dumps({
        "throughput_on_over_off": round(statistics.median(throughput), 3),
        "wall_on_over_off": round(statistics.median(wall), 3),
        "end_of_run_share": round(statistics.median(end), 4),
        "ratios": [round(t, 3) for t in throughput],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
