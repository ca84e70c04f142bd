"""tfrecipe with its defaults against the hand-written Keras script of the guide, whole processes.

    python scripts/bench_vs_keras.py                      # both jobs, 5 repeats
    python scripts/bench_vs_keras.py --jobs mlp --repeats 7
    python scripts/bench_vs_keras.py -- batching.steps_per_execution=1   # a knob on tfrecipe's side
    python scripts/bench_vs_keras.py --knobs --jobs cnn --repeats 3      # the per-knob table
    python scripts/bench_vs_keras.py --bf16 --repeats 3                  # bf16 vs fp32, ResNet
                                                    # (and each with Keras' own BatchNormalization)

Two jobs on the bundled digits (the same stratified 70/10/20 split, seed 0, on both sides):

- `mlp`: the TensorFlow guide's Keras example, Dense 256-256-10, Adam 1e-3, batch 32, 10 epochs
  (`python -m tfrecipe model=mlp optimizer.learning_rate=0.001 batching.per_replica_batch_size=32
  loop.epochs=10`);
- `cnn`: tfrecipe's default job (`python -m tfrecipe`): its CNN, Adam 3e-3, batch 64, 15 epochs.

The hand-written side is a plain script, written out below (`HAND_WRITTEN`, no tfrecipe import):
the seed-style `model.compile` + `model.fit` of the guide (float32, `steps_per_execution=1`), no
validation, no plots, no exports. tfrecipe's side is `python -m tfrecipe` with its defaults, which
still validates every epoch, keeps the best weights, writes history, curves and the model.

Each repeat runs both sides as fresh processes, alternating which goes first, so load from other
processes falls on both alike. Reported per side: whole-process wall time, steady-state training
examples/s (epochs after the first; tfrecipe's from its summary.json) and test accuracy; ratios are
medians of the per-repeat ratios (wall: tfrecipe / hand, lower is better; throughput: tfrecipe /
hand, higher is better).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The guide-style script a user writes by hand: everything it needs is in this string.
HAND_WRITTEN = r"""
import json, sys, time
import numpy as np
import keras
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
import tensorflow as tf

job, epochs, batch, lr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
keras.utils.set_random_seed(0)
digits = load_digits()
x = (digits.images / 16.0).astype("float32")[..., None]
y = digits.target.astype("int32")
idx = np.arange(len(y))
train, rest = train_test_split(idx, test_size=0.1 + 0.2, random_state=0, stratify=y)
_, test = train_test_split(rest, test_size=0.2 / (0.1 + 0.2), random_state=0, stratify=y[rest])

inputs = keras.Input(shape=(8, 8, 1))
if job == "mlp":
    h = keras.layers.Flatten()(inputs)
    h = keras.layers.Dense(256, activation="relu")(h)
    h = keras.layers.Dense(256, activation="relu")(h)
else:
    h = inputs
    for width in (32, 64):
        h = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(h)
        h = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(h)
        h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = keras.layers.Dense(128, activation="relu")(h)
    h = keras.layers.Dropout(0.2)(h)
model = keras.Model(inputs, keras.layers.Dense(10)(h))
model.compile(
    optimizer=keras.optimizers.Adam(lr),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)

class Clock(keras.callbacks.Callback):
    # Each epoch's training time, as tfrecipe's Throughput counts it (no per-batch hook here: one
    # would turn off Keras' asynchronous batch-callback dispatch on this side).
    def on_train_begin(self, logs=None):
        self.seconds = []
    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)

train_ds = tf.data.Dataset.from_tensor_slices((x[train], y[train])).shuffle(2000).batch(batch)
clock = Clock()
model.fit(train_ds, epochs=epochs, callbacks=[clock], verbose=0)
_, accuracy = model.evaluate(x[test], y[test], verbose=0)
steady = sum(clock.seconds[1:])
print(json.dumps({"examples_per_sec": len(train) * (epochs - 1) / steady, "test_accuracy": accuracy}))
"""

JOBS = {
    # name: (tfrecipe overrides, hand-written arguments: epochs, batch, learning rate)
    "mlp": (
        [
            "model=mlp",
            "optimizer.learning_rate=0.001",
            "batching.per_replica_batch_size=32",
            "loop.epochs=10",
        ],
        ["10", "32", "0.001"],
    ),
    "cnn": ([], ["15", "64", "0.003"]),
}


def run_hand(job: str) -> dict:
    _, arguments = JOBS[job]
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", HAND_WRITTEN, job, *arguments],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    wall = time.perf_counter() - start
    return {**json.loads(out.strip().splitlines()[-1]), "wall_s": wall}


def run_tfrecipe(job: str, run_dir: Path, extra: list[str]) -> dict:
    overrides, _ = JOBS[job]
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tfrecipe", *overrides, *extra, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "examples_per_sec": summary["examples_per_sec"],
        "test_accuracy": summary["test"]["accuracy"],
        "wall_s": wall,
        "picked": {
            k: summary.get(k)
            for k in ("precision", "steps_per_execution", "jit_compile", "fused_batch_norm")
        },
    }


# The per-knob table: tfrecipe's side alone, each mean alone against all of them off.
KNOBS = {
    "all off (seed-style)": ["batching.steps_per_execution=1", "precision=fp32"],
    "steps_per_execution=auto": ["batching.steps_per_execution=auto", "precision=fp32"],
    "jit_compile=true": [
        "batching.steps_per_execution=1",
        "batching.jit_compile=true",
        "precision=fp32",
    ],
    "precision=auto": ["batching.steps_per_execution=1", "precision=auto"],
    "defaults": [],
    "defaults + precision=auto": ["precision=auto"],
}

# Goal 3: the cifar10_resnet_bf16 recipe's model on synthetic CIFAR-shaped data, fp32 vs bf16.
BF16_JOB = [
    "recipe=cifar10_resnet_bf16",
    "dataset=synthetic",
    "dataset.num_examples=2560",
    "dataset.shape=[32,32,3]",
    "dataset.num_classes=10",
    "loop.epochs=3",
    "loop.verbose=0",
]
# The CPU flags of native bfloat16 (as tfrecipe.precision reads them, without importing it).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# The policies with tfrecipe's defaults, then each with Keras' own (unfused) BatchNormalization.
BF16_SIDES = {
    "float32": ["precision=fp32"],
    "mixed_bfloat16": ["precision=mixed_bfloat16"],
    "float32, Keras BN": ["precision=fp32", "batching.fused_batch_norm=false"],
    "mixed_bfloat16, Keras BN": ["precision=mixed_bfloat16", "batching.fused_batch_norm=false"],
}


def run_sides(job: str, sides: dict[str, list[str]], repeats: int, tmp: str) -> None:
    """tfrecipe only, one process per side and repeat, the order rotated each repeat."""
    results: dict[str, list[dict]] = {name: [] for name in sides}
    names = list(sides)
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            run_dir = Path(tmp, f"{job}-{len(results[name])}-{names.index(name)}")
            results[name].append(run_tfrecipe(job, run_dir, sides[name]))
        print(f"{job} repeat {repeat + 1}/{repeats} done", flush=True)
    print(f"\n{job}: tfrecipe per knob, median (range) over {repeats} repeats")
    base = results[names[0]]
    print(f"{'':28} {'wall, s':>20} {'examples/s':>20} {'x ' + names[0]:>20} {'test acc':>8}")
    for name in names:
        rows = results[name]
        ratios = [
            r["examples_per_sec"] / b["examples_per_sec"] for r, b in zip(rows, base, strict=True)
        ]
        print(
            f"{name:28} {_spread([r['wall_s'] for r in rows], '.2f'):>20} "
            f"{_spread([r['examples_per_sec'] for r in rows], '.0f'):>20} "
            f"{_spread(ratios, '.2f'):>20} "
            f"{statistics.median(r['test_accuracy'] for r in rows):8.4f}  {rows[-1]['picked']}"
        )


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def report(job: str, results: dict[str, list[dict]]) -> None:
    hand, ours = results["hand"], results["tfrecipe"]
    wall_ratio = [t["wall_s"] / h["wall_s"] for t, h in zip(ours, hand, strict=True)]
    rate_ratio = [
        t["examples_per_sec"] / h["examples_per_sec"] for t, h in zip(ours, hand, strict=True)
    ]
    print(f"\n{job}: median (range) over {len(hand)} repeats; tfrecipe picked {ours[-1]['picked']}")
    print(f"{'':22} {'hand-written':>24} {'tfrecipe':>24} {'ratio':>22}")
    for name, key, fmt, ratios in (
        ("wall time, s", "wall_s", ".2f", wall_ratio),
        ("examples/s (steady)", "examples_per_sec", ".0f", rate_ratio),
        ("test accuracy", "test_accuracy", ".4f", None),
    ):
        row = f"{name:22} {_spread([r[key] for r in hand], fmt):>24} "
        row += f"{_spread([r[key] for r in ours], fmt):>24} "
        print(row + (f"{_spread(ratios, '.3f'):>22}" if ratios else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=["mlp", "cnn"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--knobs", action="store_true", help="tfrecipe alone, per knob")
    parser.add_argument("--bf16", action="store_true", help="ResNet, fp32 vs mixed_bfloat16")
    parser.add_argument("overrides", nargs="*", help="extra overrides for tfrecipe's side")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the same console noise on both sides

    print(f"{_cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.bf16:
            flags = set(Path("/proc/cpuinfo").read_text().split())
            native = sorted(flags.intersection(BF16_FLAGS))
            if not native:
                print(
                    "this CPU has no native bfloat16 (AVX512_BF16/AMX): the bf16 ratio is skipped"
                )
                return
            # AMX tiles run oneDNN's bf16 weight gradients too; AVX512_BF16 alone runs them on an
            # older kernel no faster than float32's (docs/benchmarks.md), so say which it is.
            print(f"native bfloat16 on this CPU: {', '.join(native)}")
            JOBS["resnet"] = (BF16_JOB, [])
            run_sides("resnet", BF16_SIDES, args.repeats, tmp)
            print(f"load average after: {os.getloadavg()}")
            return
        if args.knobs:
            for job in args.jobs:
                run_sides(
                    job, {k: [*v, *args.overrides] for k, v in KNOBS.items()}, args.repeats, tmp
                )
            print(f"load average after: {os.getloadavg()}")
            return
        for job in args.jobs:
            results: dict[str, list[dict]] = {"hand": [], "tfrecipe": []}
            for repeat in range(args.repeats):
                order = ("hand", "tfrecipe") if repeat % 2 == 0 else ("tfrecipe", "hand")
                for side in order:
                    if side == "hand":
                        results[side].append(run_hand(job))
                    else:
                        run_dir = Path(tmp, f"{job}-{repeat}")
                        results[side].append(run_tfrecipe(job, run_dir, args.overrides))
                print(
                    f"{job} repeat {repeat + 1}/{args.repeats}: wall hand "
                    f"{results['hand'][-1]['wall_s']:.2f}s tfrecipe "
                    f"{results['tfrecipe'][-1]['wall_s']:.2f}s",
                    flush=True,
                )
            report(job, results)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
