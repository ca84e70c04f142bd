"""`optimizer.ema=true`: the averaged weights are what validation, the test split and the exports
use; a resumed run continues with the exact average; fit and the custom loop agree."""

from __future__ import annotations

import numpy as np
import pytest
from test_backup import BACKUP, _interrupted_at, _weights, train_in  # noqa: F401 (fixture)

from tests.helpers.configs import validate
from tfrecipe.errors import ConfigError

EMA = ["model=mlp", "model.hidden_units=[16]", "optimizer.ema=true", "optimizer.ema_momentum=0.9"]


def test_the_model_and_its_test_metrics_are_the_averaged_weights(train_run):
    import keras

    averaged, run_dir = train_run(*EMA)
    raw, raw_dir = train_run(*EMA[:2])  # the same run without the average
    assert averaged["metrics"]["loss"] == pytest.approx(raw["metrics"]["loss"], abs=1e-6)
    ema_weights, raw_weights = _weights(run_dir), _weights(raw_dir)
    assert any(not np.allclose(a, b) for a, b in zip(ema_weights, raw_weights, strict=True))
    # model.keras scores the test split as the run reported: the test used the average too
    model = keras.saving.load_model(run_dir / "model.keras")
    from tfrecipe.data.bundled import digits

    splits = digits(validation_fraction=0.1, test_fraction=0.2, split_seed=0)
    x, y = zip(*splits.test.as_numpy_iterator(), strict=True)
    results = model.evaluate(np.stack(x), np.stack(y), verbose=0, return_dict=True)
    assert results["accuracy"] == pytest.approx(averaged["test"]["accuracy"], abs=1e-6)


def test_fit_and_the_custom_loop_agree_with_ema(train_run):
    fit, fit_dir = train_run(*EMA, "loop=fit")
    custom, custom_dir = train_run(*EMA, "loop=custom")
    for key in ("loss", "val_loss"):
        assert fit["metrics"][key] == pytest.approx(custom["metrics"][key], abs=1e-4)
    assert fit["test"]["loss"] == pytest.approx(custom["test"]["loss"], abs=1e-4)
    for a, b in zip(_weights(fit_dir), _weights(custom_dir), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_resumed_run_keeps_the_average_exactly(train_in, tmp_path, loop):  # noqa: F811
    """Resumed mid-epoch (fit runs the rest of the epoch as its own call): the same final
    averaged weights, bit for bit, as the uninterrupted run."""
    overrides = [*BACKUP, *EMA, f"loop={loop}", "deterministic=true", "loop.verbose=0"]
    train_in(tmp_path / "run", *overrides)
    expected = _weights(tmp_path / "run")
    _interrupted_at(tmp_path / "run", 3)
    resumed = train_in(tmp_path / "run", *overrides)
    assert resumed["resumed_from_step"] == 3
    for got, want in zip(_weights(tmp_path / "run"), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_ema_with_early_stopping_restoring_weights_is_refused(compose_cfg):
    with pytest.raises(ConfigError, match=r"optimizer.ema=true: with callbacks.early_stopping"):
        validate(compose_cfg("optimizer.ema=true", "callbacks.early_stopping.enabled=true"))
