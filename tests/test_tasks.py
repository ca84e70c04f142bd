"""The `task` group: every task trains with its own loss, metrics and head, the same with fit
and the custom loop; targets a task cannot learn from and old model builders are refused."""

from __future__ import annotations

import json

import pytest

from tfrecipe.config.grants import Grants
from tfrecipe.errors import ConfigError

# Synthetic 8-feature vectors, 4 clusters; a tiny MLP; deterministic, so both loops can match.
SYNTHETIC = [
    "dataset=synthetic",
    "dataset.shape=[8]",
    "dataset.num_classes=4",
    "dataset.num_examples=256",
    "model=mlp",
    "model.hidden_units=[16]",
    "model.dropout=0.0",
    "deterministic=true",
    "loop.epochs=2",
    "loop.steps_per_epoch=4",
    "loop.verbose=0",
    "batching.per_replica_batch_size=32",
    "callbacks.model_checkpoint.enabled=false",
]
TASKS = {
    "classification": ("dataset.targets=classes", ["accuracy"]),
    "binary": ("dataset.targets=binary", ["accuracy", "auc", "precision", "recall"]),
    "multilabel": ("dataset.targets=multi_hot", ["binary_accuracy", "auc", "f1_micro", "f1_macro"]),
    "regression": ("dataset.targets=regression", ["mae", "rmse", "r2"]),
}


# Each task, and classification's options (a smoothed loss of tfrecipe's own, top-k accuracy).
CASES = [(task, [targets], metrics) for task, (targets, metrics) in TASKS.items()]
CASES.append(
    ("classification", ["task.label_smoothing=0.1", "task.top_k=3"], ["accuracy", "top_3_accuracy"])
)


@pytest.mark.parametrize(("task", "options", "metrics"), CASES)
def test_each_task_trains_the_same_with_fit_and_the_custom_loop(train_run, task, options, metrics):
    overrides = [*SYNTHETIC, f"task={task}", *options]
    fit, fit_dir = train_run(*overrides, "loop=fit", tiny=False)
    custom, _ = train_run(*overrides, "loop=custom", tiny=False)
    assert fit["status"] == custom["status"] == "completed"
    assert set(fit["test"]) == {"loss", *metrics}  # the task's Keras names, nothing else
    assert {f"val_{m}" for m in metrics} <= fit["metrics"].keys()
    assert custom["metrics"] == pytest.approx(fit["metrics"], rel=1e-4, abs=1e-6)
    assert custom["test"] == pytest.approx(fit["test"], rel=1e-4, abs=1e-6)
    assert (fit_dir / "curves.png").is_file()


@pytest.mark.parametrize("task", TASKS)
def test_each_task_trains_the_same_on_two_mirrored_replicas(train_run, task):
    """One global batch of 32 on the default strategy or split 16 + 16 over two logical CPUs:
    the same losses and metrics, with fit and with the custom loop."""
    overrides = [*SYNTHETIC, f"task={task}", TASKS[task][0], "batching=global"]
    overrides += ["batching.global_batch_size=32"]
    reference, _ = train_run(*overrides, "loop=fit", tiny=False)
    for loop in ("fit", "custom"):
        mirrored, _ = train_run(
            *overrides, f"loop={loop}", "strategy=mirrored", "strategy.logical_cpus=2", tiny=False
        )
        assert mirrored["num_replicas"] == 2
        assert mirrored["metrics"] == pytest.approx(reference["metrics"], rel=1e-4, abs=1e-6)
        assert mirrored["test"] == pytest.approx(reference["test"], rel=1e-4, abs=1e-6)


def test_the_head_follows_the_task(compose_cfg):
    from tests.helpers.configs import validate
    from tfrecipe.models.build import build_model
    from tfrecipe.training.dataset import load_splits

    for task, (targets, _) in TASKS.items():
        run = validate(compose_cfg(*SYNTHETIC, f"task={task}", targets))
        splits = load_splits(run.dataset, grants=Grants())
        model = build_model(run.model, splits, task=run.task, grants=Grants())
        width = {"classification": 4, "binary": 1, "multilabel": 4, "regression": 1}[task]
        assert model.output_shape == (None, width)
        assert model.layers[-1].dtype_policy.compute_dtype == "float32"


def test_multilabel_learns_well_above_chance(train_run):
    summary, _ = train_run(
        *SYNTHETIC,
        "task=multilabel",
        "dataset.targets=multi_hot",
        "loop.steps_per_epoch=20",
        "optimizer.learning_rate=0.01",
        tiny=False,
    )
    assert summary["test"]["f1_macro"] > 0.8  # chance (random 0/1 guesses) is about 0.5


@pytest.mark.parametrize(
    ("task", "problem", "message"),
    [
        ("regression", "strings", "has string labels (e.g. 'cheap')"),
        ("classification", "class_id", "has class id 5 outside [0, num_classes=3)"),
        ("multilabel", "width", "has multi-hot labels of width 3, but task.num_labels=4"),
        ("regression", "nan", "has a non-finite target (nan)"),
    ],
)
def test_targets_the_task_cannot_learn_are_refused_before_training(
    train_run, tmp_path, task, problem, message
):
    with pytest.raises(ConfigError) as error:
        train_run(
            "allowed_targets=[helpers]",
            "~dataset",
            "+dataset._target_=helpers.task_data.bad_targets",
            f"+dataset.problem='{problem}'",  # quoted: Hydra reads a bare nan as a float
            f"task={task}",
            *(["task.num_labels=4"] if problem == "width" else []),
            "model=mlp",
        )
    (line,) = error.value.messages
    assert line.startswith(f"task={task}: dataset helpers.task_data.bad_targets {message}")
    assert not (tmp_path / "run0").exists()  # nothing created


def test_a_model_builder_with_the_old_signature_is_told_what_to_change(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(
        "allowed_targets=[tests.helpers]",
        "model._target_=tests.helpers.task_data.old_signature",
        f"hydra.run.dir={run_dir}",
        env={"PYTHONPATH": str(__import__("conftest").REPO)},
    )
    assert result.returncode == 2
    assert "instead of num_classes" in result.stderr
    assert "def builder(*, input_shape, num_outputs" in result.stderr
    assert "Traceback" not in result.stderr and not run_dir.exists()


def test_a_monitor_the_task_does_not_produce_is_refused(compose_cfg):
    from tests.helpers.configs import validate

    with pytest.raises(ConfigError) as error:
        validate(compose_cfg("task=regression", "callbacks.model_checkpoint.monitor=val_accuracy"))
    assert error.value.messages == [
        "callbacks.model_checkpoint.monitor=val_accuracy: task=regression does not produce it; "
        "allowed: loss, mae, rmse, r2, val_loss, val_mae, val_rmse, val_r2"
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "metric", "at_least"),
    [("diabetes_regression", "r2", 0.40), ("breast_cancer_binary", "auc", 0.97)],
)
def test_tabular_recipes_reach_their_numbers(train_run, recipe, metric, at_least):
    summary, run_dir = train_run(f"recipe={recipe}", "loop.verbose=0", tiny=False)
    assert summary["test"][metric] >= at_least
    if recipe == "diabetes_regression":
        assert {"mae", "rmse", "r2"} <= json.loads((run_dir / "summary.json").read_text())[
            "test"
        ].keys()


def test_validate_tells_an_old_model_builder_what_to_change():
    from tfrecipe.cli.commands import validate

    with pytest.raises(ConfigError) as error:
        validate(
            [
                "allowed_targets=[tests.helpers]",
                "model._target_=tests.helpers.task_data.old_signature",
            ]
        )
    (line,) = error.value.messages
    assert "instead of num_classes" in line and "missing argument" not in line


def test_compare_shows_the_metrics_the_runs_logged(tmp_path):
    from tfrecipe.cli.compare import Run, _sorted, columns

    def run(name: str, r2: float) -> Run:
        metrics = {"loss": 1.0, "mae": 2.0, "r2": r2, "val_loss": 1.5, "val_mae": 2.5, "val_r2": r2}
        summary = {"metrics": metrics, "test": {"loss": 1.4, "mae": 2.4, "r2": r2}}
        return Run(tmp_path / name, summary, {})

    runs = [run("worse", 0.3), run("better", 0.5)]
    assert columns(runs) == [
        "loss",
        "mae",
        "r2",
        "val_loss",
        "val_mae",
        "val_r2",
        "test_mae",
        "test_r2",
        "examples_per_sec",
        "wall_time_s",
    ]
    assert [r.path.name for r in _sorted(runs, "test_r2")] == ["better", "worse"]  # higher first


def test_early_stopping_on_a_metric_that_grows_keeps_the_best_epoch_with_the_custom_loop(train_run):
    """Keras' "auto" mode cannot tell val_auc's direction in the custom loop; the task can."""
    summary, _ = train_run(
        *SYNTHETIC,
        "task=binary",
        "dataset.targets=binary",
        "loop=custom",
        "callbacks.early_stopping.enabled=true",
        "callbacks.early_stopping.monitor=val_auc",
        "callbacks.model_checkpoint.enabled=true",
        "callbacks.model_checkpoint.monitor=val_auc",
        tiny=False,
    )
    assert summary["status"] == "completed" and "val_auc" in summary["metrics"]
