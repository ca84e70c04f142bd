"""A worker killed without warning (SIGKILL) in a 2-worker cluster: the launcher restarts the
cluster, every worker restores the chief's last backup, and the run ends as an uninterrupted one
would (real processes on loopback gRPC)."""

from __future__ import annotations

import json
import math
import re
import signal
from pathlib import Path

import psutil
import pytest
from helpers.launch import launching

pytestmark = pytest.mark.slow

EPOCHS, STEPS_PER_EPOCH, EVERY = 2, 12, 4
TRAINING = [
    "strategy=multi_worker_mirrored",
    "cluster=local",
    "cluster.num_workers=2",
    "cluster.max_restarts=1",
    f"loop.epochs={EPOCHS}",
    f"loop.steps_per_epoch={STEPS_PER_EPOCH}",
    "loop.verbose=0",
    "batching.per_replica_batch_size=16",
    f"callbacks.backup.every_n_steps={EVERY}",
]


@pytest.fixture
def launch(tmp_path):
    yield from launching(tmp_path)


def _task(launcher_pid: int, task: dict) -> psutil.Process:
    """The process with TF_CONFIG task `task` among the launcher's children."""
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            config = json.loads(child.environ().get("TF_CONFIG", "null") or "null")
        except (psutil.Error, json.JSONDecodeError):
            continue
        if config and config["task"] == task:
            return child
    raise AssertionError(f"no task {task} among the launcher's processes")


def _backups(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:-6]) for p in (run_dir / "backup").glob("ckpt-*.index"))


def _signal_after_first_backup(run, run_dir: Path, task: dict, signum: int) -> list[int]:
    """Sends `signum` to the launcher's task `task` once the chief's first backup exists;
    returns the backups there just before (none of them may be lost)."""
    run.wait_for(lambda: (run_dir / "backup").is_dir() and _backups(run_dir), timeout=240)
    saved = _backups(run_dir)
    assert saved, run.output[-3000:]
    _task(run.process.pid, task).send_signal(signum)
    return saved


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_killed_worker_costs_at_most_one_backup_interval(launch, tmp_path, loop):
    run_dir = tmp_path / "run"
    run = launch(*TRAINING, f"loop={loop}", f"hydra.run.dir={run_dir}")
    _signal_after_first_backup(run, run_dir, {"type": "worker", "index": 1}, signal.SIGKILL)

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


def test_a_worker_preempted_alone_restarts_the_cluster_losing_no_step(launch, tmp_path):
    """What a cluster manager does to one task (SIGTERM): both workers agree on a step and save
    there, the launcher restarts the cluster, and it resumes at exactly that step."""
    run_dir = tmp_path / "run"
    run = launch(*TRAINING, "loop=custom", f"hydra.run.dir={run_dir}")
    _signal_after_first_backup(run, run_dir, {"type": "worker", "index": 1}, signal.SIGTERM)

    code = run.finish(timeout=400)

    assert code == 0, run.output[-4000:]
    assert "exited with code 75 (preempted: the workers saved a backup" in run.output
    assert "restarting the cluster (1 of 1 restarts)" in run.output
    saved = int(re.search(r"\[worker 0\] .*backup saved at step (\d+)", run.output).group(1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["resumed_from_step"] == saved  # zero lost steps
    assert summary["steps_completed"] == EPOCHS * STEPS_PER_EPOCH


PARAMETER_SERVERS = [
    "strategy=parameter_server",
    "cluster=local",
    "cluster.num_workers=2",
    "cluster.num_ps=1",
    "loop=custom",
    "loop.epochs=4",
    "loop.steps_per_epoch=15",
    "loop.verbose=0",
    "cluster.grace_period_s=5",
]


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_a_killed_parameter_server_worker_is_absorbed_by_the_coordinator(
    launch, tmp_path, max_restarts
):
    """ClusterCoordinator reschedules a lost worker's steps: the run completes with the exact
    step count, without a cluster restart; with restarts allowed, the worker is started again
    at its address and serves again."""
    run_dir = tmp_path / "run"
    # Long enough (~30 s) for the restarted worker to start while training goes on.
    epochs = 20 if max_restarts else 4
    run = launch(
        *PARAMETER_SERVERS,
        f"loop.epochs={epochs}",
        "loop.steps_per_epoch=30",
        f"cluster.max_restarts={max_restarts}",
        f"hydra.run.dir={run_dir}",
    )
    run.wait_for(lambda: (run_dir / "history.csv").exists(), timeout=240)  # epoch 1 done
    assert (run_dir / "history.csv").exists(), run.output[-3000:]
    _task(run.process.pid, {"type": "worker", "index": 1}).send_signal(signal.SIGKILL)

    code = run.finish(timeout=400)

    assert code == 0, run.output[-4000:]
    assert "restarting the cluster" not in run.output
    assert "worker 1 exited with code -9 during training" in run.output  # killed mid-run
    if max_restarts:
        assert "restarting worker 1 (1 of 1 restarts)" in run.output
        assert run.output.count("[worker 1] worker 1 serving at") == 2
    else:
        assert "the coordinator goes on without worker 1 (no restarts left)" in run.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["steps_completed"] == epochs * 30
    assert summary["epochs_completed"] == epochs
    assert summary["resumed_from_step"] is None  # the coordinator never started over


def test_a_killed_parameter_server_restarts_the_cluster_from_the_last_backup(launch, tmp_path):
    """A parameter server's variables die with it: the whole cluster starts again and the
    coordinator restores the last backup (taken at each epoch end under parameter servers)."""
    run_dir = tmp_path / "run"
    run = launch(*PARAMETER_SERVERS, "cluster.max_restarts=1", f"hydra.run.dir={run_dir}")
    saved = _signal_after_first_backup(run, run_dir, {"type": "ps", "index": 0}, signal.SIGKILL)

    code = run.finish(timeout=400)

    report = _restart_report(run, run_dir, saved)
    assert code == 0, report
    assert "ps 0 exited with code -9 during training" in run.output, report
    assert "restarting the cluster (1 of 1 restarts)" in run.output, report
    resumed = re.search(r"\[chief 0\] .*resuming from \S+ckpt-(\d+) at step (\d+)", run.output)
    assert resumed and resumed[1] == resumed[2], report
    # nothing lost: the newest backup there when the server died (or a later one) is restored
    assert int(resumed[2]) >= max(saved), report
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", report
    assert summary["steps_completed"] == 4 * 15, report  # exact, across the restart
    assert summary["epochs_completed"] == 4, report
    assert summary["resumed_from_step"] == int(resumed[2]) and int(resumed[2]) % 15 == 0, report
    loss = summary["metrics"]["loss"]
    assert math.isfinite(loss) and loss < math.log(10), report


def _restart_report(run, run_dir: Path, saved: list[int]) -> str:
    """What a failed restart needs to be told apart (a backup lost, the wrong one restored, a
    resumed run that diverged): the backups, the epochs' losses, and the launcher's and
    tfrecipe's own lines (TensorFlow's gRPC tracebacks left out)."""
    history = run_dir / "history.csv"
    own = [line for line in run.output.splitlines() if "[launcher]" in line or "[tfrecipe]" in line]
    return "\n".join(
        [
            f"backups when the server was killed: {saved}; at the end: {_backups(run_dir)}",
            "history.csv:",
            history.read_text() if history.exists() else "(none)",
            "the launcher's and tfrecipe's lines:",
            *own[-60:],
        ]
    )
