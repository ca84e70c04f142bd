"""Compiling: what a second identical run saves with XLA's persistent cache (batching.compile_cache).

    python scripts/bench_compile.py                          # the default job, 2 rounds
    python scripts/bench_compile.py --rounds 3 model=resnet dataset=synthetic

Each round runs the same job (`batching.jit_compile=true`, 2 epochs, extra arguments as
overrides) three times, each in a new `python -m tfrecipe` process:

- `off`: `batching.compile_cache=false`, the stock baseline (XLA compiles every program);
- `first`: a fresh cache folder: XLA compiles and saves every program;
- `second`: the same folder again: XLA loads what `first` saved.

For each it prints summary.json's `warm_up_s` (`tracing`: tf.function tracing Python into graphs,
TensorFlow's own counter; `compile`: the rest of the first training call's and first validation's
extra time, where XLA compiles or loads its programs), the wall time, the process's CPU seconds
(its children's rusage: other processes' load disturbs these far less than wall time on a shared
machine) and the programs in the cache. The summary gives the medians of the per-round ratios
second/first and second/off. The order rotates each round, so load falls on all three alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("off", "first", "second")


def run_job(kind: str, root: Path, round_: int, overrides: list[str]) -> dict:
    """One `python -m tfrecipe` process: its warm-up split, wall time and CPU seconds."""
    cache = root / f"cache{round_}"
    run_dir = root / f"{kind}{round_}"
    setting = "false" if kind == "off" else str(cache)
    argv = [sys.executable, "-m", "tfrecipe", "loop.epochs=2", "loop.verbose=0"]
    argv += ["batching.jit_compile=true", f"batching.compile_cache={setting}"]
    argv += [f"hydra.run.dir={run_dir}", *overrides]
    env = {k: v for k, v in os.environ.items() if k != "TF_XLA_FLAGS"}
    before = os.times()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"{kind}: exit {done.returncode}\n{done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    warm_up = summary["perf"]["warm_up_s"]
    cpu = sum(getattr(after, k) - getattr(before, k) for k in ("children_user", "children_system"))
    return {
        "kind": kind,
        "tracing": warm_up["tracing"],
        "compile": warm_up["compile"],
        "first_call": warm_up["first_call"],
        "wall_s": summary["wall_time_s"],
        "cpu_s": round(cpu, 2),
        "programs": len(list(cache.rglob("*.pb"))) if kind != "off" else None,
    }


def one_round(round_: int, root: Path, overrides: list[str]) -> dict[str, dict]:
    """off, first, second in a rotated order (second always after first)."""
    order = [("off", "first", "second"), ("first", "second", "off"), ("first", "off", "second")]
    results = {}
    for kind in order[round_ % len(order)]:
        results[kind] = run_job(kind, root, round_, overrides)
        print(json.dumps({"round": round_, **results[kind]}), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args, overrides = parser.parse_known_args()
    print(f"machine: {_cpu_model()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    root = Path(tempfile.mkdtemp(prefix="bench_compile_"))
    try:
        rounds = [one_round(r, root, overrides) for r in range(args.rounds)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = {}
    for key in ("compile", "tracing", "first_call", "cpu_s", "wall_s"):
        for base in ("first", "off"):
            per_round = [r["second"][key] / r[base][key] for r in rounds if r[base][key]]
            if per_round:
                ratios[f"{key} second/{base}"] = round(statistics.median(per_round), 3)
    print(json.dumps({"medians of per-round ratios": ratios}))
    print(f"load at the end {os.getloadavg()[0]:.1f}")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
