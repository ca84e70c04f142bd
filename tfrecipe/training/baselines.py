"""`baseline=auto`: scikit-learn's standard baselines on the run's own split and preprocessing.

What an analyst tries first, fitted where the run's model trains and scored where it is tested,
so a run shows where it stands against them:

| task           | baselines                                                               |
|----------------|-------------------------------------------------------------------------|
| regression     | Ridge, HistGradientBoostingRegressor, the training mean                 |
| binary         | LogisticRegression, HistGradientBoostingClassifier, the majority class  |
| classification | LogisticRegression, HistGradientBoostingClassifier, the majority class  |
| multilabel     | LogisticRegression and HistGradientBoosting per label, each label's rate |

The features are the model's own inputs: the rows the run's pipeline gives (`batch_transform`)
passed through the dataset's encoders (`Splits.preprocessing`: standardized numbers, one-hot
categories, a missing number as the training mean), adapted on the training split as the
model's are. The scores are the task's own Keras metrics and loss (`tasks.metrics`), fed the
baselines' probabilities as logits, so every number means what the model's number means.

A streamed table gives its first `max_rows` training rows (its seeded, shuffled stream) and
test rows; the result says how many it used (`train_rows`, `test_rows`) and `capped: true`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tfrecipe import tasks
from tfrecipe.config.grants import NO_GRANTS, Grants
from tfrecipe.data.pipeline import PipelineOptions, batch_transform
from tfrecipe.data.splits import Splits, batch
from tfrecipe.errors import ConfigError
from tfrecipe.training.context import RunContext

log = logging.getLogger("tfrecipe")

_CHUNK_ROWS = 4096


def check_applicable(splits: Splits, *, dataset: str) -> None:
    """Refuses a dataset the baselines cannot be fitted on (images, raw text): they need a
    table, i.e. named columns or one feature vector per example.

    Raises:
      ConfigError: one line naming the dataset and what its examples are.
    """
    features = splits.train.element_spec[0]
    if isinstance(features, dict):
        return
    shape = list(features.shape)[1:] if splits.batched else list(features.shape)
    if features.dtype.name == "string":
        what = "raw text"
    elif len(shape) > 1:
        what = f"examples of shape {shape}"
    else:
        return
    raise ConfigError(
        f"baseline=auto: dataset {dataset} gives {what}; the scikit-learn baselines are "
        "fitted on tables (named columns or one feature vector per example); use baseline=none"
    )


def check_before_training(splits: Splits, run) -> None:
    """`check_fitting` for a run's validated config (`run.baseline`), where it asks for
    `baseline=auto`: refused before training, not after it."""
    if run.baseline.name == "auto":
        check_fitting(splits, run.baseline, dataset=run.dataset.target, task=run.task)


def check_fitting(
    splits: Splits, spec, *, dataset: str, task: tasks.TaskConfig, command: str = "baseline=auto"
) -> None:
    """Before fitting (for `baseline=auto`, before training): the baselines `spec` asks for
    apply to the data (`check_applicable`) and fit in memory (`check_memory`).

    Raises:
      ConfigError: one line saying which and why.
    """
    check_applicable(splits, dataset=dataset)
    check_memory(splits, task=task, max_rows=spec.max_rows, command=command)


def check_memory(splits: Splits, *, task: tasks.TaskConfig, max_rows: int, command: str) -> None:
    """Refuses baselines whose matrix and models would not fit in memory, before fitting them
    (`baseline_memory`: the encoded width, the rows, the task's outputs).

    Raises:
      ConfigError: one line naming the sizes and what to lower.
    """
    from tfrecipe.data.bundled import available_memory
    from tfrecipe.training.baseline_memory import BaselineData, check_fits

    info = splits.info
    held_out = info.num_test if splits.test is not None else info.num_validation
    data = BaselineData(
        train_rows=min(max_rows, info.num_train),
        test_rows=min(max_rows, held_out),
        width=_encoded_width(splits),
        outputs=tasks.num_outputs(task, info),
        targets=tasks.spec_of(task).targets,
    )
    check_fits(data, available=available_memory(), command=command)


def fit_baselines(
    splits: Splits,
    *,
    task: tasks.TaskConfig,
    pipeline: PipelineOptions,
    max_rows: int,
    seed: int,
    grants: Grants = NO_GRANTS,
) -> dict[str, Any]:
    """Fits the task's baselines on the training split and scores them on the test split (the
    validation split when there is no test split).

    Returns:
      summary.json's `baselines`: `{split, metric, train_rows, test_rows, capped, models:
      {name: {loss, metric...}}, fit_seconds: {name: s}}`.
    """
    split = "test" if splits.test is not None else "validation"
    evaluated = splits.test if splits.test is not None else splits.validation
    if evaluated is None:
        raise ConfigError("baseline=auto: the dataset has neither a test nor a validation split")
    encode = _encoder(splits)
    train_x, train_y = _rows(splits.train, splits, pipeline, encode, max_rows)
    test_x, test_y = _rows(evaluated, splits, pipeline, encode, max_rows)
    info = splits.info
    held_out = info.num_test if split == "test" else info.num_validation
    spec = tasks.spec_of(task)
    models, seconds = {}, {}
    for name, make in _baselines(spec.targets, seed).items():
        started = time.perf_counter()
        predict = make(train_x, train_y)
        # as the model's outputs: values, or logits of the probabilities (kept from 0 and 1 so
        # that a majority class's certainty, a boosted model's 1.0, keeps losses finite)
        predicted = np.asarray(predict(test_x), dtype=np.float64)
        outputs = spec.outputs.from_probabilities(predicted, info.num_classes)
        models[name] = _score(task, outputs, test_y, grants)
        seconds[name] = round(time.perf_counter() - started, 3)
    return {
        "split": split,
        "metric": spec.reports.baseline_metric,
        "train_rows": len(train_x),
        "test_rows": len(test_x),
        "capped": len(train_x) < info.num_train or len(test_x) < held_out,
        "models": models,
        "fit_seconds": seconds,
    }


def fitter(spec, ctx: RunContext) -> Callable[[Splits], dict[str, Any]] | None:
    """`fit(splits)`: `fit_baselines` on a run's splits (the whole table's, not a worker's
    share) as the run `ctx` prepares them, timed on the console; None unless `baseline=auto`
    (`spec`)."""
    if spec.name != "auto":
        return None

    def fit(splits: Splits) -> dict[str, Any]:
        started = time.perf_counter()
        fitted = fit_baselines(
            splits,
            task=ctx.task,
            pipeline=ctx.pipeline,
            max_rows=spec.max_rows,
            seed=ctx.seed,
            grants=ctx.grants,
        )
        log.info("baselines fitted in %.1fs", time.perf_counter() - started)
        return fitted

    return fit


def lines(baselines: dict[str, Any], model_metrics: dict[str, float] | None) -> list[str]:
    """The console's last lines: each baseline's headline metric beside the model's."""
    metric = baselines["metric"]
    sample = (
        f" (a capped sample: {baselines['train_rows']:,} training, "
        f"{baselines['test_rows']:,} {baselines['split']} rows)"
        if baselines.get("capped")
        else ""
    )
    out = [f"baselines on the {baselines['split']} split, {metric}{sample}:"]
    model = (model_metrics or {}).get(metric)
    if model is not None:
        out.append(f"  {'model':<24} {metric}={model:.4f}")
    for name, scores in baselines["models"].items():
        out.append(f"  {name:<24} {metric}={scores[metric]:.4f}")
    return out


# --- the data: the model's inputs as a matrix ------------------------------------------------------
def _encoded_width(splits: Splits) -> int:
    """The width of the matrix `_encoder` makes (one-hot categories included), from the
    encoders' output shape: nothing is encoded."""
    if splits.preprocessing is None:
        features = splits.train.element_spec[0]
        shape = list(features.shape)[1:] if splits.batched else list(features.shape)
        return int(np.prod(shape or [1]))
    _, encoded = splits.preprocessing(splits.train)
    return int(encoded.shape[-1])


def _encoder(splits: Splits) -> Callable[[Any], np.ndarray]:
    """Features -> the float matrix the model's first trainable layer sees."""
    if splits.preprocessing is None:
        return lambda x: np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    import keras

    inputs, encoded = splits.preprocessing(splits.train)
    encoder = keras.Model(inputs, encoded)

    def encode(x) -> np.ndarray:
        return np.asarray(encoder(x, training=False), dtype=np.float32)

    return encode


def _rows(dataset, splits: Splits, pipeline: PipelineOptions, encode, max_rows: int):
    """Up to `max_rows` examples of a split: (features, targets)."""
    batches = batch(dataset, _CHUNK_ROWS, chunks=splits.batched).map(batch_transform(pipeline))
    xs, ys, count = [], [], 0
    for x, y in batches.as_numpy_iterator():
        xs.append(encode(x))
        ys.append(y)
        count += len(y)
        if count >= max_rows:
            break
    return np.concatenate(xs)[:max_rows], np.concatenate(ys)[:max_rows]


# --- the baselines ------------------------------------------------------------------------------
def _baselines(targets: str, seed: int) -> dict[str, Callable]:
    """name -> fit(x, y) returning predict(x): probabilities (classes, labels) or values, for
    the task's `targets` (class_ids, multi_hot or values)."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression, Ridge

    def fitted(estimator, method: str):
        def fit(x, y):
            model = estimator().fit(x, y)
            return getattr(model, method)

        return fit

    def per_label(estimator):
        def fit(x, y):
            predictors = [_constant_or(estimator, x, y[:, k]) for k in range(y.shape[1])]
            return lambda x: np.stack([p(x) for p in predictors], axis=1)

        return fit

    logistic = lambda: LogisticRegression(max_iter=2000)  # noqa: E731
    boosted = lambda: HistGradientBoostingClassifier(random_state=seed)  # noqa: E731
    if targets == "values":
        return {
            "ridge": fitted(Ridge, "predict"),
            "hist_gradient_boosting": _per_output(
                lambda: HistGradientBoostingRegressor(random_state=seed)
            ),
            "mean": _mean,
        }
    if targets == "multi_hot":
        return {
            "logistic_regression": per_label(logistic),
            "hist_gradient_boosting": per_label(boosted),
            "label_rate": _label_rate,
        }
    return {
        "logistic_regression": _classifier(logistic),
        "hist_gradient_boosting": _classifier(boosted),
        "majority": _majority,
    }


def _classifier(estimator):
    def fit(x, y):
        model = estimator().fit(x, y)
        return lambda x: _full_width(model.predict_proba(x), model.classes_)

    return fit


def _full_width(probabilities: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Probabilities over class ids 0..max (a class missing from the training split: 0)."""
    out = np.zeros((len(probabilities), int(classes.max()) + 1), dtype=np.float64)
    out[:, classes.astype(int)] = probabilities
    return out


def _constant_or(estimator, x, y):
    """P(label k) of a classifier on one label; a label constant in training is that constant."""
    if np.unique(y).size < 2:
        rate = float(y[0]) if len(y) else 0.0
        return lambda x: np.full(len(x), rate)
    model = estimator().fit(x, y.astype(int))
    return lambda x: model.predict_proba(x)[:, list(model.classes_).index(1)]


def _per_output(estimator):
    def fit(x, y):
        targets = y.reshape(len(y), -1)
        models = [estimator().fit(x, targets[:, k]) for k in range(targets.shape[1])]
        return lambda x: np.stack([m.predict(x) for m in models], axis=1)

    return fit


def _mean(x, y):
    mean = y.reshape(len(y), -1).mean(axis=0)
    return lambda x: np.tile(mean, (len(x), 1))


def _majority(x, y):
    """The training split's class frequencies for every example: the majority class by
    accuracy (and a constant score: AUC 0.5)."""
    counts = np.bincount(y.astype(int))
    prior = counts / counts.sum()
    return lambda x: np.tile(prior, (len(x), 1))


def _label_rate(x, y):
    rate = y.mean(axis=0)
    return lambda x: np.tile(rate, (len(x), 1))


# --- scores: the task's own metrics ----------------------------------------------------------------
def _score(task, outputs: np.ndarray, targets: np.ndarray, grants: Grants) -> dict[str, float]:
    outputs = outputs.astype(np.float32)
    loss = tasks.loss(task, grants=grants)
    scores = {"loss": float(loss(targets, outputs))}
    for metric in tasks.metrics(task, grants=grants):
        metric.update_state(targets, outputs)
        scores[metric.name] = float(metric.result())
    return scores
