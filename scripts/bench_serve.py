"""`tfrecipe serve` latency and throughput against the run's SavedModel called in-process (the
stock baseline: `tf.saved_model.load(path).serve`, no HTTP, no JSON), measured in the same run.

    python scripts/bench_serve.py                       # 500 one-row requests, 40 of 256 rows
    python scripts/bench_serve.py --requests 2000 --batches 100

Trains the default digits CNN (3 epochs) in a temporary folder with a SavedModel export, starts
`python -m tfrecipe serve` on a free loopback port and talks to it over one keep-alive HTTP
connection (http.client): the p50/p99 latency of one-row `instances` requests (JSON encoding
and decoding included, as a client sees them), the rows/s of 256-row requests sent one after
another, and the rows/s of 16 clients sending 16-row requests at once (the server batches them).
The baseline gets the same rows as NumPy arrays. Prints one JSON object, with the CPU's name and
the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _cpu() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _train(run_dir: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tfrecipe",
            f"hydra.run.dir={run_dir}",
            "loop.epochs=3",
            "loop.verbose=0",
            "export.formats=[keras,saved_model]",
        ],
        check=True,
        capture_output=True,
        cwd=run_dir.parent,
    )


def _start(run_dir: Path) -> tuple[subprocess.Popen, str, int, str]:
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfrecipe",
            "serve",
            str(run_dir),
            "--name",
            "digits",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    found = re.search(r"http://([\d.]+):(\d+)(/v1/models/\S+)", server.stdout.readline())
    return server, found.group(1), int(found.group(2)), found.group(3) + ":predict"


def _quantiles(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
    }


class Client:
    """One keep-alive connection to the server."""

    def __init__(self, host: str, port: int, path: str):
        self.connection = http.client.HTTPConnection(host, port, timeout=60)
        self.path = path

    def predict(self, rows: np.ndarray) -> np.ndarray:
        body = json.dumps({"instances": rows.tolist()}).encode()  # one send(): no Nagle wait
        self.connection.request("POST", self.path, body, {"Content-Type": "application/json"})
        answer = self.connection.getresponse()
        payload = json.loads(answer.read())
        assert answer.status == 200, payload
        return np.asarray(payload["predictions"])


def _timed(call, items) -> list[float]:
    seconds = []
    for item in items:
        start = time.perf_counter()
        call(item)
        seconds.append(time.perf_counter() - start)
    return seconds


def bench(run_dir: Path, images: np.ndarray, options) -> dict:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(run_dir / "saved_model"))
    stock = lambda x: np.asarray(loaded.serve(tf.constant(x)))  # noqa: E731
    server, host, port, path = _start(run_dir)
    try:
        client = Client(host, port, path)
        rows = [images[i % len(images)][None] for i in range(options.requests)]
        batches = [images[:256]] * options.batches
        for call in (client.predict, stock):  # warm both (traces, connections)
            _timed(call, rows[:20] + batches[:2])
        served_one, stock_one = _timed(client.predict, rows), _timed(stock, rows)
        served_batch, stock_batch = _timed(client.predict, batches), _timed(stock, batches)
        clients = [Client(host, port, path) for _ in range(16)]

        def send(index: int) -> None:  # one client per thread, its requests one after another
            for _ in range(options.rounds):
                clients[index].predict(images[index * 16 : (index + 1) * 16])

        start = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(send, range(16)))
        concurrent = 16 * 16 * options.rounds / (time.perf_counter() - start)
        difference = float(np.abs(client.predict(images[:256]) - stock(images[:256])).max())
    finally:
        server.terminate()
        server.wait(timeout=10)
    served_rps = 256 * len(batches) / sum(served_batch)
    stock_rps = 256 * len(batches) / sum(stock_batch)
    return {
        "one_row": {
            "served": _quantiles(served_one),
            "saved_model": _quantiles(stock_one),
            "p50_ratio": round(statistics.median(served_one) / statistics.median(stock_one), 1),
        },
        "batched_256": {
            "served_rows_per_s": round(served_rps),
            "saved_model_rows_per_s": round(stock_rps),
            "ratio": round(served_rps / stock_rps, 3),
        },
        "concurrent_16x16_rows_per_s": round(concurrent),
        "max_abs_diff": difference,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="one-row requests timed")
    parser.add_argument("--batches", type=int, default=40, help="256-row requests timed")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of 16 concurrent requests")
    options = parser.parse_args()
    from sklearn.datasets import load_digits

    images = (load_digits().images / 16.0).astype("float32")[..., None]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        run_dir = Path(work) / "digits"
        _train(run_dir)
        result = bench(run_dir, images, options)
    result |= {
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "load_average": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
