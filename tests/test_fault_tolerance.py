"""A worker killed without warning (SIGKILL) in a 2-worker cluster: the launcher restarts the
cluster, every worker restores the chief's last backup, and the run ends as an uninterrupted one
would (real processes on loopback gRPC)."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import psutil
import pytest
from helpers.launch import launching

pytestmark = pytest.mark.slow

EPOCHS, STEPS_PER_EPOCH, EVERY = 2, 12, 4
TRAINING = [
    "strategy=multi_worker_mirrored", "cluster=local", "cluster.num_workers=2",
    "cluster.max_restarts=1", f"loop.epochs={EPOCHS}", f"loop.steps_per_epoch={STEPS_PER_EPOCH}",
    "loop.verbose=0", "batching.per_replica_batch_size=16",
    f"callbacks.backup.every_n_steps={EVERY}",
]  # fmt: skip


@pytest.fixture
def launch(tmp_path):
    yield from launching(tmp_path)


def _worker(launcher_pid: int, index: int) -> psutil.Process:
    """The worker process with TF_CONFIG task index `index` among the launcher's children."""
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            config = json.loads(child.environ().get("TF_CONFIG", "null") or "null")
        except (psutil.Error, json.JSONDecodeError):
            continue
        if config and config["task"] == {"type": "worker", "index": index}:
            return child
    raise AssertionError(f"no worker {index} among the launcher's processes")


def _backups(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:-6]) for p in (run_dir / "backup").glob("ckpt-*.index"))


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_killed_worker_costs_at_most_one_backup_interval(launch, tmp_path, loop):
    run_dir = tmp_path / "run"
    run = launch(*TRAINING, f"loop={loop}", f"hydra.run.dir={run_dir}")
    run.wait_for(lambda: (run_dir / "backup").is_dir() and _backups(run_dir), timeout=240)
    assert _backups(run_dir), "no backup appeared"
    _worker(run.process.pid, 1).send_signal(signal.SIGKILL)

    code = run.finish(timeout=400)

    assert code == 0, run.output[-4000:]
    assert "restarting the cluster (1 of 1 restarts)" in run.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["num_replicas"] == 2
    assert summary["steps_completed"] == EPOCHS * STEPS_PER_EPOCH  # the uninterrupted count
    assert summary["resumed_from_step"] > 0
    assert summary["epochs_completed"] == EPOCHS
    # at most one backup interval was redone: training resumed at the last backup
    metrics = summary["metrics"]
    # 24 steps learn little: below chance level (ln 10 = 2.30), as an uninterrupted run (~2.2)
    assert math.isfinite(metrics["loss"]) and metrics["loss"] < math.log(10)
    assert math.isfinite(metrics["val_loss"]) and metrics["val_loss"] < math.log(10)


PARAMETER_SERVERS = [
    "strategy=parameter_server", "cluster=local", "cluster.num_workers=2", "cluster.num_ps=1",
    "loop=custom", "loop.epochs=4", "loop.steps_per_epoch=15", "loop.verbose=0",
]  # fmt: skip


def test_a_killed_parameter_server_worker_is_absorbed_by_the_coordinator(launch, tmp_path):
    """ClusterCoordinator reschedules a lost worker's steps: the run completes with the exact
    step count, with no cluster restart."""
    run_dir = tmp_path / "run"
    run = launch(*PARAMETER_SERVERS, f"hydra.run.dir={run_dir}")
    run.wait_for(lambda: (run_dir / "history.csv").exists(), timeout=240)  # epoch 1 done
    assert (run_dir / "history.csv").exists(), run.output[-3000:]
    _worker(run.process.pid, 1).send_signal(signal.SIGKILL)

    code = run.finish(timeout=400)

    assert code == 0, run.output[-4000:]
    assert "restarting the cluster" not in run.output
    assert "worker 1 exited with code -9 during training" in run.output  # killed mid-run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["steps_completed"] == 4 * 15
    assert summary["epochs_completed"] == 4
