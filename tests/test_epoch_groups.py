"""`batching.epochs_per_call`: fit runs a held split's short epochs several to a call
(tfrecipe.loops.epoch_groups), and every epoch still looks to the user as one of its own: the
same history, best weights, step log and model as one epoch per call, a refusal where a callback
could tell the difference, and a preemption inside a group that loses nothing."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tfrecipe.cli.main import EXIT_PREEMPTED

# The dense model on the digits: auto holds its split (and validation beside it) on a CPU.
GROUPED = ("model=mlp", "loop.epochs=6", "loop.steps_per_epoch=3", "logger.csv.every_n_steps=3")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as file:
        return list(csv.DictReader(file))


def _weights(path: Path) -> list[np.ndarray]:
    import h5py

    values = []
    with h5py.File(path) as file:
        file.visititems(lambda _, item: values.append(item[()]) if hasattr(item, "dtype") else None)
    return values


# (fit across replicas runs a step per call: there an epoch is never one call, so never grouped)
@pytest.mark.parametrize("strategy", ["default", "one_device"])
def test_groups_of_epochs_train_log_and_checkpoint_as_one_epoch_per_call(train_run, strategy):
    # validated every 2 epochs, the best by the highest validation loss is epoch 2's, inside the
    # group of epochs 2-6: the best weights are not the model's when they are saved
    common = [*GROUPED, f"strategy={strategy}", "loop.validation_freq=2"]
    common.append("callbacks.model_checkpoint.mode=max")
    one, one_dir = train_run(*common, "batching.epochs_per_call=1")
    grouped, grouped_dir = train_run(*common, "batching.epochs_per_call=5")
    assert one["epochs_per_call"]["epochs"] == 1
    assert grouped["epochs_per_call"] == {"epochs": 5, "why": "5 epochs of 3 steps per call"}
    assert grouped["resident"]["resident"] and grouped["resident"]["evaluation"]["resident"]
    # every epoch's logs, validation included, to the last digit; the step log's rows and steps
    assert _rows(grouped_dir / "history.csv") == _rows(one_dir / "history.csv")
    assert len(_rows(one_dir / "history.csv")) == 6
    assert _rows(grouped_dir / "steps.csv") == _rows(one_dir / "steps.csv")
    # the best epoch's weights, though the model had trained on to its group's end by then
    assert grouped["best"]["epoch"] == one["best"]["epoch"] == 2
    for a, b in zip(
        _weights(grouped_dir / "best.weights.h5"),
        _weights(one_dir / "best.weights.h5"),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    assert grouped["test"] == one["test"] and grouped["steps_completed"] == 18


def test_auto_groups_short_epochs_where_every_callback_reads_only_logs(train_run):
    grouped, _ = train_run(*GROUPED)
    assert grouped["epochs_per_call"]["epochs"] == 6  # 128 steps' worth, capped by the run
    stopping, _ = train_run(*GROUPED, "callbacks.early_stopping.enabled=true")
    assert stopping["epochs_per_call"] == {
        "epochs": 1,
        "why": "the callback EarlyStopping may read the model at an epoch's end",
    }
    streamed, _ = train_run(*GROUPED, "pipeline.resident=false")
    assert streamed["epochs_per_call"] == {"epochs": 1, "why": "the training split streams"}


def test_a_group_a_callback_could_tell_apart_is_refused(cli, tmp_path):
    result = cli(
        *GROUPED,
        "batching.epochs_per_call=4",
        "callbacks.export.every_n_epochs=2",
        "loop.verbose=0",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "epochs_per_call" in line]
    assert len(lines) == 1 and "batching.epochs_per_call=4" in lines[0], result.stderr[-2000:]
    assert "PeriodicExport" in lines[0] and "allowed here: auto" in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "best.weights.h5").exists()


def test_xla_runs_a_held_group_as_one_program_that_trains_as_the_plain_loop(train_run):
    # 9 epochs of 3 steps cross two passes of the digits' 1257 rows (10 batches, the last short)
    common = [*GROUPED, "loop.epochs=9", "loop.validation_freq=2"]
    common.append("batching.per_replica_batch_size=128")
    compiled, compiled_dir = train_run(*common, "batching.jit_compile=true")
    plain, plain_dir = train_run(*common)
    assert compiled["resident"]["xla"] == "loop" and plain["resident"]["xla"] is None
    assert compiled["epochs_per_call"] == {
        "epochs": 9,  # 1024 steps' worth, capped by the run
        "why": "9 epochs of 3 steps per call, one XLA program",
    }
    assert plain["epochs_per_call"]["epochs"] == 9 and compiled["steps_completed"] == 27
    # XLA has no clock op: the wait is stamped around the program, the orders drawn before it
    # (measured, not None; on a loaded machine its share of a long call rounds to 0.0000)
    assert 0 <= compiled["perf"]["input_wait_fraction"] < 1
    assert "input_wait_note" not in compiled["perf"]
    assert plain["perf"]["input_wait_fraction"] is not None
    # the plain loop's batches, in its order, validated at the same epochs, the test split
    # evaluated in one program too: its logs up to XLA's rounding
    rows, expected = _rows(compiled_dir / "history.csv"), _rows(plain_dir / "history.csv")
    assert len(rows) == len(expected) == 9
    for row, wanted in zip(rows, expected, strict=True):
        assert row.keys() == wanted.keys()
        for key, value in wanted.items():
            assert bool(row[key]) == bool(value), (key, row)
            assert float(row[key] or 0) == pytest.approx(float(value or 0), rel=1e-4), key
    assert compiled["test"] == pytest.approx(plain["test"], rel=1e-4)
    # the best epoch's weights, copied inside the program where its validation won
    assert compiled["best"]["epoch"] == plain["best"]["epoch"]
    for a, b in zip(
        _weights(compiled_dir / "best.weights.h5"),
        _weights(plain_dir / "best.weights.h5"),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _command(run_dir: Path, epochs: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tfrecipe",
        "model=mlp",
        f"loop.epochs={epochs}",
        "loop.steps_per_epoch=3",
        "loop.verbose=0",
        "logger.csv.every_n_steps=3",
        "batching.epochs_per_call=20",
        f"hydra.run.dir={run_dir}",
    ]


@pytest.mark.slow
def test_a_preemption_inside_a_group_saves_at_its_end_and_resumes_losing_nothing(tmp_path):
    epochs = 400
    run_dir, whole_dir = tmp_path / "run", tmp_path / "whole"
    process = subprocess.Popen(
        _command(run_dir, epochs),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        steps = run_dir / "steps.csv"
        while not (steps.exists() and len(steps.read_text().splitlines()) > 25):
            assert time.monotonic() < deadline and process.poll() is None, "no steps logged"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == EXIT_PREEMPTED, output[-3000:]
    preempted = json.loads((run_dir / "summary.json").read_text())
    saved = preempted["steps_completed"]
    # saved at a group's end (1 epoch, then groups of 20): its epochs all in history.csv
    assert saved % 60 == 3 and saved < 3 * epochs, saved
    assert len(_rows(run_dir / "history.csv")) == saved // 3
    assert (run_dir / "backup" / f"ckpt-{saved}.index").is_file()

    rerun = subprocess.run(_command(run_dir, epochs), cwd=tmp_path, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    whole = subprocess.run(
        _command(whole_dir, epochs), cwd=tmp_path, capture_output=True, text=True
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    finished = json.loads((run_dir / "summary.json").read_text())
    assert finished["resumed_from_step"] == saved and finished["steps_completed"] == 3 * epochs
    # the same epochs, in order, once each, with the logs of the run never stopped
    assert _rows(run_dir / "history.csv") == _rows(whole_dir / "history.csv")
