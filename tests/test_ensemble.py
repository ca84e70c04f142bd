"""`ensemble.seeds=N`: N members from seeds seed..seed+N-1 on the same split, one model that
averages their probabilities, evaluated, exported and recorded as a single run's; an
interrupted ensemble keeps its completed members and trains the others."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tfrecipe.errors import ConfigError

RUN = [
    "recipe=breast_cancer_binary",
    "baseline=none",
    "ensemble.seeds=2",
    "loop.epochs=2",
    "loop.steps_per_epoch=3",
]


def test_an_ensemble_averages_its_members_and_resumes_member_by_member(train_run, tmp_path):
    import keras

    from tfrecipe.data.bundled import breast_cancer
    from tfrecipe.models.build import register_custom_objects

    summary, run_dir = train_run(*RUN)
    members = summary["ensemble"]["members"]
    assert [m["seed"] for m in members] == [42, 43] and summary["status"] == "completed"
    assert summary["steps_completed"] == 2 * 6 and summary["params"]["trainable"] == 2 * 31
    assert {"auc", "loss"} <= summary["test"].keys() and "val_auc" in summary["metrics"]
    assert summary["positive_class"] == "1"
    assert json.loads((run_dir / "signature.json").read_text())["outputs"] == ["0", "1"]

    register_custom_objects()
    ensemble = keras.saving.load_model(run_dir / "model.keras", compile=False)
    parts = [
        keras.saving.load_model(run_dir / m["run_dir"] / "model.keras", compile=False)
        for m in members
    ]
    rows = (
        breast_cancer(standardize=True, validation_fraction=0.15, test_fraction=0.2, split_seed=0)
        .test.batch(64)
        .take(1)
    )
    x = next(iter(rows))[0].numpy()
    mean = np.mean([1 / (1 + np.exp(-p.predict(x, verbose=0))) for p in parts], axis=0)
    expected = np.log(mean) - np.log1p(-mean)
    np.testing.assert_allclose(ensemble.predict(x, verbose=0), expected, atol=1e-5)

    # Interrupted after member 0: member 0 is kept as it was, member 1 trains again.
    kept = (run_dir / "members/0/model.keras").stat().st_mtime_ns
    for path in (run_dir / "summary.json", run_dir / "members/1/summary.json"):
        record = json.loads(path.read_text())
        record["status"] = "preempted"
        path.write_text(json.dumps(record))
    from conftest import TINY

    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    again = train(compose([*TINY, *RUN]), run_dir=run_dir)
    assert again["status"] == "completed"
    # `tfrecipe evaluate` loads the ensemble's model.keras as a single model's.
    from tfrecipe.cli.evaluate import evaluate_run

    evaluated = evaluate_run(run_dir)["metrics"]
    assert evaluated["auc"] == pytest.approx(again["test"]["auc"], abs=1e-5)
    assert (run_dir / "members/0/model.keras").stat().st_mtime_ns == kept
    assert again["test"] == pytest.approx(summary["test"], abs=1e-6)  # the same seeds, again


def test_an_ensemble_on_a_cluster_is_refused(compose_cfg):
    from tests.helpers.configs import validate

    with pytest.raises(ConfigError, match=r"ensemble.seeds.*one process.*cluster=local"):
        validate(compose_cfg("ensemble.seeds=3", "strategy=multi_worker_mirrored", "cluster=local"))
