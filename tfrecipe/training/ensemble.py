"""`ensemble.seeds=N`: the members' training, what the ensemble's summary records of them, and
the averaged model's scores (the members' configs: `schema.member_config`; the model itself:
tfrecipe.models.ensemble)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keras

from tfrecipe import rundir, signature
from tfrecipe.config import schema
from tfrecipe.config.grants import Grants
from tfrecipe.data.tabular import StatsCache
from tfrecipe.models import ensemble as ensemble_model
from tfrecipe.models.build import compile_model, register_custom_objects
from tfrecipe.runs import RunDir
from tfrecipe.training import summary as summaries
from tfrecipe.training.context import RunContext
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
    shared = (
        "num_replicas",
        "per_replica_batch_size",
        "global_batch_size",
        "learning_rate",
        "positive_class",
    )
    fields = {name: first[name] for name in shared if name in first}
    counts = [m.get("params") or {} for m in members]
    fields["params"] = {
        kind: sum(c.get(kind, 0) for c in counts) for kind in ("total", "trainable")
    }
    return fields


def load(run_dir: Path, *, seeds: int, task: schema.Task, grants: Grants) -> keras.Model:
    """The members' exported models (model.keras) as one model averaging them, compiled."""
    register_custom_objects()
    members = [
        keras.saving.load_model(run_dir / MEMBERS / str(index) / rundir.MODEL, compile=False)
        for index in range(seeds)
    ]
    model = ensemble_model.averaged(members, task=task.name)
    # An optimizer it never steps: a model.keras compiled without one does not load again
    # (Keras' compile_from_config builds the optimizer), and `tfrecipe evaluate` loads it.
    compile_model(model, task=task, optimizer="sgd", grants=grants)
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Members:
    """What an ensemble's run needs besides the context.

    Attributes:
      seeds: `ensemble.seeds`, the members' number.
      dataset: the run's `dataset`, which the averaged model is scored on.
      batch_size: the per-replica batch its examples are prepared at.
      train_member: `train_member(index, home)` trains member `index` into the RunDir `home`;
        returns its summary.
      export: `export(model, run_dir, splits)`: the exports' summary.
      fit_baselines: `fit_baselines(splits)`, when the run fits baselines.
    """

    seeds: int
    dataset: schema.Target
    batch_size: int
    train_member: Callable[[int, RunDir], dict[str, Any]]
    export: Callable[[keras.Model, Path, Any], dict[str, Any]]
    fit_baselines: Callable[[Any], dict[str, Any]] | None


def train_ensemble(
    ctx: RunContext, attempt: dict[str, RunSummary], spec: Members, *, started: float
) -> RunSummary:
    """`ensemble.seeds=N` in the claimed `ctx.home`: N member runs (RUN_DIR/members/I, seed + I;
    a completed member is kept, an interrupted one resumes from its own backup), then one model
    averaging them, evaluated, exported and recorded as a single run's."""
    home = ctx.home
    fields = summaries.ensemble_fields(dict(ctx.recorded), seeds=spec.seeds, run_dir=home.path)
    summary = RunSummary(home, fields, started=started)
    summary.start(ctx.config, chief=home.chief)
    attempt["summary"] = summary
    members = _train_members(ctx, spec, summary)
    first = home.member(0)
    splits = load_splits(
        spec.dataset,
        grants=ctx.grants,
        stats_cache=StatsCache(first.path, chief=False),
        task=ctx.task,
    )
    summary.update(as_single_run(members))
    if home.chief:  # the members' inputs and outputs are the ensemble's (predict reads it)
        signature.write(home, first.signature())
    model = load(home.path, seeds=spec.seeds, task=ctx.task, grants=ctx.grants)
    scored = scores(model, splits, pipeline=ctx.pipeline, seed=ctx.seed, batch_size=spec.batch_size)
    summary.update(test=scored["test"])  # and val_ metrics, in _finish
    summary.update(exports=spec.export(model, home.path, splits))
    if spec.fit_baselines is not None:
        summary.update(baselines=spec.fit_baselines(splits))
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


def _train_members(ctx: RunContext, spec: Members, summary: RunSummary) -> list[dict[str, Any]]:
    """Each member's summary, trained unless an earlier attempt completed it."""
    members = []
    for index in range(spec.seeds):
        member = ctx.home.member(index)
        done = member.summary()
        if not (done and done.get("status") == "completed"):
            seed = ctx.seed + index
            log.info("ensemble: member %d of %d (seed %d)", index + 1, spec.seeds, seed)
            done = spec.train_member(index, member)
        members.append(done)
        summary.update(ensemble=record(spec.seeds, members))
        summary.write()
    return members
