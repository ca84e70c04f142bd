"""Overhead: tfrecipe against a plain hand-written Keras script doing the same work, in one run.

    python scripts/bench_overhead.py                          # the default cnn, batch 64
    python scripts/bench_overhead.py --model mlp --batch 128 --repeats 7

Both sides train the same architecture (tfrecipe's builder; the same layers written out by hand)
on the same synthetic data (`tfrecipe.data.bundled.synthetic`, float32 images or vectors) with the same
batch size, steps, optimizer, loss and metric, on the default strategy:

- tfrecipe: `tfrecipe.train.train` on the composed config with its defaults (its callbacks:
  throughput, history, TerminateOnNaN, the csv step logger), minus the best-model checkpoint
  (there is no validation to pick the best by);
- plain: `model.compile` + `model.fit` on a hand-written tf.data pipeline (cache, seeded
  shuffle, batch, repeat, prefetch).

Neither side validates, so an epoch is training only. Both are timed by the same callback,
`EpochClock` (epoch start to epoch end, no per-batch hook: it does not change how Keras
dispatches batch callbacks; on the tfrecipe side it comes from the config, as a user's callback
would), over the epochs after the first (tracing and warm-up excluded). Runs alternate (plain
first on every other repeat), so load from other processes falls on both alike; the ratio is the
median of the per-repeat ratios tfrecipe/plain. Besides examples per second (wall clock) the
table gives examples per CPU-second of this process, which other processes' load disturbs far
less on a shared machine. Extra arguments are overrides for the tfrecipe side (e.g.
`logger=none`), to see what a feature costs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras

SHAPES = {"cnn": [28, 28, 1], "mlp": [784]}  # the synthetic data's shape per model


class EpochClock(keras.callbacks.Callback):
    """Seconds of each epoch, from `on_epoch_begin` to `on_epoch_end`; the latest clock's
    epochs are in `EpochClock.latest` (tfrecipe builds its own instance from the config)."""

    latest: list[float] = []  # noqa: RUF012
    latest_cpu: list[float] = []  # noqa: RUF012 (CPU seconds of the process, all threads)

    def on_train_begin(self, logs=None):
        EpochClock.latest, EpochClock.latest_cpu = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._start_cpu = time.perf_counter(), time.process_time()

    def on_epoch_end(self, epoch, logs=None):
        EpochClock.latest.append(time.perf_counter() - self._start)
        EpochClock.latest_cpu.append(time.process_time() - self._start_cpu)


def steady_rates(examples_per_epoch: int) -> tuple[float, float]:
    """Examples per second and per CPU-second over the latest run's epochs after the first."""
    wall, cpu = EpochClock.latest[1:], EpochClock.latest_cpu[1:]
    examples = examples_per_epoch * len(wall)
    return examples / sum(wall), examples / sum(cpu)


# --- the two sides ----------------------------------------------------------------------------------
def run_tfrecipe(args: argparse.Namespace, run_dir: Path) -> tuple[tuple[float, float], dict]:
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    overrides = [
        f"model={args.model}",
        "dataset=synthetic",
        f"dataset.num_examples={args.examples}",
        f"dataset.shape=[{','.join(map(str, SHAPES[args.model]))}]",
        "dataset.validation_fraction=0",
        "dataset.test_fraction=0",
        f"batching.per_replica_batch_size={args.batch}",
        f"loop.epochs={args.epochs}",
        f"loop.steps_per_epoch={args.steps}",
        "loop.verbose=0",
        "callbacks.model_checkpoint.enabled=false",
        "+callbacks.extra.clock._target_=bench_overhead.EpochClock",
        "allowed_targets=[bench_overhead]",
        f"seed={args.seed}",
        *args.overrides,
    ]
    summary = train(compose(overrides), run_dir=run_dir)
    return steady_rates(args.steps * args.batch), summary


def plain_model(name: str, input_shape: list[int], num_classes: int):
    """tfrecipe's default mlp / cnn, written out by hand."""
    from keras import layers

    inputs = keras.Input(shape=tuple(input_shape))
    if name == "mlp":
        x = layers.Flatten()(inputs)
        x = layers.Dense(256, activation="relu")(x)
        x = layers.Dense(256, activation="relu")(x)
    else:  # cnn
        x = inputs
        for width in (32, 64):
            x = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
            x = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
            x = layers.MaxPooling2D()(x)
        x = layers.GlobalAveragePooling2D()(x)
        x = layers.Dense(128, activation="relu")(x)
        x = layers.Dropout(0.2)(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs)


def run_plain(args: argparse.Namespace, train_split) -> tuple[tuple[float, float], int]:
    import tensorflow as tf

    keras.backend.clear_session()
    keras.utils.set_random_seed(args.seed)
    dataset = (
        train_split.cache()
        .shuffle(10_000, seed=args.seed, reshuffle_each_iteration=True)
        .batch(args.batch)
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )
    model = plain_model(args.model, SHAPES[args.model], num_classes=10)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=0.003),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    model.fit(
        dataset,
        epochs=args.epochs,
        steps_per_epoch=args.steps,
        callbacks=[EpochClock()],
        verbose=0,
    )
    return steady_rates(args.steps * args.batch), model.count_params()


# --- the run --------------------------------------------------------------------------------------
def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=4, help="the first is not measured")
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "overrides", nargs="*", help="extra overrides for the tfrecipe side, e.g. logger=none"
    )
    args = parser.parse_args()

    # tfrecipe instantiates `bench_overhead.EpochClock`: this module, importable by that name,
    # and the same module object whose `EpochClock.latest` the plain side reads.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_overhead

    from tfrecipe.data.bundled import synthetic

    splits = synthetic(
        num_examples=args.examples,
        shape=SHAPES[args.model],
        num_classes=10,
        validation_fraction=0.0,
        test_fraction=0.0,
        split_seed=0,
    )
    sides = ("tfrecipe", "plain")
    wall: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = sides[::-1] if repeat % 2 else sides
            for side in order:
                if side == "tfrecipe":
                    rates, summary = bench_overhead.run_tfrecipe(args, Path(tmp, f"r{repeat}"))
                else:
                    rates, params = bench_overhead.run_plain(args, splits.train)
                wall[side].append(rates[0])
                cpu[side].append(rates[1])
            print(
                f"repeat {repeat + 1}/{args.repeats} ({' then '.join(order)}): examples/s "
                f"tfrecipe {wall['tfrecipe'][-1]:7.0f}  plain {wall['plain'][-1]:7.0f}  "
                f"ratio {wall['tfrecipe'][-1] / wall['plain'][-1]:.3f} | per CPU-second "
                f"ratio {cpu['tfrecipe'][-1] / cpu['plain'][-1]:.3f} | tfrecipe's summary "
                f"{summary['examples_per_sec']:.0f}",
                flush=True,
            )

    import tensorflow as tf

    print()
    print(
        f"{_cpu_name()}, {os.cpu_count()} cores; TensorFlow {tf.__version__}, Keras "
        f"{keras.__version__}; model={args.model} ({params:,} parameters), batch {args.batch}, "
        f"{args.steps} steps x {args.epochs} epochs (first excluded), {args.repeats} repeats"
        + (f"; tfrecipe overrides: {' '.join(args.overrides)}" if args.overrides else "")
    )
    print(f"{'':26} {'tfrecipe':>9} {'plain':>9} {'ratio':>7}")
    for name, measure in (("examples/s", wall), ("examples per CPU-second", cpu)):
        ratios = [t / p for t, p in zip(measure["tfrecipe"], measure["plain"], strict=True)]
        medians = [statistics.median(measure[side]) for side in sides]
        bests = [max(measure[side]) for side in sides]
        print(
            f"{name + ', median':26} {medians[0]:9.0f} {medians[1]:9.0f} "
            f"{statistics.median(ratios):7.3f}  (median of per-repeat ratios, "
            f"range {min(ratios):.3f}-{max(ratios):.3f})"
        )
        print(f"{name + ', best':26} {bests[0]:9.0f} {bests[1]:9.0f} {bests[0] / bests[1]:7.3f}")


if __name__ == "__main__":
    main()
