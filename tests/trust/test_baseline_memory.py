"""The scikit-learn baselines' memory is estimated before anything is allocated: 10,000-value
categorical columns or 3,000 classes are refused with one line (exit 2), before training, never
killed by the kernel with summary.json left at `running`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.probes import peak_memory_growth

from tfrecipe.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CUSTOMERS = REPO / "tests" / "data" / "customers.csv"
TABLE = [
    "dataset=csv",
    f"dataset.path={CUSTOMERS}",
    "dataset.label=churned",
    "dataset.features=[age,income,visits,city,plan]",
    "dataset.categorical=[city,plan]",
    "task=binary",
]


def test_the_estimate_grows_with_the_one_hot_width_and_the_classes():
    from tfrecipe.training.baseline_memory import BaselineData, estimated_bytes

    small = estimated_bytes(BaselineData(10_000, 2_000, 40, 3, "class_ids"))
    wide = estimated_bytes(BaselineData(10_000, 2_000, 50_000, 3, "class_ids"))
    many = estimated_bytes(BaselineData(10_000, 2_000, 40, 3_000, "class_ids"))
    assert small < 20 * 2**20
    # 50,000 one-hot columns: the float32 matrix alone is 2.4 GB, scikit-learn's float64 copy 4 GB
    assert wide > 12_000 * 50_000 * 4 + 10_000 * 50_000 * 8
    # 3,000 classes: each of 10,000 rows holds 3,000 probabilities, gradients and raw scores
    assert many > 3 * 10_000 * 3_000 * 8


def test_the_estimate_is_not_below_what_the_linear_baseline_takes():
    """Measured for real in a fresh process: LogisticRegression on 4,000 rows x 1,500 columns
    with 300 classes stays under its part of the estimate."""
    from tfrecipe.training.baseline_memory import BaselineData, estimated_bytes

    fitting = peak_memory_growth(
        setup="import numpy as np\n"
        "from sklearn.linear_model import LogisticRegression\n"
        "x = np.random.default_rng(0).random((4000, 1500), dtype=np.float32)\n"
        "y = np.arange(4000) % 300",
        measured="import warnings; warnings.simplefilter('ignore')\n"
        "LogisticRegression(max_iter=5).fit(x, y)",
    )
    matrix = 2 * 4000 * 1500 * 4
    assert fitting <= estimated_bytes(BaselineData(4000, 0, 1500, 300, "class_ids")) - matrix


def test_baselines_that_do_not_fit_are_refused_before_training(train_run, monkeypatch, tmp_path):
    from tfrecipe.data import bundled

    monkeypatch.setattr(bundled, "available_memory", lambda: 64 * 1024)
    with pytest.raises(ConfigError) as refused:
        train_run(*TABLE, "model=linear", "baseline=auto")
    (line,) = refused.value.report().splitlines()
    assert "baseline=auto: the scikit-learn baselines on " in line
    assert "lower baseline.max_rows, or use baseline=none" in line
    assert not (tmp_path / "run0" / "summary.json").exists()


def test_tfrecipe_baseline_that_does_not_fit_leaves_the_run_as_it_was(
    train_run, monkeypatch, tmp_path
):
    from tfrecipe.cli.baseline import baselines_of_run
    from tfrecipe.data import bundled

    data = tmp_path / "customers.csv"
    shutil.copy(CUSTOMERS, data)
    _, run_dir = train_run(*TABLE, f"dataset.path={data}", "model=linear", "loop.epochs=1")
    before = (run_dir / "summary.json").read_text()
    monkeypatch.setattr(bundled, "available_memory", lambda: 64 * 1024)

    with pytest.raises(ConfigError, match=r"^baseline: the scikit-learn baselines on "):
        baselines_of_run(run_dir, [])
    assert (run_dir / "summary.json").read_text() == before
