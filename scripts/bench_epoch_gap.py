"""How much slower Keras' own fit runs a call right after a gap between epochs: plain Keras,
no tfrecipe, a wine-sized job (an MLP of 13 features, 32 units and 3 classes; 8 steps of 16
examples an epoch, one call of 8 steps each, as tfrecipe's plan runs `recipe=wine_tabular`).

    python scripts/bench_epoch_gap.py                 # 3 ms gaps, 600 epochs
    python scripts/bench_epoch_gap.py --gap-ms 1 --epochs 1200

Between two epochs fit runs its epoch's edges and, in a real run, validation and the epoch-end
callbacks. The call after that gap is what tfrecipe's held fit measures as "fit's call", slower
than the same calls back to back (docs/benchmarks.md, "An eleventh pass"). Here one fit runs,
and before each epoch a callback fills the gap with one of these, in turn, so the machine's
load falls on all alike:
- `none`: nothing;
- `sleep`: `time.sleep` (TensorFlow's threads idle and park; caches stay);
- `python`: pure Python work (the interpreter's allocations evict the caches; threads idle);
- `tf_ops`: 30 eager TensorFlow ops (what an epoch-end callback reading tensors does).

Prints, per kind, the median call time per step over the epochs after the first 20, in
microseconds, and its ratio to `none`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

KINDS = ("none", "sleep", "python", "tf_ops")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap-ms", type=float, default=3.0)
    parser.add_argument("--epochs", type=int, default=600)
    options = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)  # tfrecipe's auto on <= 2 cores
    rng = np.random.default_rng(0)
    x, y = rng.random((128, 13), dtype=np.float32), rng.integers(0, 3, 128)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).cache().repeat()
    model = keras.Sequential(
        [keras.Input((13,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)]
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile("adam", loss, metrics=["accuracy"], steps_per_execution=8)
    gaps = gap_callback(options.gap_ms / 1e3)
    load = os.getloadavg()[0]
    model.fit(data, epochs=options.epochs, steps_per_epoch=8, verbose=0, callbacks=[gaps])
    medians = {kind: statistics.median(s[20 // len(KINDS) :]) / 8 for kind, s in gaps.calls.items()}
    print(
        json.dumps(
            {
                "gap_ms": options.gap_ms,
                "load": [round(load, 1), round(os.getloadavg()[0], 1)],
                "us_per_step": {kind: round(s * 1e6, 1) for kind, s in medians.items()},
                "vs_none": {kind: round(s / medians["none"], 3) for kind, s in medians.items()},
            }
        )
    )


def gap_callback(seconds: float):
    """A Keras callback that fills each epoch's gap with the next kind in turn and times the
    call after it (`calls`: seconds, by kind). Made here: keras is imported in main."""
    import keras

    class Gaps(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls: dict[str, list[float]] = {kind: [] for kind in KINDS}

        def on_epoch_begin(self, epoch, logs=None):
            self.kind = KINDS[epoch % len(KINDS)]
            _fill(self.kind, seconds)

        def on_train_batch_begin(self, batch, logs=None):
            self.began = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.calls[self.kind].append(time.perf_counter() - self.began)

    return Gaps()


def _fill(kind: str, seconds: float) -> None:
    if kind == "sleep":
        time.sleep(seconds)
    elif kind == "python":
        began, kept = time.perf_counter(), {}
        while time.perf_counter() - began < seconds:
            kept[len(kept)] = str(len(kept)) * 3
    elif kind == "tf_ops":
        import tensorflow as tf

        for _ in range(30):
            tf.constant(1.0) + 1.0


if __name__ == "__main__":
    main()
