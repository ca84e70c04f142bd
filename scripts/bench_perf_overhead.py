"""What measuring a run's performance costs: the default job with the step clock on (as shipped)
and off, alternating in one process, with a warm perf cache (FLOPs and peak cached, as on any
run after a machine's first).

    python scripts/bench_perf_overhead.py --pairs 3 --epochs 5
    python scripts/bench_perf_overhead.py --steps -- model=mlp    # per step, any job

Reported: per pair, steady-state examples/s and wall time of both; the medians of the ratios
(on / off: throughput, wall) and the end-of-run measuring (`perf.overhead_s`) against wall time.

Whole runs of a few seconds swing far more than the clock costs; `--steps` measures what it
costs per step instead: after a short run of the job, Keras' train function of that run's model
with the stamped step and with the plain one, called on the run's training input, alternating
(`--rounds` timings of each, at least 0.2 s apiece). Reported: ms per step of both, and the
median of the rounds' ratios (on / off).
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


def step_cost(overrides: list[str], rounds: int) -> dict:
    """Per step: the job's train function with the clock's stamps and without, alternating."""
    import time

    import tensorflow as tf
    from bench_limit import train_keeping  # this folder: the same run, kept

    _, kept = train_keeping([*overrides, "loop.epochs=2"])
    model, iterator = kept["model"], iter(kept["inputs"].train)
    stamped = model.train_step
    plain = getattr(stamped, "__wrapped_step__", None)
    if plain is None:
        return {"clock": "not on for this job"}
    functions = {}
    for name, step in (("on", stamped), ("off", plain)):
        model.train_step, model.train_function = step, None
        model.make_train_function()
        functions[name] = model.train_function

    def call(function):
        tf.nest.map_structure(lambda t: t.numpy(), function(iterator))

    calls = 1
    while True:  # as many calls as take 0.2 s
        start = time.perf_counter()
        for _ in range(calls):
            call(functions["off"])
        if time.perf_counter() - start > 0.2:
            break
        calls *= 2
    per_step = {name: [] for name in functions}
    steps = calls * model.steps_per_execution
    for _ in range(rounds):
        for name, function in functions.items():
            start = time.perf_counter()
            for _ in range(calls):
                call(function)
            per_step[name].append(1000 * (time.perf_counter() - start) / steps)
    ratios = [on / off for on, off in zip(per_step["on"], per_step["off"], strict=True)]
    return {
        "ms_per_step_on": round(statistics.median(per_step["on"]), 4),
        "ms_per_step_off": round(statistics.median(per_step["off"]), 4),
        "on_over_off": round(statistics.median(ratios), 3),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", action="store_true", help="the clock's cost per step")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("overrides", nargs="*", help="after --: the job (with --steps)")
    options = parser.parse_args()
    if options.steps:
        print(json.dumps(step_cost(options.overrides, options.rounds)))
        return
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
    print(
        json.dumps(
            {
                "throughput_on_over_off": round(statistics.median(throughput), 3),
                "wall_on_over_off": round(statistics.median(wall), 3),
                "end_of_run_share": round(statistics.median(end), 4),
                "ratios": [round(t, 3) for t in throughput],
            }
        )
    )


if __name__ == "__main__":
    main()
