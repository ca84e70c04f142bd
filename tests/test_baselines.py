"""Baselines beside the model (`baseline=auto`, `tfrecipe baseline RUN_DIR`), `model=linear`
and `task.positive_class`: scikit-learn's standard baselines fitted on the run's own split and
encoders score what scikit-learn scores there, in the task's own metrics; they reach
summary.json, the console and `compare`; a streamed table's capped sample says so; which class
is 1 is the user's choice and every output names it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REPO

from tfrecipe.config.grants import Grants
from tfrecipe.errors import ConfigError

CUSTOMERS = REPO / "tests" / "data" / "customers.csv"
CSV_RUN = [
    "dataset=csv",
    f"dataset.path={CUSTOMERS}",
    "dataset.label=churned",
    "dataset.features=[age,income,visits,city,plan]",
    "dataset.categorical=[city,plan]",
    "task=binary",
]


def _fit(splits, task_name: str, **task):
    from tfrecipe.data.pipeline import PipelineOptions
    from tfrecipe.training.baselines import fit_baselines

    return fit_baselines(
        splits,
        task=_task(task_name, **task),
        pipeline=PipelineOptions(),
        max_rows=task.pop("max_rows", 100_000),
        seed=0,
    )


def _task(name: str, **fields):
    from tfrecipe.config import schema

    kinds = {
        "regression": schema.RegressionTask,
        "binary": schema.BinaryTask,
        "classification": schema.ClassificationTask,
        "multilabel": schema.MultilabelTask,
    }
    fields.pop("max_rows", None)
    return kinds[name](name=name, **fields)


def _bundled(name: str):
    from tfrecipe.data import bundled

    return getattr(bundled, name)(
        standardize=True, validation_fraction=0.15, test_fraction=0.2, split_seed=0
    )


def test_ridge_on_the_runs_split_scores_what_scikit_learn_scores_there():
    """The diabetes recipe's split, standardized with the training split's statistics: the
    baseline's R² is scikit-learn's own Ridge on the same rows, to float precision."""
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score

    from tfrecipe.data.splits import split_indices

    fitted = _fit(_bundled("diabetes"), "regression")
    assert fitted["metric"] == "r2" and fitted["split"] == "test" and not fitted["capped"]
    assert set(fitted["models"]) == {"ridge", "hist_gradient_boosting", "mean"}
    assert set(fitted["models"]["ridge"]) == {"loss", "mae", "rmse", "r2"}

    bunch = load_diabetes()
    x, y = bunch.data.astype("float32"), bunch.target
    train, _, test = split_indices(y, 0.15, 0.2, 0, stratify=False)
    mean, std = x[train].mean(0), x[train].std(0)
    ridge = Ridge().fit((x[train] - mean) / std, y[train])
    expected = r2_score(y[test], ridge.predict((x[test] - mean) / std))
    assert fitted["models"]["ridge"]["r2"] == pytest.approx(expected, abs=1e-4)
    assert (fitted["train_rows"], fitted["test_rows"]) == (len(train), len(test))
    assert abs(fitted["models"]["mean"]["r2"]) < 0.01  # the training mean explains nothing


def test_classifiers_score_in_the_tasks_metrics():
    """Binary: LogisticRegression's AUC on breast cancer (Keras' AUC, as the model's), the
    majority class's accuracy is the test split's majority share and its AUC 0.5. Classification
    (wine, 3 classes): the same three baselines by accuracy."""
    binary = _fit(_bundled("breast_cancer"), "binary")
    assert binary["metric"] == "auc"
    assert binary["models"]["logistic_regression"]["auc"] > 0.99
    assert binary["models"]["majority"]["auc"] == pytest.approx(0.5)
    splits = _bundled("breast_cancer")
    test_labels = np.concatenate([y for _, y in splits.test.batch(1000).as_numpy_iterator()])
    share = max(test_labels.mean(), 1 - test_labels.mean())
    assert binary["models"]["majority"]["accuracy"] == pytest.approx(share, abs=1e-6)
    assert np.isfinite(binary["models"]["majority"]["loss"])  # clipped probabilities

    classes = _fit(_bundled("wine"), "classification")
    assert set(classes["models"]) == {"logistic_regression", "hist_gradient_boosting", "majority"}
    assert classes["models"]["logistic_regression"]["accuracy"] > 0.9
    assert classes["models"]["majority"]["accuracy"] < 0.5


def test_multilabel_baselines_per_label():
    from tfrecipe.data.bundled import synthetic

    splits = synthetic(
        num_examples=300,
        shape=[6],
        num_classes=4,
        validation_fraction=0.1,
        test_fraction=0.2,
        split_seed=0,
        targets="multi_hot",
    )
    fitted = _fit(splits, "multilabel")
    assert fitted["metric"] == "f1_macro"
    assert set(fitted["models"]) == {"logistic_regression", "hist_gradient_boosting", "label_rate"}
    assert fitted["models"]["logistic_regression"]["f1_macro"] > 0.8


def test_a_streamed_tables_baselines_use_a_capped_sample_and_say_so(tmp_path):
    """A streamed CSV with a categorical column: the encoders one-hot it (the model's own), and
    max_rows caps the sample, which the result and the console's line say."""
    from tests.helpers import tables
    from tfrecipe.data.tabular import csv as load_csv
    from tfrecipe.training.baselines import lines

    path = tables.write(tmp_path / "t.csv", 1200)
    splits = load_csv(
        path=str(path),
        label="y",
        features=["x0", "x1", "x2", "city"],
        categorical=["city"],
        stream=True,
    )
    fitted = _fit(splits, "binary", max_rows=500)
    assert fitted["capped"] and fitted["train_rows"] == 500
    assert fitted["test_rows"] == splits.info.num_test < 500  # the test split is whole
    assert fitted["models"]["logistic_regression"]["auc"] > 0.9
    shown = "\n".join(lines(fitted, {"auc": 0.95}))
    assert "a capped sample: 500 training" in shown and "model" in shown


def test_images_are_refused_before_training(train_run):
    with pytest.raises(ConfigError, match=r"baseline=auto: dataset .*digits gives examples of"):
        train_run("baseline=auto")


def test_a_run_records_its_baselines_and_compare_and_the_command_show_them(
    train_run, cli, tmp_path
):
    """model=linear on breast cancer with baseline=auto: one Dense layer (31 weights), the
    baselines in summary.json, compare's columns; `tfrecipe baseline` on the finished run
    records the same numbers again."""
    summary, run_dir = train_run(
        "recipe=breast_cancer_binary", "loop.epochs=1", "loop.steps_per_epoch=2"
    )
    assert summary["params"]["trainable"] == 30 + 1  # the logit's weights and bias
    assert summary["positive_class"] == "1"
    fitted = summary["baselines"]
    assert fitted["metric"] == "auc" and fitted["models"]["logistic_regression"]["auc"] > 0.99
    assert json.loads((run_dir / "summary.json").read_text())["baselines"] == fitted

    from tfrecipe.cli.compare import Run, columns

    run = Run(run_dir, summary, {})
    shown = columns([run])
    assert "baseline_logistic_regression_auc" in shown and "baseline_majority_auc" in shown
    assert run.value("baseline_majority_auc") == pytest.approx(0.5)

    record = json.loads((run_dir / "summary.json").read_text())
    del record["baselines"]
    (run_dir / "summary.json").write_text(json.dumps(record))
    result = cli("baseline", str(run_dir))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "logistic_regression" in result.stdout and "auc=" in result.stdout
    again = json.loads((run_dir / "summary.json").read_text())["baselines"]
    for name, scores in fitted["models"].items():
        assert again["models"][name] == pytest.approx(scores, abs=1e-6)
    refused = cli("baseline", str(tmp_path / "nowhere"))
    assert refused.returncode == 2 and "is not a directory" in refused.stderr


def test_positive_class_relabels_and_every_output_names_it(train_run):
    """churned = no/yes: by default yes is 1; positive_class=no makes `no` class 1: its
    targets flip, the names swap, the summary and the signature say so; a class the data do
    not have is refused naming the ones they have."""
    from tfrecipe.config import schema
    from tfrecipe.training.dataset import load_splits

    spec = schema.Target.model_validate(
        {
            "_target_": "tfrecipe.data.tabular.csv",
            "path": str(CUSTOMERS),
            "label": "churned",
            "features": ["age", "income", "visits", "city", "plan"],
            "categorical": ["city", "plan"],
        }
    )
    plain = load_splits(spec, grants=Grants(), task=_task("binary"))
    flipped = load_splits(spec, grants=Grants(), task=_task("binary", positive_class="no"))
    assert plain.info.class_names == ("no", "yes") and flipped.info.class_names == ("yes", "no")
    np.testing.assert_array_equal(flipped.info.targets, 1 - plain.info.targets)
    ys = [
        np.concatenate([y for _, y in s.test.batch(500).as_numpy_iterator()])
        for s in (plain, flipped)
    ]
    np.testing.assert_array_equal(ys[1], 1 - ys[0])  # the same rows, relabelled

    summary, run_dir = train_run(*CSV_RUN, "model=linear", "task.positive_class=no")
    assert summary["positive_class"] == "no"
    signature = json.loads((run_dir / "signature.json").read_text())
    assert signature["outputs"] == ["yes", "no"] and signature["positive_class"] == "no"
    with pytest.raises(ConfigError, match=r"task.positive_class.*maybe.*classes are no, yes"):
        load_splits(spec, grants=Grants(), task=_task("binary", positive_class="maybe"))
