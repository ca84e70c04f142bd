"""A real 2-worker MultiWorkerMirroredStrategy cluster of helper scripts (two processes, gRPC on
127.0.0.1, TF_CONFIG each), for the tests that check which examples each worker reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tfrecipe.distribute.launcher import free_ports

REPO = Path(__file__).resolve().parents[2]


def ids_each_worker_saw(tmp_path: Path, script: str, *args: str) -> list:
    """Runs `tests/helpers/SCRIPT ARGS... OUT_JSON` as worker 0 and worker 1 of one cluster;
    returns what each wrote to its OUT_JSON (the ids it read). A worker that fails or hangs
    stops both, and its output is shown."""
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps(tf_config),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": str(REPO),
        }
        out = tmp_path / f"worker{index}.json"
        command = [sys.executable, str(REPO / "tests" / "helpers" / script), *args, str(out)]
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        processes.append((process, out))
    seen = []
    for process, out in processes:
        try:
            log, _ = process.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for other, _ in processes:
                other.kill()
            raise
        assert process.returncode == 0, f"a worker of {script} failed:\n{log[-3000:]}"
        seen.append(json.loads(out.read_text()))
    return seen
