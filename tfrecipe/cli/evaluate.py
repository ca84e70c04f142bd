"""`tfrecipe evaluate RUN_DIR [--model FILE] [key=value ...]`: a run's model on its test split.

The run's own resolved config (`RUN_DIR/config.yaml`) says how to build the data; overrides
change it (e.g. `dataset.data_dir=...` on another machine). `--model` picks what to evaluate:
`model.keras` (the exported final model, the default), `best` (the best epoch's weights,
`best.weights.h5`, loaded into the configured model) or a periodic export `model-NNN.keras`.
Prints the metrics as JSON and writes them to `RUN_DIR/evaluation.json`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from tfrecipe import compat, files, reading, rundir
from tfrecipe.config import schema
from tfrecipe.config.grants import Grants
from tfrecipe.errors import ConfigError
from tfrecipe.models.build import build_model, compile_model, register_custom_objects
from tfrecipe.runs import RunDir
from tfrecipe.training.dataset import evaluation_data, load_splits


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit code 2, as every usage mistake
        raise ConfigError(f"evaluate: {message} (tfrecipe evaluate --help)")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _load_model(
    run_dir: Path, which: str, splits, *, model_spec, task: schema.Task, grants: Grants
):
    import keras

    if which != "best":
        path = run_dir / which
        if not os.path.lexists(path):
            raise ConfigError(
                f"evaluate: --model={which}: no such file in {run_dir} (a run exports model.keras "
                "when it completes; --model=best uses best.weights.h5)"
            )
        try:  # regular, and measured from its directory before Keras inflates it
            reading.check_archive(path, what="the model file")
        except reading.UnreadableFile as error:
            raise ConfigError(f"evaluate: --model={which}: {error}") from None
        register_custom_objects()  # the task's own metrics, named in the saved model
        try:
            return keras.saving.load_model(path)
        except Exception as error:  # not a zip, a truncated file, unknown layers: not loadable
            raise ConfigError(
                f"evaluate: --model={which}: {path} cannot be loaded ({_first_line(error)})"
            ) from None
    weights = run_dir / rundir.BEST_WEIGHTS
    if not os.path.lexists(weights):
        raise ConfigError(f"evaluate: --model=best: {weights} does not exist")
    try:
        reading.check_file(weights, limit=reading.MAX_INFLATED_BYTES, what="a weights file")
    except reading.UnreadableFile as error:
        raise ConfigError(f"evaluate: --model=best: {error}") from None
    model = build_model(model_spec, splits, task=task, grants=grants)
    try:
        model.load_weights(weights)
    except Exception as error:  # a damaged file, or weights of another model
        raise ConfigError(
            f"evaluate: --model=best: {weights} does not load into the run's model "
            f"({_first_line(error)})"
        ) from None
    compile_model(model, task=task, grants=grants)
    return model


def evaluate_run(run_dir: Path, *, which: str = rundir.MODEL, overrides=()) -> dict[str, Any]:
    """Test-split metrics of the run's model (the validation split when there is no test)."""
    home = RunDir.at(run_dir)
    run = home.config(list(overrides), command="evaluate")
    from tfrecipe.data.fingerprint import check_run_data
    from tfrecipe.data.tabular import StatsCache

    check_run_data(home, run, command="evaluate")  # the data it was trained on, or allowed

    grants = Grants.of(run.allowed_targets)
    splits = load_splits(
        run.dataset,
        grants=grants,
        stats_cache=StatsCache(run_dir, chief=False),  # the run's own table statistics
        task=run.task,
    )
    split = "test" if splits.test is not None else "validation"
    dataset = splits.test if splits.test is not None else splits.validation
    if dataset is None:
        raise ConfigError("evaluate: the dataset has neither a test nor a validation split")
    compat.cache_saving_skipsets()  # each load walks every layer and metric: ~20% of a small one
    model = _load_model(
        run_dir,
        which,
        splits,
        model_spec=run.model,
        task=run.task,
        grants=grants,
    )
    data = evaluation_data(
        splits, split, run.pipeline, batch_size=run.batching.per_replica_batch_size, seed=run.seed
    )
    try:
        results = model.evaluate(data, verbose=0, return_dict=True)
    except ValueError as error:  # Keras' word for inputs the model does not take
        raise ConfigError(
            f"evaluate: --model={which} does not take the run's {split} data "
            f"({_first_line(error)}); is it this run's model?"
        ) from None
    return {
        "model": which,
        "split": split,
        "metrics": {name: float(value) for name, value in results.items()},
    }


def main(args: list[str]) -> None:
    parser = _Parser(prog="tfrecipe evaluate", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--model", default=rundir.MODEL, help="model.keras | best | model-NNN.keras"
    )
    parser.add_argument("overrides", nargs="*", help="key=value changes to the run's config")
    # Intermixed: `RUN_DIR --model best key=value` (the README's order) as well as
    # `RUN_DIR key=value --model best`.
    options = parser.parse_intermixed_args(args)
    if not options.run_dir.is_dir():
        raise ConfigError(f"evaluate: {options.run_dir} is not a directory")
    # a run still writing there: refused before the work
    RunDir.at(options.run_dir).lock(command="evaluate")
    result = evaluate_run(options.run_dir, which=options.model, overrides=options.overrides)
    files.write_atomic(options.run_dir / rundir.EVALUATION, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
