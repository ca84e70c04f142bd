"""Where a held dense job's training time goes, part by part, in one process (calls alternating).

    python scripts/bench_resident_parts.py                       # the MLP and the three tables
    python scripts/bench_resident_parts.py --jobs recipe:wine_tabular --rounds 25

Each job trains as `scripts/bench_limit.py` trains it (`tfrecipe.train`, its own config, the
training split held by `pipeline.resident=auto`); right after, in the same process, on the same
model and held split, these train functions are timed, one call of each per round, and each
figure is the median over the rounds of a call's time per step, in microseconds:

- `limit`: `model.train_step` on one held batch in a graph loop of 25 calls' worth of steps:
  the in-graph compute limit of `bench_limit.py` (no input, no Python per step);
- `limit_per_call`: the same loop, the run's steps per call: what a call costs besides its
  steps (fit calls its train function once per `steps_per_execution` steps, and never across
  an epoch's end);
- `nested`: the run's steps per call, each step a `tf.function` call of its own inside the loop
  (as tfrecipe's resident call runs them), on the one batch;
- `held_no_clock`: tfrecipe's resident train function (tfrecipe.loops.resident_fit) without
  the input clock's stamps: the batch sliced from the held split per step;
- `held`: the same with the stamps: what fit runs.

And per epoch, in microseconds, fit's callbacks' hooks inside the throughput's window
(`on_epoch_begin`, `on_train_batch_begin/end`, medians over the run's epochs after the first
five). Each row names the machine's load; the parts are differences of medians, so read them
as estimates, and rerun where the load moved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout runs its own tfrecipe

import bench_limit

JOBS = ["mlp", "recipe:wine_tabular", "recipe:breast_cancer_binary", "recipe:diabetes_regression"]
HOOKS = ("on_epoch_begin", "on_train_batch_begin", "on_train_batch_end")


def train_functions(model, train_data) -> dict:
    """{name: (call(), steps it runs)} on the run's model and held split (see the docstring)."""
    import tensorflow as tf

    from tfrecipe.data.resident import ResidentTrain
    from tfrecipe.loops import resident_fit

    held, steps = train_data.held, int(model.steps_per_execution)
    clocked = model.train_step
    raw = getattr(clocked, "__wrapped_step__", clocked)
    batch = held.batch_at(tf.constant(0, tf.int64))
    one_step = tf.function(raw, reduce_retracing=True)

    @tf.function
    def inline(count):
        for _ in tf.range(count):
            raw(batch)
        return tf.constant(0)

    @tf.function
    def nested(count):
        for _ in tf.range(count):
            one_step(batch)
        return tf.constant(0)

    held_call = resident_fit._train_function(model, iter(ResidentTrain(held)))
    model.train_step = raw
    no_clock = resident_fit._train_function(model, iter(ResidentTrain(held)))
    model.train_step = clocked
    return {
        "limit": (lambda: inline(tf.constant(25 * steps)), 25 * steps),
        "limit_per_call": (lambda: inline(tf.constant(steps)), steps),
        "nested": (lambda: nested(tf.constant(steps)), steps),
        "held_no_clock": (lambda: no_clock(None), steps),
        "held": (lambda: held_call(None), steps),
    }


def time_rounds(functions: dict, rounds: int) -> dict[str, float]:
    """Median microseconds per step of each function, calls alternating over `rounds`."""
    import tensorflow as tf

    def call(function):
        tf.nest.map_structure(lambda t: t.numpy(), function())

    for function, _ in functions.values():
        for _ in range(3):
            call(function)  # traced, warmed up
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(rounds):
        for name, (function, steps) in functions.items():
            repeats = max(1, 200 // steps)
            start = time.perf_counter()
            for _ in range(repeats):
                call(function)
            seconds[name].append((time.perf_counter() - start) / repeats / steps)
    return {name: round(statistics.median(s) * 1e6, 1) for name, s in seconds.items()}


def timed_hooks() -> dict[str, list[float]]:
    """Times fit's calls of its callbacks' hooks (all callbacks together) from now on; returns
    the seconds of each call, by hook."""
    from keras.src.callbacks import callback_list

    spent: dict[str, list[float]] = {}
    for hook in HOOKS:
        setattr(
            callback_list.CallbackList,
            hook,
            _timed(getattr(callback_list.CallbackList, hook), hook, spent),
        )
    return spent


def _timed(function, hook: str, spent: dict):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent.setdefault(hook, []).append(time.perf_counter() - start)

    return timed


def timed_fit_calls() -> list[float]:
    """Times each call of the resident train functions fit makes from now on (seconds)."""
    from tfrecipe.loops import resident_fit

    calls: list[float] = []
    make = resident_fit._train_function

    def train_function(model, iterator):
        function = _timed(make(model, iterator), "call", {"call": calls})
        return function

    train_function.__wrapped__ = make
    resident_fit._train_function = train_function
    return calls


def run_job(name: str, rounds: int) -> dict:
    spent, fit_calls = timed_hooks(), timed_fit_calls()

    def parts(model, train_data, global_batch):
        from tfrecipe.loops import resident_fit

        resident_fit._train_function = resident_fit._train_function.__wrapped__  # fit's calls end
        if not hasattr(train_data, "held"):
            return {"streamed": "the job's training split streams: nothing held to take apart"}
        return time_rounds(train_functions(model, train_data), rounds)

    load = os.getloadavg()[0]
    summary, kept = bench_limit.train_keeping([*bench_limit.JOBS[name], "loop.epochs=40"], parts)
    epochs, steps = summary["epochs_completed"], summary["steps_per_execution"]
    # per epoch: a call's median times the calls an epoch makes (the first five epochs left out)
    hooks = {
        hook: round(statistics.median(s[5 * len(s) // epochs :]) * 1e6 * len(s) / epochs, 1)
        for hook, s in spent.items()
        if s
    }
    return {
        "job": name,
        "load": [round(load, 1), round(os.getloadavg()[0], 1)],
        "steps_per_call": steps,
        "us_per_step": kept["measured"],
        "hooks_us_per_epoch": hooks,
        # None where fit made no resident call: a streamed split, or the custom loop
        "fit_call_us_per_step": round(
            statistics.median(fit_calls[5 * len(fit_calls) // epochs :]) * 1e6 / steps, 1
        )
        if fit_calls
        else None,
        "fit_us_per_step": round(
            summary["global_batch_size"] / summary["examples_per_sec"] * 1e6, 1
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=JOBS, choices=list(bench_limit.JOBS))
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    for name in options.jobs:
        child = _one_process(name, options.rounds)
        print(json.dumps(child))
        sys.stdout.flush()


def _one_process(name: str, rounds: int) -> dict:
    """One job in a process of its own (TensorFlow started afresh)."""
    import subprocess

    command = [sys.executable, __file__, "--one", name, str(rounds)]
    child = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"job": name, "failed": child.stderr[-300:]}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(run_job(sys.argv[2], int(sys.argv[3]))))
    else:
        main()
