"""Auto-shard policies on a real 2-worker cluster: two local processes, each with its own
TF_CONFIG, build MultiWorkerMirroredStrategy over gRPC on 127.0.0.1 and read the same TFRecord
files through tfrecipe's loader, pipeline (seeded shuffle) and `data.distribute.distribute`."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers.datafiles import write_tfrecord
from helpers.two_workers import ids_each_worker_saw

NUM_FILES, PER_FILE = 4, 6


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
    pattern = str(tmp_path / "part-*.tfrecord")
    results = ids_each_worker_saw(tmp_path, "shard_worker.py", pattern, "file", "data", "off")

    for policy in ("file", "data"):
        per_worker = [result[policy] for result in results]
        assert all(per_worker), f"{policy}: a worker saw nothing: {per_worker}"
        assert sorted(per_worker[0] + per_worker[1]) == everything, (policy, per_worker)
    # file: each worker reads whole files of its own (ids of one file stay together).
    files_per_worker = [{i // PER_FILE for i in result["file"]} for result in results]
    assert not files_per_worker[0] & files_per_worker[1]
    # off: no sharding, every worker reads everything (each example twice in all).
    assert Counter(results[0]["off"] + results[1]["off"]) == Counter(everything * 2)
