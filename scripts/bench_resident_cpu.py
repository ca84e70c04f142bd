"""Held against streamed training calls in one process, calls alternating: wall time, CPU time
and run-queue wait per step (why `pipeline.resident=auto` holds a dense model's split on a CPU
and streams a convolutional one's: tfrecipe/data/residency.py).

    python scripts/bench_resident_cpu.py                 # the default CNN and the MLP, digits
    python scripts/bench_resident_cpu.py --models mlp --calls 30

Both sides train one model, compiled once (Adam, `steps_per_execution` 20, batch 64, the
digits' first 1,257 rows as float32): `streamed` is Keras' own train function on a tf.data
pipeline (cache, shuffle, batch, prefetch, as tfrecipe streams it); `held` is tfrecipe's
resident train function (tfrecipe.loops.resident_fit) on the same rows held as tensors. Each
round calls every side once; the figures are medians over the rounds, per step:
- wall: the call's time;
- cpu: the process's CPU time during the call (`time.process_time`);
- run_queue: summed over the process's threads, the time they were runnable but waiting for a
  core (`/proc/self/task/*/schedstat`, Linux): what other processes cost them.
Both sides run under the same load, so read the ratios; the machine's load goes with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout runs its own tfrecipe

STEPS, BATCH = 20, 64


def run_queue_ns() -> int:
    """The nanoseconds this process's threads have waited runnable (0 where not Linux)."""
    total = 0
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                total += int(stat.read().split()[1])
        except (FileNotFoundError, IndexError, ValueError):
            continue
    return total


def build(model_name: str):
    """The model, compiled, and its two train functions: {"streamed": f, "held": f}."""
    import keras
    import tensorflow as tf
    from sklearn.datasets import load_digits

    from tfrecipe.data.resident import HeldSplit, Layout, ResidentTrain
    from tfrecipe.loops import resident_fit
    from tfrecipe.models.builders import cnn, mlp

    keras.utils.set_random_seed(0)
    x, y = load_digits(return_X_y=True)
    x, y = (x.reshape(-1, 8, 8, 1) / 16.0).astype("float32")[:1257], y[:1257].astype("int32")
    model = {"cnn": cnn, "mlp": mlp}[model_name](input_shape=(8, 8, 1), num_outputs=10)
    model.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=STEPS,
    )
    rows = tf.data.Dataset.from_tensor_slices((x, y)).cache().shuffle(2000, seed=1)
    streamed = rows.batch(BATCH).repeat().prefetch(tf.data.AUTOTUNE)
    model.fit(streamed, steps_per_epoch=STEPS, epochs=1, verbose=0)  # builds the metrics
    model.make_train_function(force=True)
    keras_function, iterator = model.train_function, iter(streamed)
    layout = Layout(BATCH, -(-len(x) // BATCH), 0)
    held = HeldSplit(
        (tf.constant(x), tf.constant(y)), strategy=model.distribute_strategy, layout=layout
    )
    held_function = resident_fit._train_function(model, iter(ResidentTrain(held)))
    return {"streamed": lambda: keras_function(iterator), "held": lambda: held_function(None)}


def measure(functions: dict, calls: int) -> dict:
    """Per side: the median wall, CPU and run-queue milliseconds per step over `calls` rounds."""
    for function in functions.values():  # traced, warmed
        function(), function()
    samples = {name: [] for name in functions}
    for _ in range(calls):
        for name, function in functions.items():
            wall, cpu, queue = time.perf_counter(), time.process_time(), run_queue_ns()
            float(function()["loss"])
            samples[name].append(
                (
                    (time.perf_counter() - wall) * 1e3 / STEPS,
                    (time.process_time() - cpu) * 1e3 / STEPS,
                    (run_queue_ns() - queue) / 1e6 / STEPS,
                )
            )
    return {
        name: {
            key: round(statistics.median(row[i] for row in rows), 3)
            for i, key in enumerate(("wall_ms", "cpu_ms", "run_queue_ms"))
        }
        for name, rows in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp"], choices=["cnn", "mlp"])
    parser.add_argument("--calls", type=int, default=15, help="rounds (each side once a round)")
    parser.add_argument("--intra-op-threads", type=int, default=1, help="1: tfrecipe's auto here")
    options = parser.parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(options.intra_op_threads)
    for name in options.models:
        sides = measure(build(name), options.calls)
        ratio = sides["streamed"]["wall_ms"] / sides["held"]["wall_ms"]
        print(json.dumps({"model": name, **sides, "held_speed_vs_streamed": round(ratio, 3)}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
