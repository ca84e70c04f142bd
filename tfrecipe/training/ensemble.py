"""`ensemble.seeds=N`: the members' training, what the ensemble's summary records of them, and
the averaged model's scores (the members' configs: `schema.member_config`; the model itself:
tfrecipe.models.ensemble)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keras

from tfrecipe import rundir, signature
from tfrecipe.config import schema
from tfrecipe.data.pipeline import PipelineOptions
from tfrecipe.data.tabular import StatsCache
from tfrecipe.models import ensemble as ensemble_model
from tfrecipe.models.build import compile_model, register_custom_objects
from tfrecipe.runs import RunDir
from tfrecipe.training import summary as summaries
from tfrecipe.training.dataset import evaluation_data, load_splits
from tfrecipe.training.summary import RunSummary

log = logging.getLogger("tfrecipe")

MEMBERS = rundir.MEMBERS  # RUN_DIR/members/I: member I's run dir
# What a member's summary holds of interest beside its test metrics.
_MEMBER_FIELDS = ("seed", "status", "steps_completed", "epochs_completed", "wall_time_s")


def record(seeds: int, members: list[Mapping[str, Any]]) -> dict[str, Any]:
    """summary.json's `ensemble`: the members so far, each its seed, run dir and test metrics."""
    return {
        "seeds": seeds,
        "members": [
            {
                "run_dir": f"{MEMBERS}/{index}",
                **{name: member.get(name) for name in _MEMBER_FIELDS},
                "test": member.get("test") or {},
            }
            for index, member in enumerate(members)
        ],
    }


def as_single_run(members: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The fields of a single run's summary that the members share (batch, replicas, learning
    rate, positive class) and the ensemble's parameters (all the members')."""
    first = members[0]
    shared = ("num_replicas", "per_replica_batch_size", "global_batch_size", "learning_rate",
              "positive_class")  # fmt: skip
    fields = {name: first[name] for name in shared if name in first}
    counts = [m.get("params") or {} for m in members]
    fields["params"] = {
        kind: sum(c.get(kind, 0) for c in counts) for kind in ("total", "trainable")
    }
    return fields


def load(
    run_dir: Path, *, seeds: int, task: schema.Task, allowed_targets: list[str]
) -> keras.Model:
    """The members' exported models (model.keras) as one model averaging them, compiled."""
    register_custom_objects()
    members = [
        keras.saving.load_model(run_dir / MEMBERS / str(index) / rundir.MODEL, compile=False)
        for index in range(seeds)
    ]
    model = ensemble_model.averaged(members, task=task.name)
    # An optimizer it never steps: a model.keras compiled without one does not load again
    # (Keras' compile_from_config builds the optimizer), and `tfrecipe evaluate` loads it.
    compile_model(model, task=task, optimizer="sgd", allowed_targets=allowed_targets)
    return model


def scores(
    model: keras.Model, splits, *, pipeline, batch_size: int, seed: int
) -> dict[str, dict[str, float]]:
    """The ensemble's metrics on the test split (`test`) and the validation split (`metrics`,
    as `val_X`), with the task's compiled loss and metrics, as a single model's."""

    def evaluate(split: str) -> dict[str, float]:
        if getattr(splits, split) is None:
            return {}
        data = evaluation_data(splits, split, pipeline, batch_size=batch_size, seed=seed)
        results = model.evaluate(data, verbose=0, return_dict=True)
        return {name: float(value) for name, value in results.items()}

    validation = evaluate("validation")
    return {"test": evaluate("test"), "metrics": {f"val_{k}": v for k, v in validation.items()}}


def train_ensemble(
    config: Mapping[str, Any], dirs: RunDir, attempt: dict[str, RunSummary], *, started: float,
    recorded: dict[str, Any], seeds: int, seed: int, dataset: schema.Target, task: schema.Task,
    allowed_targets: list[str], pipeline: PipelineOptions, batch_size: int,
    train_member: Callable[[int, RunDir], dict[str, Any]],
    export: Callable[[keras.Model, Path, Any], dict[str, Any]],
    fit_baselines: Callable[[Any], dict[str, Any]] | None,
) -> RunSummary:  # fmt: skip
    """`ensemble.seeds=N` in the claimed `dirs`: N member runs (RUN_DIR/members/I, seed + I; a
    completed member is kept, an interrupted one resumes from its own backup), then one model
    averaging them, evaluated, exported and recorded as a single run's.

    Args:
      recorded: what summary.json records of the config (`summary.config_fields`).
      train_member: `train_member(index, dirs)` trains member `index`; returns its summary.
      export: `export(model, run_dir, splits)`: the exports' summary.
      fit_baselines: `fit_baselines(splits)`, when the run fits baselines.
      The others: the run's sections the averaged model reads its data and scores with.
    """
    fields = summaries.ensemble_fields(recorded, seeds=seeds, run_dir=dirs.path)
    summary = RunSummary(dirs.path, fields, started=started)
    summary.start(config, chief=dirs.chief)
    attempt["summary"] = summary
    members = _train_members(seeds, seed, dirs, summary, train_member)
    first = dirs.member(0).path
    splits = load_splits(
        dataset, allowed_targets=allowed_targets, stats_cache=StatsCache(first, chief=False),
        task=task,
    )  # fmt: skip
    summary.update(as_single_run(members))
    if dirs.chief:  # the members' inputs and outputs are the ensemble's (predict reads it)
        signature.write(dirs.path, dirs.member(0).signature())
    model = load(dirs.path, seeds=seeds, task=task, allowed_targets=allowed_targets)
    scored = scores(model, splits, pipeline=pipeline, seed=seed, batch_size=batch_size)  # + val_
    summary.update(test=scored["test"])
    summary.update(exports=export(model, dirs.path, splits))
    if fit_baselines is not None:
        summary.update(baselines=fit_baselines(splits))
    _finish(summary, members, scored)
    return summary


def _finish(summary: RunSummary, members: list[dict[str, Any]], scored) -> None:
    """summary.json completed: the members' steps, their furthest epoch, the ensemble's scores."""
    summary.finish(
        "completed",
        rows=[],
        steps_completed=sum(m["steps_completed"] for m in members),
        examples_per_sec=None,
    )
    summary.update(
        metrics=scored["metrics"], epochs_completed=max(m["epochs_completed"] for m in members)
    )
    summary.write()


def _train_members(seeds: int, seed: int, dirs: RunDir, summary: RunSummary, train_member):
    """Each member's summary, trained unless an earlier attempt completed it."""
    members = []
    for index in range(seeds):
        member = dirs.member(index)
        done = member.summary()
        if not (done and done.get("status") == "completed"):
            log.info("ensemble: member %d of %d (seed %d)", index + 1, seeds, seed + index)
            done = train_member(index, member)
        members.append(done)
        summary.update(ensemble=record(seeds, members))
        summary.write()
    return members
