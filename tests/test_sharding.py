"""Auto-shard policies on a real 2-worker cluster: two local processes, each with its own
TF_CONFIG, build MultiWorkerMirroredStrategy over gRPC on 127.0.0.1 and read the same TFRecord
files through tfrecipe's loader, pipeline (seeded shuffle) and `data.distribute.distribute`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter

import pytest
from conftest import REPO
from helpers.datafiles import write_tfrecord

WORKER = REPO / "tests" / "helpers" / "shard_worker.py"
NUM_FILES, PER_FILE = 4, 6


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _run_cluster(pattern: str, out_dir, policies: list[str]) -> list[dict[str, list[int]]]:
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps(tf_config),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": str(REPO),
        }
        out = out_dir / f"worker{index}.json"
        processes.append(
            (
                subprocess.Popen(
                    [sys.executable, str(WORKER), pattern, str(out), *policies],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
                out,
            )
        )
    results = []
    for process, out in processes:
        try:
            log, _ = process.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for other, _ in processes:
                other.kill()
            raise
        assert process.returncode == 0, log[-3000:]
        results.append(json.loads(out.read_text()))
    return results


@pytest.mark.slow
def test_file_and_data_policies_show_every_example_once_per_epoch_across_workers(tmp_path):
    for i in range(NUM_FILES):
        write_tfrecord(
            tmp_path / f"part-{i}.tfrecord",
            PER_FILE,
            kind="float",
            first_id=PER_FILE * i,
            feature_key="features",
        )
    everything = list(range(NUM_FILES * PER_FILE))
    results = _run_cluster(str(tmp_path / "part-*.tfrecord"), tmp_path, ["file", "data", "off"])

    for policy in ("file", "data"):
        per_worker = [result[policy] for result in results]
        assert all(per_worker), f"{policy}: a worker saw nothing: {per_worker}"
        assert sorted(per_worker[0] + per_worker[1]) == everything, (policy, per_worker)
    # file: each worker reads whole files of its own (ids of one file stay together).
    files_per_worker = [{i // PER_FILE for i in result["file"]} for result in results]
    assert not files_per_worker[0] & files_per_worker[1]
    # off: no sharding, every worker reads everything (each example twice in all).
    assert Counter(results[0]["off"] + results[1]["off"]) == Counter(everything * 2)
