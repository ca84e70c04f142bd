"""The progress watchdog (tfrecipe/fault/watchdog.py) and the launcher's bounded waits: a worker
that makes no step leaves its stacks and a restartable exit code, the run restarts and finishes;
a worker that never exits is stopped after a grace period and named."""

from __future__ import annotations

import json
import sys
import threading
import time

import keras
import numpy as np
import pytest

from tests.conftest import REPO, TINY
from tests.helpers.configs import validate
from tests.helpers.launch import launching
from tfrecipe import rundir
from tfrecipe.config.compose import compose
from tfrecipe.distribute import launcher, processes
from tfrecipe.fault import watchdog
from tfrecipe.outcome import EXIT_STALLED


def test_a_stalled_step_leaves_every_threads_stack_and_exits_76(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.zeros((4, 2)), np.zeros((4, 1)), epochs=1, verbose=0)  # 1 step done
    rundir.RunFiles(tmp_path).write_summary({"status": "running", "stalls": []})
    exited = threading.Event()
    codes = []
    dog = watchdog.StallWatchdog(
        timeout=0.5,
        task="worker-1",
        home=rundir.RunFiles(tmp_path),
        chief=True,
        exit=lambda code: (codes.append(code), exited.set()),
    )
    dog.set_model(model)
    dog.on_train_begin()
    dog.on_train_batch_end(0)  # armed: a step is done
    assert exited.wait(5) and codes == [EXIT_STALLED]
    text = (tmp_path / "stall-worker-1.txt").read_text()
    assert "test_a_stalled_step_leaves_every_threads_stack_and_exits_76" in text  # main thread
    assert "Thread stall-watchdog" in text
    summary = rundir.RunFiles(tmp_path).summary()
    assert summary["status"] == "failed" and "worker-1 made no training step" in summary["error"]
    [stall] = summary["stalls"]
    assert stall["worker"] == "worker-1" and stall["step"] == 1
    assert stall["stack_file"] == "stall-worker-1.txt"
    home = rundir.RunFiles(tmp_path)
    assert watchdog.recorded_stalls(home, summary["stalls"]) == [stall]  # no repeat
    # A stack file is data: one whose record is not a stall record's is left out.
    (tmp_path / "stall-worker-9.txt").write_text('# tfrecipe stall record: {"worker": []}\n')
    (tmp_path / "stall-worker-8.txt").write_text("\xff\n")
    assert watchdog.recorded_stalls(home) == [stall]


def test_progress_keeps_it_quiet_and_the_end_of_training_stops_it(tmp_path):
    dog = watchdog.StallWatchdog(
        timeout=0.4,
        task="worker-0",
        home=rundir.RunFiles(tmp_path),
        chief=False,
        exit=lambda code: pytest.fail("stalled"),
    )
    dog.on_train_begin()
    for _ in range(6):  # evaluation and epoch ends are progress too
        dog.on_test_batch_end(0)
        time.sleep(0.15)
    dog.on_epoch_end(0)
    dog.on_train_end()
    time.sleep(0.8)  # after training (export, test scores) the watch is over
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "overrides, timeout",
    [
        ([], None),  # a single process: off unless asked
        (["cluster.stall_timeout=30"], 30.0),
        (["strategy=multi_worker_mirrored", "cluster=tf_config"], watchdog.AUTO),
        (["strategy=multi_worker_mirrored", "cluster=tf_config", "cluster.stall_timeout=0"], None),
    ],
)
def test_stall_timeout_is_automatic_on_a_cluster_only(overrides, timeout, tmp_path):
    spec = validate(compose([*TINY, *overrides])).cluster
    in_cluster = spec.name != "none"
    dog = watchdog.build_watchdog(
        spec.stall_timeout,
        task="worker-0" if in_cluster else None,
        home=rundir.RunFiles(tmp_path),
        chief=True,
    )
    assert (dog.timeout if dog else None) == timeout
    if timeout == watchdog.AUTO:
        assert dog.limit() == watchdog.AUTO_FLOOR_S
        dog._longest = 60.0  # the slowest gap seen so far: 60 s
        assert dog.limit() == 60.0 * watchdog.AUTO_FACTOR


def test_a_watched_single_process_trains_as_before(train_run):
    """Asked for (cluster.stall_timeout=30), the watch rides along the custom loop (fit: the
    stalled-worker test below): nothing stalls."""
    summary, run_dir = train_run("loop=custom", "cluster.stall_timeout=30")
    assert summary["status"] == "completed" and summary["steps_completed"] == 2 * 3
    assert summary["stalls"] == [] and not list(run_dir.glob("stall-*"))


# --- the launcher never waits forever -----------------------------------------------------------
def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_worker_that_outlives_its_peer_is_stopped_and_named(capfd, tmp_path):
    """Worker 1 saved and exited; worker 0 hangs, deaf to SIGTERM (the 2-worker SIGTERM test's
    hang): the launcher stops it after exit_grace_s + grace_period_s, and says so."""
    group = processes.TaskGroup(grace_period_s=0.5)
    ready = tmp_path / "deaf"
    deaf = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(600)"
    )
    started = time.monotonic()
    try:
        group.start("worker 0", [*_python(deaf), str(ready)], env={})
        group.start("worker 1", _python("pass"), env={})
        while not ready.exists() and time.monotonic() - started < 60:
            time.sleep(0.05)
        options = launcher.LaunchOptions(num_workers=2, exit_grace_s=0.5)
        code = launcher._watch(group, options, launcher._Restarts(0))
    finally:
        group.stop()
    assert time.monotonic() - started < 60
    assert code == launcher.EXIT_FAILED  # the chief did not finish: a restartable failure
    assert group.exit_code("worker 0") is not None  # killed: nothing left running
    err = capfd.readouterr().err
    assert "worker 0 still running 0.5 s after worker 1 exited: stopping it" in err
    assert "worker 0 did not stop 0.5 s after SIGTERM: killed" in err


# --- a real 2-worker cluster=local run with a stalled worker ---------------------------------
@pytest.fixture
def launch(tmp_path):
    yield from launching(tmp_path)


@pytest.mark.slow
def test_a_stalled_worker_restarts_the_cluster_which_finishes_exactly(launch, tmp_path):
    run_dir = tmp_path / "run"
    run = launch(
        "strategy=multi_worker_mirrored",
        "cluster=local",
        "cluster.num_workers=2",
        "cluster.max_restarts=1",
        "cluster.stall_timeout=5",
        "cluster.grace_period_s=2",
        *TINY,
        "loop.steps_per_epoch=4",
        "callbacks.backup.every_n_steps=1",
        "+callbacks.extra.stall._target_=tests.helpers.stall_worker.StallWorker",
        "+callbacks.extra.stall.worker=1",
        "+callbacks.extra.stall.after_step=3",
        "allowed_targets=[tests.helpers]",
        f"hydra.run.dir={run_dir}",
        env={"PYTHONPATH": str(REPO)},
    )
    started = time.monotonic()
    code = run.finish(timeout=240)
    assert code == 0, run.output[-4000:]
    assert time.monotonic() - started < 200
    assert "stall_worker: worker 1 hangs after step 3" in run.output
    assert f"exited with code {EXIT_STALLED} (stalled" in run.output
    assert "restarting the cluster (1 of 1 restarts)" in run.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == 2 * 4
    assert summary["resumed_from_step"] in (2, 3)  # step 3's backup needs worker 1 as well
    # In a hung collective every worker stalls, the one that hung and the one waiting on it:
    # whichever watchdog fires first exits 76, its record names it, its stacks show where it was.
    stalls = summary["stalls"]
    assert stalls and all(s["step"] == 3 and s["attempt"] == 0 for s in stalls), stalls
    for stall in stalls:
        stacks = (run_dir / stall["stack_file"]).read_text()
        assert stall["stack_file"] == f"stall-{stall['worker']}.txt"
        assert "Thread MainThread" in stacks and "Thread stall-watchdog" in stacks
        if stall["worker"] == "worker-1":
            assert "stall_worker.py" in stacks and "time.sleep(3600)" in stacks  # where it hung


def test_the_launcher_passes_stall_timeout_to_every_task():
    argv = launcher.task_argv(
        ["cluster=local", "cluster.stall_timeout=5"], chief=True, stall_timeout=5.0
    )
    assert argv[-1] == "cluster.stall_timeout=5.0" and "cluster=tf_config" in argv
    assert "~cluster.stall_timeout" not in argv
