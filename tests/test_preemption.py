"""Preemption: SIGTERM mid-epoch -> a backup at the next step boundary, summary.json "preempted",
exit code 75 -> the same command again resumes at the saved step and loses none (real processes).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfrecipe.cli.main import EXIT_PREEMPTED

pytestmark = pytest.mark.slow

EPOCHS, STEPS_PER_EPOCH = 2, 40


def _command(run_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tfrecipe",
        *overrides,
        f"loop.epochs={EPOCHS}",
        f"loop.steps_per_epoch={STEPS_PER_EPOCH}",
        "loop.verbose=0",
        "batching.per_replica_batch_size=16",
        "logger.csv.every_n_steps=1",
        f"hydra.run.dir={run_dir}",
    ]


def _wait_for_steps(path: Path, steps: int, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) > steps:  # + the header
            return
        time.sleep(0.05)
    raise AssertionError(f"training did not reach step {steps} (exit code {process.poll()})")


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize(
    "overrides",
    [
        # 2 steps per call: a signal still lands on the exact step saved (auto would run the
        # tiny model's epoch in 2 calls, too fast to signal mid-epoch)
        ("loop=fit", "batching.steps_per_execution=2"),
        ("strategy=mirrored", "strategy.logical_cpus=2", "loop=custom", "loop.steps_per_loop=2"),
        # SIGTERM to the launcher reaches both workers; they agree on a step, save, exit 75.
        ("strategy=multi_worker_mirrored", "cluster=local", "cluster.num_workers=2", "loop=fit"),
        # A task other than classification resumes the same way (its own loss and metrics).
        (
            "strategy=multi_worker_mirrored",
            "cluster=local",
            "cluster.num_workers=2",
            "loop=custom",
            "loop.steps_per_loop=2",
            "task=regression",
            "dataset=diabetes",
            "model=mlp",
            "model.hidden_units=[32]",
        ),
    ],
    ids=["single-process-fit", "mirrored-custom", "two-workers-fit", "two-workers-regression"],
)
def test_sigterm_saves_exits_and_the_same_command_resumes_losing_no_step(tmp_path, overrides):
    run_dir = tmp_path / "run"
    command = _command(run_dir, *overrides)
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        _wait_for_steps(run_dir / "steps.csv", 5, process, timeout=120)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == EXIT_PREEMPTED, output[-3000:]
    preempted = _summary(run_dir)
    assert preempted["status"] == "preempted"
    saved = preempted["steps_completed"]
    assert 5 <= saved < STEPS_PER_EPOCH  # mid-epoch 1: the step boundary after the signal
    assert (run_dir / "backup" / f"ckpt-{saved}.index").is_file()
    assert "rerun to resume" in output
    assert "deprecated" not in output, output[-3000:]  # TensorFlow's of its own handler's reads

    started = time.monotonic()
    rerun = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    finished = _summary(run_dir)
    assert finished["status"] == "completed"
    assert finished["resumed_from_step"] == saved  # zero lost steps
    assert finished["steps_completed"] == EPOCHS * STEPS_PER_EPOCH  # and none run twice
    assert finished["epochs_completed"] == EPOCHS
    print(f"preempted at step {saved}; the rerun took {time.monotonic() - started:.1f}s")
