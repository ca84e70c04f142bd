"""Loss blow-up recovery (`callbacks.terminate_on_nan.max_rollbacks`): a NaN loss rolls back to the
last good backup and training goes on at a lower learning rate. Real in-process runs on the
bundled digits; the blow-up is injected by tests/helpers/poison.py."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

import pytest
from test_backup import BACKUP, _backups, _interrupted_at, _summary, _weights
from test_cli import assert_refused

from tfrecipe.config.trust import Trust

LR = 0.002
# BACKUP: 2 epochs of 5 steps, backups at multiples of 3 steps and at epoch ends.
ROLLBACK = [
    *BACKUP,
    "callbacks.terminate_on_nan.max_rollbacks=1",
    f"optimizer.learning_rate={LR}",
    "logger.csv.every_n_steps=1",
    "model.filters=[8]",
    "model.dense_units=16",
    "allowed_targets=[helpers]",
]
TOTAL_STEPS = 10


def poison(step: int, once_file: Path | None = None) -> list[str]:
    """NaN weights after `step` (the loss is NaN from the next step on); with `once_file`, only
    the first time the run reaches it (a rollback then replays the step cleanly)."""
    overrides = [
        "+callbacks.extra.nan._target_=helpers.poison.PoisonWeightsAtStep",
        f"+callbacks.extra.nan.step={step}",
    ]
    if once_file is not None:
        overrides.append(f"+callbacks.extra.nan.once_file={once_file}")
    return overrides


def _learning_rates(run_dir: Path) -> dict[int, float]:
    """steps.csv: step -> the learning rate for the step after it."""
    with open(run_dir / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["step"]) for row in rows] == list(range(1, TOTAL_STEPS + 1)), "each step once"
    return {int(row["step"]): float(row["learning_rate"]) for row in rows}


def _saved_learning_rate(run_dir: Path) -> float:
    import keras

    optimizer = keras.saving.load_model(run_dir / "model.keras").optimizer
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_nan_loss_rolls_back_and_trains_on_at_a_lower_learning_rate(
    train_run, tmp_path, caplog, loop
):
    with caplog.at_level(logging.WARNING, logger="tfrecipe"):
        summary, run_dir = train_run(*ROLLBACK, f"loop={loop}", *poison(7, tmp_path / "once"))

    assert summary["status"] == "completed"
    assert summary["steps_completed"] == TOTAL_STEPS and summary["epochs_completed"] == 2
    # poisoned after step 7: the loss of step 8 is NaN; ckpt-6 is the newest good backup
    assert summary["rollbacks"] == [{"step": 8, "restored_step": 6, "learning_rate_factor": 0.5}]
    assert _summary(run_dir)["rollbacks"] == summary["rollbacks"]
    assert math.isfinite(summary["metrics"]["loss"])
    assert "rolled back to" in caplog.text and "backup/ckpt-6 (step 6)" in caplog.text
    assert "rollback 1 of 1" in caplog.text
    rates = _learning_rates(run_dir)  # the replayed steps' rows replace the diverged ones
    assert [rates[s] for s in range(1, 7)] == pytest.approx([LR] * 6)
    assert [rates[s] for s in range(7, 11)] == pytest.approx([LR * 0.5] * 4)
    assert _saved_learning_rate(run_dir) == pytest.approx(LR * 0.5)
    assert _backups(run_dir) == [0, 3, 5, 6, 9, 10]  # 0: the run's start, kept for rollbacks


def test_a_schedule_is_scaled_from_the_rollback_on(train_run, tmp_path):
    """The steps after the rollback train with schedule x factor: exactly as a run resumed from
    the restored backup with the learning rate x factor (a cosine schedule is linear in it)."""
    import keras
    import numpy as np

    cosine = ["optimizer.schedule=cosine", "optimizer.min_lr_fraction=0.1", "deterministic=true"]
    summary, run_dir = train_run(*ROLLBACK, *cosine, *poison(7, tmp_path / "once"))

    assert summary["status"] == "completed" and len(summary["rollbacks"]) == 1
    schedule = keras.optimizers.schedules.CosineDecay(LR, decay_steps=TOTAL_STEPS, alpha=0.1)
    expected = {s: float(schedule(s)) * (0.5 if s > 6 else 1.0) for s in range(1, 11)}
    assert _learning_rates(run_dir) == pytest.approx(expected)
    assert _saved_learning_rate(run_dir) == pytest.approx(0.5 * 0.1 * LR)  # model.keras keeps it
    _, lowered = train_run(
        *ROLLBACK, *cosine, f"optimizer.learning_rate={LR * 0.5}", f"resume={run_dir}/backup/ckpt-6"
    )
    for rolled_back, resumed in zip(_weights(run_dir), _weights(lowered), strict=True):
        np.testing.assert_array_equal(rolled_back, resumed)


def test_a_run_resumed_after_a_rollback_goes_on_at_the_lowered_rate(
    train_run, compose_cfg, tmp_path
):
    from tfrecipe.train import train

    cosine = ["optimizer.schedule=cosine", "optimizer.min_lr_fraction=0.1"]
    overrides = [*ROLLBACK, *cosine, *poison(7, tmp_path / "once")]
    first, run_dir = train_run(*overrides)
    rates = _learning_rates(run_dir)
    _interrupted_at(run_dir, 6)  # as if it had crashed right after rolling back to step 6

    resumed = train(
        compose_cfg(*overrides), run_dir=run_dir, trust=Trust.from_command_line(overrides)
    )

    assert resumed["resumed_from_step"] == 6 and resumed["steps_completed"] == TOTAL_STEPS
    assert resumed["rollbacks"] == first["rollbacks"]  # and they count towards max_rollbacks
    assert _learning_rates(run_dir) == pytest.approx(rates)  # steps 7-10 at schedule x 0.5


def test_a_blow_up_before_the_first_backup_rolls_back_to_the_start(train_run, tmp_path):
    summary, _ = train_run(
        *ROLLBACK, "callbacks.backup.every_n_steps=100", *poison(1, tmp_path / "once")
    )
    assert summary["status"] == "completed" and summary["steps_completed"] == TOTAL_STEPS
    assert summary["rollbacks"] == [{"step": 2, "restored_step": 0, "learning_rate_factor": 0.5}]


def test_a_blown_up_state_is_not_backed_up_even_with_a_finite_loss(train_run, tmp_path):
    """The weights go NaN in step 6's update; step 6 still reports the loss computed before it,
    and its backup would be NaN: the rollback restores the one before (the epoch end, 5)."""
    summary, _ = train_run(*ROLLBACK, *poison(6, tmp_path / "once"))
    assert summary["status"] == "completed"
    assert summary["rollbacks"] == [{"step": 7, "restored_step": 5, "learning_rate_factor": 0.5}]


def test_a_blow_up_that_persists_stops_after_max_rollbacks(train_run, tmp_path, caplog):
    from tfrecipe.train import TrainingError

    with (
        pytest.raises(TrainingError, match=r"loss became nan .* again after 2 rollbacks"),
        caplog.at_level(logging.WARNING, logger="tfrecipe"),
    ):
        train_run(*ROLLBACK, "callbacks.terminate_on_nan.max_rollbacks=2", *poison(7))

    (run_dir,) = tmp_path.glob("run*")
    summary = _summary(run_dir)
    assert summary["status"] == "failed"
    assert [r["learning_rate_factor"] for r in summary["rollbacks"]] == [0.5, 0.25]
    assert "rollback 2 of 2" in caplog.text
    assert _backups(run_dir) == [0, 3, 5, 6]  # the good backups, nothing after the blow-up


BAD_ROLLBACKS = {
    "zero_lr_factor": (
        ["callbacks.terminate_on_nan.lr_factor=0"],
        ["callbacks.terminate_on_nan.lr_factor=0", "greater than 0"],
    ),
    "lr_factor_above_one": (
        ["callbacks.terminate_on_nan.lr_factor=1.5"],
        ["callbacks.terminate_on_nan.lr_factor=1.5", "less than or equal to 1"],
    ),
    "lr_factor_not_a_number": (
        ["callbacks.terminate_on_nan.lr_factor=x"],
        ["callbacks.terminate_on_nan.lr_factor=x", "number"],
    ),
    "rollbacks_without_backups": (
        ["callbacks.terminate_on_nan.max_rollbacks=1", "callbacks.backup.enabled=false"],
        ["callbacks.terminate_on_nan.max_rollbacks=1", "callbacks.backup.enabled=false"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ROLLBACKS))
def test_a_bad_rollback_setting_is_refused(cli, tmp_path, case):
    overrides, fragments = BAD_ROLLBACKS[case]
    run_dir = tmp_path / "run"
    report = assert_refused(cli(*overrides, f"hydra.run.dir={run_dir}"), run_dir, *fragments)
    assert "\n" not in report, "one problem, one line"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["callbacks.terminate_on_nan.enabled=false"], "callbacks.terminate_on_nan.enabled=false"),
        (
            ["strategy=parameter_server", "loop=custom", "cluster=tf_config"],
            "not supported with strategy=parameter_server",
        ),
    ],
    ids=["terminate_on_nan_off", "parameter_server"],
)
def test_rollbacks_need_terminate_on_nan_and_a_restartable_loop(compose_cfg, overrides, fragment):
    from tfrecipe.config import schema
    from tfrecipe.errors import ConfigError

    cfg = compose_cfg("callbacks.terminate_on_nan.max_rollbacks=1", *overrides)
    with pytest.raises(ConfigError) as error:
        schema.validate(cfg, trust=Trust.NOTHING)
    assert [p for p in error.value.messages if fragment in p], error.value.messages
