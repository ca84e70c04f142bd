"""Benchmark: training throughput of every strategy on the same model and global batch, one run.

    python scripts/bench_strategies.py                        # all strategies, digits CNN
    python scripts/bench_strategies.py --global-batch 128 --steps 40 --strategies default mirrored

Each strategy runs the real command line (`python -m tfrecipe ...`, multi-worker ones on a local
cluster of real processes) on the bundled digits with the default CNN and one global batch,
and reports the run's own `examples_per_sec` (summary.json: epochs after the first, so tracing
and compilation are excluded; validation excluded). Replicas split the global batch:

- default, one_device: one replica, the whole global batch;
- mirrored, central_storage: 2 logical CPUs of this process, half the batch each;
- multi_worker_mirrored: 2 worker processes (cluster=local), half the batch each, gRPC all-reduce;
- parameter_server: 2 worker servers + 1 parameter server (cluster=local), loop=custom;
  asynchronous: each step is one whole global batch on one worker.

Prints a markdown table (docs/strategies.md records one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STRATEGIES = {
    "default": [],
    "one_device": [],
    "mirrored": ["strategy.logical_cpus=2"],
    "central_storage": ["strategy.logical_cpus=2"],
    "multi_worker_mirrored": ["cluster=local", "cluster.num_workers=2"],
    "parameter_server": [
        "cluster=local",
        "cluster.num_workers=2",
        "cluster.num_ps=1",
        "loop=custom",
    ],
}


def run(strategy: str, *, global_batch: int, steps: int, epochs: int, out: Path) -> dict:
    run_dir = out / strategy
    command = [
        sys.executable,
        "-m",
        "tfrecipe",
        f"strategy={strategy}",
        *STRATEGIES[strategy],
        "batching=global",
        f"batching.global_batch_size={global_batch}",
        f"loop.epochs={epochs}",
        f"loop.steps_per_epoch={steps}",
        "loop.verbose=0",
        "callbacks.model_checkpoint.enabled=false",
        f"hydra.run.dir={run_dir}",
    ]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=out)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        return {"error": (result.stderr or result.stdout).strip().splitlines()[-1:], "wall": wall}
    summary = json.loads((run_dir / "summary.json").read_text())
    return {**summary, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    print(
        f"digits, cnn, float32, global batch {args.global_batch}, {args.epochs} epochs x "
        f"{args.steps} steps; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPU cores\n"
    )
    print("| strategy | loop | replicas | examples/s | test accuracy | wall time (s) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-strategies-") as tmp:
        for strategy in args.strategies:
            r = run(
                strategy,
                global_batch=args.global_batch,
                steps=args.steps,
                epochs=args.epochs,
                out=Path(tmp),
            )
            if "error" in r:
                print(f"| {strategy} | - | - | failed: {r['error']} | - | {r['wall']:.1f} |")
                continue
            print(
                f"| {strategy} | {r['loop']} | {r['num_replicas']} | "
                f"{r['examples_per_sec']:.0f} | {r['test'].get('accuracy', float('nan')):.3f} | "
                f"{r['wall']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
