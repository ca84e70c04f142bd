"""What the data fingerprint costs at a run's start (tfrecipe/data/fingerprint.py), against reading
the same data once (a baseline measured in the same run, so a loaded machine's ratio holds).

    python scripts/bench_fingerprint.py [--large-mb 512] [--files 2000] [--file-kb 40]

Two layouts: one large table file (hashed by sampled blocks) and a folder of small files (an
image folder: each hashed whole). Files are written to a temporary dir and read from the page
cache (the baseline too), so the figures are CPU cost, not disk.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path

from tfrecipe.data import fingerprint


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def _read_all(paths: list[Path]) -> None:
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)


def _take_fresh(spec: str) -> None:
    """A run's first fingerprint of `spec` (no digest this process took already)."""
    fingerprint._TAKEN.clear()
    fingerprint.take({"path": spec})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--large-mb", type=int, default=512)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--file-kb", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        large = Path(tmp) / "table.csv"
        with open(large, "wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(args.large_mb):
                f.write(block)
        folder = Path(tmp) / "images"
        for i in range(args.files):
            sub = folder / f"class{i % 10}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"{i}.png").write_bytes(os.urandom(args.file_kb << 10))
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        for name, spec, paths in (
            (f"one {args.large_mb} MB file", str(large), [large]),
            (f"{args.files} files of {args.file_kb} KB", str(folder), files),
        ):
            _read_all(paths)  # into the page cache
            took = _best(lambda spec=spec: _take_fresh(spec))
            baseline = _best(lambda paths=paths: _read_all(paths))
            print(
                f"{name}: fingerprint {took * 1000:.1f} ms, reading it all (sha256) "
                f"{baseline * 1000:.1f} ms, ratio {took / baseline:.3f}"
            )


if __name__ == "__main__":
    main()
