"""The task's options: class weights (fit, custom and parameter-server loops, one math),
standardized regression targets, a loss and extra metrics named by `_target_`, each task's
default monitor, and the sweep objective checked against the task's metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TINY
from test_tasks import SYNTHETIC

from tfrecipe.config.grants import Grants
from tfrecipe.errors import ConfigError

# Three clusters, binary label "cluster 0": a third of the examples are positive.
IMBALANCED_BINARY = [*SYNTHETIC, "dataset.num_classes=3", "task=binary", "dataset.targets=binary"]
DIABETES = ["task=regression", "dataset=diabetes", "model=mlp", "model.hidden_units=[16]"]


def _training_counts(compose_cfg, *overrides: str) -> np.ndarray:
    from tests.helpers.configs import validate
    from tfrecipe import tasks
    from tfrecipe.training.dataset import load_splits

    run = validate(compose_cfg(*overrides, tiny=False))
    splits = load_splits(run.dataset, grants=Grants())
    return np.bincount(tasks.training_targets(splits.train).reshape(-1))


def test_balanced_class_weights_train_the_same_with_fit_and_the_custom_loop(train_run, compose_cfg):
    weighted = [*IMBALANCED_BINARY, "task.class_weight=balanced"]
    fit, _ = train_run(*weighted, "loop=fit", tiny=False)
    custom, _ = train_run(*weighted, "loop=custom", tiny=False)
    assert custom["metrics"] == pytest.approx(fit["metrics"], rel=1e-4, abs=1e-6)
    assert custom["test"] == pytest.approx(fit["test"], rel=1e-4, abs=1e-6)
    counts = _training_counts(compose_cfg, *IMBALANCED_BINARY)
    assert counts[1] * 1.5 < counts[0]  # imbalanced indeed: a third positive
    used = {int(c): w for c, w in fit["class_weight"].items()}
    expected = {c: counts.sum() / (2 * counts[c]) for c in (0, 1)}  # n / (k x count)
    assert used == pytest.approx(expected, rel=1e-6)


def test_class_weights_by_id_weigh_the_training_loss_only(train_run):
    options = [*SYNTHETIC, "task=classification"]
    weighted, _ = train_run(*options, "task.class_weight={0: 3.0, 2: 0.5}", tiny=False)
    plain, _ = train_run(*options, tiny=False)
    assert weighted["class_weight"] == {"0": 3.0, "1": 1.0, "2": 0.5, "3": 1.0}  # others 1
    assert "class_weight" not in plain
    assert weighted["metrics"]["loss"] != pytest.approx(plain["metrics"]["loss"], rel=1e-3)


def test_the_custom_loop_weighs_the_loss_as_keras_fit_does():
    """sum(loss x w) / examples: Keras' sum_over_batch_size with sample_weight."""
    import keras
    import tensorflow as tf

    from tfrecipe.loops.objective import weighted

    labels, logits = tf.constant([0, 1, 1]), tf.constant([[2.0, 0.0], [0.5, 0.1], [0.0, 3.0]])
    weights = tf.constant([1.0, 4.0, 0.5])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    ours = tf.nn.compute_average_loss(weighted(per_example(labels, logits), weights))
    assert float(ours) == pytest.approx(float(loss(labels, logits, sample_weight=weights)))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "task.class_weight={12: 2.0}",
            "task.class_weight={12: 2.0}: class id 12 is outside [0, num_classes=10) of "
            "task=classification on dataset tfrecipe.data.bundled.digits",
        ),
        (
            "task.class_weight={0: -1.0}",
            "task.class_weight={0: -1.0}: expected null, balanced or {class_id: weight}",
        ),
    ],
)
def test_bad_class_weights_are_refused_before_training(train_run, tmp_path, override, message):
    with pytest.raises(ConfigError) as error:
        train_run("model=mlp", override)
    (line,) = error.value.messages
    assert line.startswith(message)
    assert not (tmp_path / "run0").exists()


def test_standardized_targets_start_at_the_mean_and_stay_in_original_units(train_run):
    import keras

    from tests.helpers.configs import validate
    from tfrecipe.config.compose import compose
    from tfrecipe.training.dataset import load_splits

    few_steps = [
        *DIABETES,
        "loop.epochs=1",
        "loop.steps_per_epoch=3",
        "optimizer.learning_rate=0.001",
    ]
    scaled, scaled_dir = train_run(*few_steps, "task.standardize_targets=true")
    plain, plain_dir = train_run(*few_steps)
    run = validate(compose(DIABETES))
    splits = load_splits(run.dataset, grants=Grants())
    features, targets = next(iter(splits.test.batch(1000)))
    mean = float(np.mean(targets))  # about 150 (disease progression, 25 to 346)
    predict = {
        name: keras.saving.load_model(d / "model.keras").predict(features, verbose=0)
        for name, d in (("scaled", scaled_dir), ("plain", plain_dir))
    }
    assert abs(predict["scaled"].mean() - mean) < 0.2 * mean  # the rescaling is in model.keras
    assert abs(predict["plain"].mean()) < 0.1 * mean  # an untrained linear head starts near 0
    # Metrics in the original units: far better than predicting 0 for everything.
    assert scaled["test"]["mae"] < 0.6 * plain["test"]["mae"]
    assert scaled["test"]["mae"] < mean


def test_a_target_loss_and_extra_metrics_are_reported_and_match_between_loops(train_run):
    options = [
        *SYNTHETIC,
        "task=regression",
        "dataset.targets=regression",
        "allowed_targets=[helpers]",
        "task.loss={_target_: helpers.task_losses.ScaledSquaredError, factor: 2.0}",
        "task.metrics=[{_target_: keras.metrics.MeanSquaredLogarithmicError},"
        "{_target_: helpers.task_losses.MaxAbsoluteError, name: worst}]",
        "callbacks.model_checkpoint.monitor=val_worst",
    ]
    fit, fit_dir = train_run(*options, "loop=fit", tiny=False)
    custom, _ = train_run(*options, "loop=custom", tiny=False)
    names = {"loss", "mae", "rmse", "r2", "mean_squared_logarithmic_error", "worst"}
    assert set(fit["test"]) == names
    assert custom["metrics"] == pytest.approx(fit["metrics"], rel=1e-4, abs=1e-6)
    assert custom["test"] == pytest.approx(fit["test"], rel=1e-4, abs=1e-6)
    # The configured loss trains: twice the squared error (plus nothing else).
    assert fit["test"]["loss"] == pytest.approx(2 * fit["test"]["rmse"] ** 2, rel=1e-4)
    assert "val_worst" in (fit_dir / "history.csv").read_text()


def test_a_huber_loss_by_target_trains(train_run):
    summary, _ = train_run(
        *SYNTHETIC,
        "task=regression",
        "dataset.targets=regression",
        "task.loss={_target_: keras.losses.Huber, delta: 2.0}",
        "loop=custom",
        tiny=False,
    )
    assert summary["status"] == "completed" and np.isfinite(summary["test"]["loss"])


@pytest.mark.parametrize(
    ("slot", "target"),
    [
        ("task.loss", "tensorflow.io.write_file"),
        ("task.loss", "keras.losses.huber"),  # a function: no per-example form, no state
        ("task.metrics", "os.system"),
    ],
)
def test_a_loss_or_metric_target_outside_its_kind_exits_2_before_anything_runs(
    cli, tmp_path, slot, target
):
    run_dir = tmp_path / "run"
    node = f"{{_target_: {target}}}"
    value = f"[{node}]" if slot == "task.metrics" else node
    result = cli("task=regression", f"{slot}={value}", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2
    key = "task.metrics.0" if slot == "task.metrics" else slot
    assert f"{key}._target_={target}: expected a keras." in result.stderr
    assert "Traceback" not in result.stderr and not run_dir.exists()


@pytest.mark.parametrize(
    ("task", "monitor"),
    [("classification", "val_loss"), ("binary", "val_auc"), ("regression", "val_loss")],
)
def test_each_task_has_a_default_monitor(compose_cfg, task, monitor):
    from tests.helpers.configs import validate

    run = validate(compose_cfg(f"task={task}"))
    assert run.callbacks.model_checkpoint.monitor == monitor
    assert run.callbacks.early_stopping.monitor == monitor


def test_a_monitor_the_task_does_not_produce_lists_the_extra_metrics_too(compose_cfg):
    from tests.helpers.configs import validate

    extra = "task.metrics=[{_target_: keras.metrics.MeanSquaredLogarithmicError}]"
    with pytest.raises(ConfigError) as error:
        validate(
            compose_cfg(
                "task=regression",
                extra,
                "callbacks.early_stopping.enabled=true",
                "callbacks.early_stopping.monitor=val_auc",
            )
        )
    (line,) = error.value.messages
    assert line.startswith("callbacks.early_stopping.monitor=val_auc: task=regression does not")
    assert "val_mean_squared_logarithmic_error" in line
    # ...which monitors may watch (min: an error), as a sweep may optimize it
    run = validate(
        compose_cfg(
            "task=regression",
            extra,
            "sweep.objective=test_mean_squared_logarithmic_error",
            "callbacks.model_checkpoint.monitor=val_mean_squared_logarithmic_error",
        )
    )
    from tfrecipe.tasks import monitor_mode

    assert monitor_mode(run.callbacks.model_checkpoint.monitor) == "min"


def test_an_extra_metric_may_not_take_a_name_the_task_reports(compose_cfg):
    from tests.helpers.configs import validate

    with pytest.raises(ConfigError) as error:
        validate(compose_cfg("task=binary", "task.metrics=[{_target_: keras.metrics.AUC}]"))
    (line,) = error.value.messages
    assert line.startswith("task.metrics.0._target_=keras.metrics.AUC: would be reported as 'auc'")


def test_the_sweep_objective_must_be_a_number_the_task_reports():
    from tfrecipe.cli.commands import validate

    with pytest.raises(ConfigError) as error:
        validate(["task=regression", "sweep.objective=val_accuracy"])
    (line,) = error.value.messages
    assert line == (
        "sweep.objective=val_accuracy: task=regression does not report it; allowed: loss, mae, "
        "rmse, r2, val_loss, val_mae, val_rmse, val_r2, test_loss, test_mae, test_rmse, "
        "test_r2, examples_per_sec, wall_time_s"
    )
    validate(["task=regression", "sweep.objective=test_r2"])  # a task metric is fine


@pytest.mark.slow
def test_class_weights_train_on_parameter_servers(tmp_path):
    """The parameter-server loop reads the (x, y, w) batches and weighs the loss the same way."""
    from helpers.launch import launching

    run_dir = tmp_path / "run"
    ps = ["strategy=parameter_server", "cluster=local", "cluster.num_workers=2", "cluster.num_ps=1"]
    for launch in launching(tmp_path):
        run = launch(
            *ps,
            "loop=custom",
            *TINY,
            "model=mlp",
            "task.class_weight=balanced",
            f"hydra.run.dir={run_dir}",
        )
        assert run.finish(timeout=300) == 0, run.output[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["class_weight"]) == 10


def test_float_targets_reach_the_model_unrounded():
    """Regression targets (and multi-hot labels) keep their values; class ids become int32."""
    import tensorflow as tf

    from tfrecipe.data.pipeline import PipelineOptions, batch_transform

    transform = batch_transform(PipelineOptions())
    _, targets = transform(tf.zeros([2, 3]), tf.constant([[0.25], [-1.75]]))
    assert targets.numpy().tolist() == [[0.25], [-1.75]]
    _, ids = transform(tf.zeros([2, 3]), tf.constant([3, 1], tf.int64))
    assert ids.dtype == tf.int32
