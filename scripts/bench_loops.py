"""Benchmark: loop=fit against loop=custom on the same work, in one process.

    python scripts/bench_loops.py                      # small MLP, steps per call 1 and 10
    python scripts/bench_loops.py --steps-per-loop 1 10 50 --repeats 5

Every run is a real `tfrecipe.train` run of the same config (synthetic vectors, an MLP, one
global batch, default strategy) that differs only in the loop: fit with
`batching.steps_per_execution=k` against custom with `loop.steps_per_loop=k`. Runs are
interleaved (for each k fit then custom, custom first on every other repeat) and repeated.

Two figures per run, both over the epochs after the first (tracing excluded, validation
excluded):
- examples/s: the run's own `examples_per_sec` (wall clock), what a user sees;
- examples per CPU-second: the CPU time of all this process's threads. On a machine shared with
  other processes the wall clock also counts the time they take; CPU time mostly does not, so
  this figure is the steadier one for comparing the loops.
The tables give medians over the repeats (best in brackets) and custom/fit as the median of the
ratios of runs made one after the other.
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

import keras


class CpuClock(keras.callbacks.Callback):
    """CPU seconds this process spends training in the epochs after the first, and their steps.

    Configured as a user callback (`callbacks.extra`), so both loops drive it; the latest
    instance is kept on the class for the script to read.
    """

    latest: CpuClock | None = None

    def on_train_begin(self, logs=None):
        self.steps, self.seconds = 0, 0.0
        type(self).latest = self

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.process_time()

    def on_train_batch_end(self, batch, logs=None):
        self._end, self._steps = time.process_time(), batch + 1

    def on_epoch_end(self, epoch, logs=None):
        if epoch > 0:
            self.steps += self._steps
            self.seconds += self._end - self._start


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def overrides(args: argparse.Namespace, loop: str, steps_per_loop: int) -> list[str]:
    knob = "batching.steps_per_execution" if loop == "fit" else "loop.steps_per_loop"
    return [
        "dataset=synthetic",
        f"dataset.num_examples={args.examples}",
        f"dataset.shape=[{args.features}]",
        "model=mlp",
        f"model.hidden_units=[{','.join(map(str, args.hidden_units))}]",
        f"batching.per_replica_batch_size={args.batch}",
        f"loop={loop}",
        f"{knob}={steps_per_loop}",
        f"loop.epochs={args.epochs}",
        f"loop.steps_per_epoch={args.steps_per_epoch}",
        "loop.verbose=0",
        "callbacks.model_checkpoint.enabled=false",
        "callbacks.progress.enabled=false",
        "+callbacks.extra.cpu_clock._target_=bench_loops.CpuClock",
        "allowed_targets=[bench_loops]",
        "logger=none",
    ]


def measure(args: argparse.Namespace, loop: str, k: int, root: Path) -> tuple[float, float]:
    """One run: (examples/s, examples per CPU-second)."""
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    run_dir = root / f"{loop}-{k}-{time.monotonic_ns()}"
    summary = train(compose(overrides(args, loop, k)), run_dir=run_dir)
    clock = sys.modules["bench_loops"].CpuClock.latest  # the instance the config made
    return summary["examples_per_sec"], clock.steps * args.batch / clock.seconds


def table(results: dict[tuple[str, int], list[float]], steps_per_loop: list[int], unit: str) -> str:
    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):,.0f} ({max(values):,.0f})"

    rows = [
        f"| steps per call | fit: {unit} | custom: {unit} | custom / fit |",
        "|---:|---:|---:|---:|",
    ]
    for k in steps_per_loop:
        fit, custom = results["fit", k], results["custom", k]
        ratio = statistics.median(c / f for c, f in zip(custom, fit, strict=True))
        rows.append(f"| {k} | {cell(fit)} | {cell(custom)} | {ratio:.2f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps-per-loop", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4, help="the first is not measured")
    parser.add_argument("--steps-per-epoch", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden-units", type=int, nargs="+", default=[64])
    parser.add_argument("--examples", type=int, default=4096)
    args = parser.parse_args()

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    wall: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            for k in args.steps_per_loop:
                # Alternate which loop goes first, so neither always runs after the other.
                for loop in ("fit", "custom")[:: 1 if repeat % 2 == 0 else -1]:
                    per_sec, per_cpu_sec = measure(args, loop, k, Path(root))
                    wall.setdefault((loop, k), []).append(per_sec)
                    cpu.setdefault((loop, k), []).append(per_cpu_sec)
                    print(
                        f"repeat {repeat + 1}: {loop:6} k={k:<3} {per_sec:,.0f} examples/s, "
                        f"{per_cpu_sec:,.0f} examples/CPU-s",
                        flush=True,
                    )

    import tensorflow as tf

    print(
        f"\nMLP {args.features}->{args.hidden_units}->10, global batch {args.batch}, "
        f"{args.epochs} epochs x {args.steps_per_epoch} steps (first epoch not measured), "
        f"{args.repeats} repeats; TensorFlow {tf.__version__}, {_cpu_name()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}\n"
    )
    print(table(cpu, args.steps_per_loop, "examples/CPU-s"), end="\n\n")
    print(table(wall, args.steps_per_loop, "examples/s"))


if __name__ == "__main__":
    main()
