"""`strategy=multi_worker_mirrored cluster=local`: real worker processes on loopback gRPC.

Each test runs the real command line and watches every process it starts: none may outlive the
test, passed or failed. Training is tiny (a few steps): the workers share two CPU cores.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from conftest import REPO, TINY
from helpers.crash_worker import EXIT_CODE
from helpers.launch import launching

pytestmark = pytest.mark.slow


@pytest.fixture
def launch(tmp_path):
    yield from launching(tmp_path)


MWMS = ["strategy=multi_worker_mirrored", "cluster=local", "cluster.num_workers=2"]


def crash_worker_1(times: int) -> list[str]:
    """Overrides that make worker 1 crash as training starts, on the first `times` attempts."""
    return [
        "+callbacks.extra.crash._target_=tests.helpers.crash_worker.CrashWorker",
        "+callbacks.extra.crash.worker=1",
        f"+callbacks.extra.crash.times={times}",
        "allowed_targets=[tests.helpers]",
    ]


USER_ENV = {"PYTHONPATH": str(REPO)}  # tests.helpers is importable, like a user's package


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_chief_wrote_a_complete_run(run_dir: Path, loop: str, tmp_path: Path) -> dict:
    result = summary(run_dir)
    assert result["status"] == "completed"
    assert result["num_replicas"] == 2 and result["loop"] == loop
    assert result["strategy"] == "multi_worker_mirrored"
    assert result["steps_completed"] == 2 * 3  # loop.epochs=2 x loop.steps_per_epoch=3
    assert result["global_batch_size"] == 2 * 16
    assert result["run_dir"] == str(run_dir.resolve())  # written by the chief, not a scratch dir
    # Where it ran: the cluster's shape on one machine, no addresses; the chief's own steps timed.
    ran = result["provenance"]
    assert sum(ran["cluster"].values()) == 2 and (ran["hosts"], ran["replicas"]) == (1, 2)
    assert "127.0.0.1" not in json.dumps(ran)
    assert result["perf"]["replicas"] == 2
    assert 0 <= result["perf"]["input_wait_fraction"] <= 1
    for name in ("history.csv", "curves.png", "model.keras", "config.yaml", "tfrecipe.log"):
        assert (run_dir / name).is_file(), name
    # The other worker kept Hydra's and its own files out of the run dir, and deleted its scratch.
    assert "[worker 1]" not in (run_dir / "tfrecipe.log").read_text()
    assert list((tmp_path / "tmp").iterdir()) == []
    return result


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_two_workers_train_together(launch, tmp_path, loop):
    """loop=fit across workers needs tfrecipe.compat (keras-team/keras#20585): this test
    fails with "Attempt to convert a value (PerReplica...)" when that fix stops working."""
    run_dir = tmp_path / "run"
    run = launch(*MWMS, f"loop={loop}", *TINY, f"hydra.run.dir={run_dir}")
    code = run.finish()
    assert code == 0, run.output[-4000:]
    assert "[worker 0]" in run.output and "[worker 1]" in run.output
    assert_chief_wrote_a_complete_run(run_dir, loop, tmp_path)


def test_a_crashed_worker_restarts_the_cluster(launch, tmp_path):
    run_dir = tmp_path / "run"
    run = launch(
        *MWMS,
        "cluster.max_restarts=1",
        *TINY,
        *crash_worker_1(times=1),
        f"hydra.run.dir={run_dir}",
        env=USER_ENV,
    )
    code = run.finish()
    assert code == 0, run.output[-4000:]
    assert f"worker 1 exited with code {EXIT_CODE}" in run.output
    assert "restarting the cluster (1 of 1 restarts)" in run.output
    assert "attempt 2 of 2" in run.output
    assert_chief_wrote_a_complete_run(run_dir, "fit", tmp_path)


def test_the_launcher_fails_when_restarts_are_exhausted(launch, tmp_path):
    run_dir = tmp_path / "run"
    run = launch(
        *MWMS,
        "cluster.max_restarts=1",
        *TINY,
        *crash_worker_1(times=99),
        f"hydra.run.dir={run_dir}",
        env=USER_ENV,
    )
    code = run.finish()
    assert code != 0
    assert run.output.count(f"worker 1 exited with code {EXIT_CODE}") == 2
    assert "the cluster could not finish after 1 restart(s)" in run.output
    assert not (run_dir / "summary.json").exists() or summary(run_dir)["status"] != "completed"


def test_sigterm_stops_every_worker(launch, tmp_path):
    run = launch(*MWMS, *TINY, "loop.epochs=50", f"hydra.run.dir={tmp_path / 'run'}")
    run.wait_for(lambda: len(run.seen) >= 2, timeout=60)
    assert len(run.seen) >= 2, "the workers did not start"
    time.sleep(3)  # inside TensorFlow start-up or training
    run.process.send_signal(signal.SIGTERM)
    code = run.finish(timeout=60)
    # 75 when the chief was already training: it saved a backup on the way out (preemption)
    assert code in (128 + signal.SIGTERM, 75), run.output[-3000:]
    assert "SIGTERM: stopping every task" in run.output
    assert not run.leftovers()


def test_a_sidecar_evaluator_scores_every_epochs_checkpoint(launch, tmp_path):
    run_dir = tmp_path / "run"
    run = launch(
        *MWMS, "cluster.evaluator=true", *TINY, "loop.epochs=3", f"hydra.run.dir={run_dir}"
    )
    code = run.finish()
    assert code == 0, run.output[-4000:]
    assert summary(run_dir)["num_replicas"] == 2  # the evaluator did not join the workers
    for epoch in (1, 2, 3):
        assert f"[evaluator 0] evaluated epoch-{epoch:03d}.weights.h5" in run.output
    rows = (run_dir / "evaluator" / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("checkpoint,") and len(rows) == 1 + 3
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        f"epoch-{epoch:03d}.weights.h5" for epoch in (1, 2, 3)
    ]


def test_a_port_taken_before_its_task_binds_it_starts_the_cluster_on_new_ports(
    tmp_path, monkeypatch, capfd
):
    """The launcher's free ports are released for the tasks to bind: another process can take
    one first (seen in a full test run). Worker 0's port is held here: its server cannot
    listen, it exits 69, and the launcher starts the cluster again on new ports without
    spending a restart (max_restarts=0), and the run completes."""
    import socket

    from tfrecipe.distribute import launcher

    taken = socket.create_server(("127.0.0.1", 0))  # listening, without SO_REUSEPORT
    found, asked = launcher.free_ports, []

    def first_port_taken(count: int) -> list[int]:
        asked.append(count)
        ports = found(count)
        return [taken.getsockname()[1], *ports[1:]] if len(asked) == 1 else ports

    monkeypatch.setattr(launcher, "free_ports", first_port_taken)
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    with taken:
        code = launcher.launch(
            [*MWMS, *TINY, f"hydra.run.dir={run_dir}"],
            launcher.LaunchOptions(num_workers=2, max_restarts=0),
        )
    err = capfd.readouterr().err
    assert code == 0, err[-3000:]
    assert len(asked) == 2
    assert "worker 0 exited with code 69 (its port was taken)" in err
    assert "starting again on new ports (1 of 3)" in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
