"""Backup and restore (`callbacks.backup`, `resume=`): in-process runs on the bundled digits."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from tfrecipe.config.trust import Trust

# 2 epochs of 5 steps, a backup at multiples of 3 steps and at epoch ends: ckpt-3, 5, 6, 9, 10.
BACKUP = [
    "loop.epochs=2",
    "loop.steps_per_epoch=5",
    "callbacks.backup.enabled=true",
    "callbacks.backup.every_n_steps=3",
    "callbacks.backup.max_to_keep=10",
]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _interrupted_at(run_dir: Path, step: int) -> None:
    """Makes a finished run look as if it had crashed right after the backup at `step`."""
    import tensorflow as tf

    backup = run_dir / "backup"
    kept = [
        p
        for p in tf.train.get_checkpoint_state(str(backup)).all_model_checkpoint_paths
        if int(p.rsplit("-", 1)[1]) <= step
    ]
    tf.compat.v1.train.update_checkpoint_state(
        str(backup), kept[-1], all_model_checkpoint_paths=kept
    )
    summary = _summary(run_dir) | {"status": "failed"}
    (run_dir / "summary.json").write_text(json.dumps(summary))


def _weights(run_dir: Path) -> list[np.ndarray]:
    import keras

    return [np.asarray(w) for w in keras.saving.load_model(run_dir / "model.keras").get_weights()]


def _backups(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:-6]) for p in (run_dir / "backup").glob("ckpt-*.index"))


@pytest.fixture
def train_in(compose_cfg):
    """train_in(run_dir, *overrides): one in-process run into a given run dir."""
    from tfrecipe.train import train

    return lambda run_dir, *overrides: train(
        compose_cfg(*overrides), run_dir=run_dir, trust=Trust.from_command_line(overrides)
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("loop", "strategy", "resident"),
    [
        ("fit", "default", False),
        ("custom", "mirrored", False),
        ("fit", "mirrored", False),
        # the training split held on the device: the stream restarts at the backup's step
        ("fit", "default", True),
        ("custom", "mirrored", True),
    ],
)
def test_a_run_resumed_mid_epoch_ends_exactly_as_an_uninterrupted_one(
    train_in, tmp_path, loop, strategy, resident
):
    """Restored model, optimizer, step and input position: bit-for-bit the same final weights."""
    overrides = [*BACKUP, f"loop={loop}", f"strategy={strategy}", "deterministic=true"]
    overrides.append(f"pipeline.resident={str(resident).lower()}")
    if strategy == "mirrored":
        overrides.append("strategy.logical_cpus=2")
    whole = train_in(tmp_path / "whole", *overrides)
    # fit takes 1 step per call (5-step epochs, backups every 3; replicas); the custom loop 3,
    # ending each epoch short: the backup due at step 6 comes at the call end at 8
    assert _backups(tmp_path / "whole") == ([3, 5, 8, 10] if loop == "custom" else [3, 5, 6, 9, 10])
    expected = _weights(tmp_path / "whole")

    _interrupted_at(tmp_path / "whole", 3)  # mid-epoch 1
    resumed = train_in(tmp_path / "whole", *overrides)

    assert resumed["status"] == "completed"
    assert resumed["resident"]["resident"] is resident
    assert resumed["resumed_from_step"] == 3
    assert resumed["steps_completed"] == whole["steps_completed"] == 10
    assert resumed["epochs_completed"] == 2  # epoch 1's history row is the resumed run's
    # the same batches in the same order from the same state: the same weights
    for resumed_weights, uninterrupted in zip(_weights(tmp_path / "whole"), expected, strict=True):
        np.testing.assert_array_equal(resumed_weights, uninterrupted)


def test_resume_at_an_epoch_boundary_keeps_the_history(train_in, tmp_path):
    run_dir = tmp_path / "run"
    steps_logged = [*BACKUP, "logger.csv.every_n_steps=1"]
    train_in(run_dir, *steps_logged)
    _interrupted_at(run_dir, 5)  # the end of epoch 1
    resumed = train_in(run_dir, *steps_logged)
    assert resumed["resumed_from_step"] == 5 and resumed["steps_completed"] == 10
    rows = (run_dir / "history.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows] == ["epoch", "1", "2"]
    # steps.csv keeps the steps logged before the restart, once each
    steps = [int(r.split(",")[0]) for r in (run_dir / "steps.csv").read_text().splitlines()[1:]]
    assert steps == list(range(1, 11))


def test_an_unreadable_latest_backup_falls_back_to_the_previous_one(train_in, tmp_path, caplog):
    run_dir = tmp_path / "run"
    train_in(run_dir, *BACKUP)
    _interrupted_at(run_dir, 9)
    data = next((run_dir / "backup").glob("ckpt-9.data-*"))
    data.write_bytes(data.read_bytes()[:100])  # truncated, as by a crash mid-copy

    with caplog.at_level(logging.WARNING, logger="tfrecipe"):
        resumed = train_in(run_dir, *BACKUP)

    assert "ckpt-9 cannot be restored" in caplog.text and "trying the one before" in caplog.text
    assert resumed["resumed_from_step"] == 6  # the one before
    assert resumed["steps_completed"] == 10


@pytest.mark.parametrize("state", ["garbage {{{\n", ""], ids=["damaged", "emptied"])
def test_an_unreadable_state_file_resumes_from_the_newest_intact_listed_backup(
    train_in, tmp_path, caplog, state
):
    run_dir = tmp_path / "run"
    train_in(run_dir, *BACKUP)
    _interrupted_at(run_dir, 10)
    for data in (run_dir / "backup").glob("ckpt-10.data-*"):
        data.write_bytes(data.read_bytes()[:100])  # the newest is damaged too
    (run_dir / "backup" / "checkpoint").write_text(state)

    with caplog.at_level(logging.WARNING, logger="tfrecipe"):
        resumed = train_in(run_dir, *BACKUP)

    assert "found 5 checkpoints by listing" in caplog.text
    assert resumed["resumed_from_step"] == 9  # not 0: the newest that restores
    assert resumed["steps_completed"] == 10
    # the state file is whole again, listing the old backups: the manager rotates them
    import tensorflow as tf

    state_now = tf.train.get_checkpoint_state(str(run_dir / "backup"))
    assert [Path(p).name for p in state_now.all_model_checkpoint_paths][:4] == [
        "ckpt-3",
        "ckpt-5",
        "ckpt-6",
        "ckpt-9",
    ]


def test_resume_from_a_path_starts_a_new_run_dir_from_that_checkpoint(train_in, tmp_path):
    train_in(tmp_path / "first", *BACKUP)
    resumed = train_in(
        tmp_path / "second", *BACKUP, "loop.epochs=3", f"resume={tmp_path / 'first/backup/ckpt-9'}"
    )
    assert resumed["resumed_from_step"] == 9
    assert resumed["steps_completed"] == 15
    # counted as its steps are, from the model's start: epochs 2 (its rest) and 3 trained here
    assert resumed["epochs_completed"] == 3
    history = (tmp_path / "second" / "history.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in history] == ["epoch", "2", "3"]
    assert _summary(tmp_path / "first")["steps_completed"] == 10  # untouched


def test_a_run_started_at_its_last_epochs_end_counts_the_epochs_the_model_completed(
    train_in, tmp_path
):
    """resume=PATH of the backup at the last epoch's end: nothing is left to train, and
    summary.json said epochs_completed 0 beside steps_completed 10; it counts from the model's
    start as the steps do, so 2 (both epochs of 5 steps)."""
    train_in(tmp_path / "first", *BACKUP)
    resumed = train_in(tmp_path / "second", *BACKUP, f"resume={tmp_path / 'first/backup/ckpt-10'}")
    assert resumed["resumed_from_step"] == 10 and resumed["steps_completed"] == 10
    assert resumed["epochs_completed"] == 2 == _summary(tmp_path / "second")["epochs_completed"]


def test_a_run_started_from_another_runs_checkpoint_and_trained_to_its_end_did_not_stop_early(
    train_in, tmp_path
):
    """Its history starts at the checkpoint's epoch: fewer rows than epochs is no early stop."""
    train_in(tmp_path / "first", *BACKUP)
    stopping = ["callbacks.early_stopping.enabled=true", "callbacks.early_stopping.patience=9"]
    checkpoint = f"resume={tmp_path / 'first/backup/ckpt-5'}"
    resumed = train_in(tmp_path / "second", *BACKUP, *stopping, "loop.epochs=3", checkpoint)
    assert resumed["steps_completed"] == 15 and resumed["stopped_epoch"] is None
    assert resumed["best"]["epoch"] in (2, 3)


def test_a_resume_stops_sooner_but_never_before_the_epoch_its_backup_is_in(train_in, tmp_path):
    """`loop.epochs` may change on a resume; one that ends before the backup's epoch would have
    to untrain steps: refused, naming the epochs that can be given, and nothing is written (it
    used to finish the backup's epoch silently)."""
    from tfrecipe.errors import ConfigError

    train_in(tmp_path / "first", *BACKUP)
    backup = tmp_path / "first" / "backup"
    with pytest.raises(ConfigError) as refused:
        train_in(tmp_path / "second", *BACKUP, "loop.epochs=1", f"resume={backup / 'ckpt-9'}")
    assert str(refused.value) == (
        f"loop.epochs=1: the backup to resume ({backup / 'ckpt-9'}) is at step 9, in epoch 2 of 5 "
        "steps; give loop.epochs=2 or more, or resume=never in a new run dir"
    )
    assert not (tmp_path / "second").exists()
    at_the_end = train_in(tmp_path / "third", *BACKUP, "loop.epochs=1", f"resume={backup}/ckpt-5")
    assert at_the_end["status"] == "completed" and at_the_end["steps_completed"] == 5


def test_resume_from_a_path_without_checkpoints_is_a_config_error(train_in, cli, tmp_path):
    """A run refuses it; `tfrecipe validate` says the same (it used to say "valid"), and passes
    a folder whose backup holds a checkpoint, found by its files."""
    from tfrecipe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"resume=.*no checkpoint there") as refused:
        train_in(tmp_path / "run", *BACKUP, f"resume={tmp_path}")
    checked = cli("validate", f"resume={tmp_path}")
    assert checked.returncode == 2 and str(refused.value) in checked.stderr, checked.stderr
    assert "Traceback" not in checked.stderr
    (backups := tmp_path / "earlier" / "backup").mkdir(parents=True)
    (backups / "ckpt-6.index").write_bytes(b"")
    for found in (backups.parent, backups, backups / "ckpt-6"):
        valid = cli("validate", f"resume={found}")
        assert valid.returncode == 0, valid.stderr


def test_resume_from_a_finished_run_without_backups_points_at_its_weights(cli, tmp_path):
    """A finished single-process run keeps no backup (they are off by default), so "train my
    run for more epochs" with `resume=RUN_DIR` found "no checkpoint there" and no way on: the
    line now says that the run dir holds a finished model, and `model.init_from` starts from
    its weights (the optimizer's state is not in a .keras)."""
    finished = tmp_path / "finished"
    (finished / "backup").mkdir(parents=True)
    (finished / "model.keras").write_bytes(b"")
    checked = cli("validate", f"resume={finished}")
    assert checked.returncode == 2 and "Traceback" not in checked.stderr, checked.stderr
    assert checked.stderr.strip().endswith(
        f"resume={finished}: no checkpoint there, but a finished model (model.keras, no "
        f"backups: callbacks.backup.enabled=true keeps them); to start from its weights, give "
        f"model.init_from={finished} and a new hydra.run.dir"
    ), checked.stderr


def test_a_nan_loss_stops_training_and_keeps_the_good_backups(train_in, tmp_path):
    from tfrecipe.train import TrainingError

    run_dir = tmp_path / "run"
    poison = [
        "+callbacks.extra.nan._target_=helpers.poison.PoisonWeightsAtStep",
        "+callbacks.extra.nan.step=7",
        "allowed_targets=[helpers]",
    ]
    with pytest.raises(TrainingError, match="loss became nan"):
        train_in(run_dir, *BACKUP, *poison)
    assert _summary(run_dir)["status"] == "failed"
    assert _backups(run_dir) == [3, 5, 6]  # nothing saved after the weights went bad
    # and the latest good one restores (resume=auto would continue from it)
    _train_state_restores(run_dir / "backup" / "ckpt-6")


def _train_state_restores(path: Path) -> None:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(path))
    names = [k for k in reader.get_variable_to_shape_map() if "VARIABLE_VALUE" in k]
    assert any("_trainable_variables" in k for k in names)  # the model's weights are there
    values = [reader.get_tensor(k) for k in names]
    assert all(np.isfinite(v).all() for v in values if v.dtype.kind == "f")


def test_resume_never_refuses_a_run_dir_that_holds_a_run(cli, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    before = json.dumps({"status": "preempted", "steps_completed": 7})
    (run_dir / "summary.json").write_text(before)

    result = cli("resume=never", f"hydra.run.dir={run_dir}")

    assert result.returncode == 2, result.stderr
    assert "resume=never" in result.stderr and "already holds a run (preempted)" in result.stderr
    assert (run_dir / "summary.json").read_text() == before  # never overwritten
    assert sorted(p.name for p in run_dir.iterdir()) == ["summary.json"]


def test_a_completed_run_dir_is_refused_whatever_resume_says(cli, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    result = cli(f"hydra.run.dir={run_dir}")
    assert result.returncode == 2 and "already holds a completed run" in result.stderr
