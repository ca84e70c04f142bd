"""`loop.lr_find` / `tfrecipe lr-find`: an exponential learning-rate sweep on the run's own
pipeline and loop, with its curve, plot and suggested rate in the run dir and summary.json; the
model is put back as it was (training afterwards is the same as without the sweep), and the
sweep runs under a multi-replica strategy and the custom loop too."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from tfrecipe.errors import ConfigError

TABLE = ["recipe=breast_cancer_binary", "baseline=none", "loop.epochs=2", "loop.steps_per_epoch=3"]
SWEEP = ["loop.lr_find.enabled=true", "loop.lr_find.steps=12", "loop.lr_find.min_lr=1e-4"]


def test_the_sweep_leaves_the_model_as_it_was(train_run):
    plain, _ = train_run(*TABLE)
    swept, run_dir = train_run(*TABLE, *SWEEP)
    found = swept["lr_find"]
    assert found["steps"] == 12 and (found["min_lr"], found["max_lr"]) == (1e-4, 1.0)
    assert 1e-4 <= found["suggested_learning_rate"] <= 1.0
    assert (run_dir / "lr_find.png").stat().st_size > 0
    with (run_dir / "lr_find.csv").open() as rows:
        curve = list(csv.DictReader(rows))
    rates = [float(row["learning_rate"]) for row in curve]
    assert len(rates) == 12 and rates[0] == pytest.approx(1e-4) and rates[-1] == pytest.approx(1)
    assert np.allclose(np.diff(np.log(rates)), np.log(1e4) / 11)  # exponential steps
    # then trained exactly as a run without the sweep
    assert swept["steps_completed"] == plain["steps_completed"] == 6
    assert swept["test"] == pytest.approx(plain["test"], abs=1e-6)


def test_lr_find_alone_on_two_replicas_with_the_custom_loop(train_run):
    """`tfrecipe lr-find` is `loop.lr_find.only=true`: the sweep and nothing else."""
    summary, run_dir = train_run(
        *TABLE,
        *SWEEP,
        "loop.lr_find.only=true",
        "strategy=mirrored",
        "strategy.logical_cpus=2",
        "loop=custom",
    )
    assert summary["status"] == "completed" and summary["num_replicas"] == 2
    assert summary["epochs_completed"] == 0 and summary["test"] == {}
    assert summary["lr_find"]["steps"] == 12 and not (run_dir / "model.keras").exists()


def test_a_sweep_that_goes_down_is_refused(compose_cfg):
    from tests.helpers.configs import validate

    with pytest.raises(ConfigError, match=r"loop.lr_find.min_lr.*below loop.lr_find.max_lr"):
        validate(compose_cfg("loop.lr_find.min_lr=2.0"))


def test_the_suggestion_is_the_steepest_descent_before_the_minimum():
    from tfrecipe.training.lr_find import Sweep, suggest

    sweep = Sweep(steps=60, min_lr=1e-5, max_lr=10.0)
    rates = [sweep.rate(i) for i in range(60)]
    # flat, then a fall centred at 1e-2, then a blow-up past 1
    losses = [1 / (1 + (r / 1e-2) ** 2) + (r > 1) * 10 * r for r in rates]
    found = suggest(rates, losses)
    assert 2e-3 < found["suggested_learning_rate"] < 5e-2
    assert 1e-1 < found["min_loss_learning_rate"] <= 1.5
    assert suggest(rates[:3], losses[:3])["suggested_learning_rate"] is None
