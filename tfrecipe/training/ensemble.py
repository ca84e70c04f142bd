"""`ensemble.seeds=N`: the members' configs, what the ensemble's summary records of them, and the
averaged model's scores (the model itself: tfrecipe.models.ensemble)."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keras

from tfrecipe import rundir, signature
from tfrecipe.config import schema
from tfrecipe.data.tabular import StatsCache
from tfrecipe.models import ensemble as ensemble_model
from tfrecipe.models.build import compile_model, register_custom_objects
from tfrecipe.training import summary as summaries
from tfrecipe.training.dataset import evaluation_data, load_splits
from tfrecipe.training.process import Dirs
from tfrecipe.training.summary import RunSummary

log = logging.getLogger("tfrecipe")

MEMBERS = "members"  # RUN_DIR/members/I: member I's run dir
# What a member's summary holds of interest beside its test metrics.
_MEMBER_FIELDS = ("seed", "status", "steps_completed", "epochs_completed", "wall_time_s")


def member_config(
    run: schema.RunConfig, config: Mapping[str, Any], index: int
) -> tuple[schema.RunConfig, dict[str, Any]]:
    """Member `index`'s run (seed + index, no ensemble, model.keras only, no baselines: the
    ensemble exports and fits those) and the config its config.yaml records."""
    seed = run.seed + index
    member_run = run.model_copy(
        update={
            "seed": seed,
            "ensemble": schema.Ensemble(seeds=1),
            "baseline": schema.Baseline(name="none"),
            "export": run.export.model_copy(update={"formats": ["keras"]}),
        }
    )
    member = copy.deepcopy(dict(config))
    member.update(seed=seed, ensemble={"seeds": 1}, baseline={"name": "none"})
    member["export"] = {**member.get("export", {}), "formats": ["keras"]}
    return member_run, member


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
        keras.saving.load_model(run_dir / MEMBERS / str(index) / "model.keras", compile=False)
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
    config: Mapping[str, Any],
    run: schema.RunConfig,
    dirs: Dirs,
    attempt: dict[str, RunSummary],
    *,
    train_member: Callable[[Mapping[str, Any], schema.RunConfig, Dirs], dict[str, Any]],
    export: Callable[[keras.Model, Path, Any], dict[str, Any]],
    fit_baselines: Callable[[Any], dict[str, Any]] | None,
) -> RunSummary:
    """`ensemble.seeds=N`: N member runs (RUN_DIR/members/I, seed + I; a completed member is
    kept, an interrupted one resumes from its own backup), then one model averaging them,
    evaluated, exported and recorded as a single run's.

    Args:
      train_member: trains a member's run into its dirs; returns its summary.
      export: `export(model, run_dir, splits)`: the exports' summary.
      fit_baselines: `fit_baselines(splits)`, when the run fits baselines.
    """
    started = time.perf_counter()
    dirs.claim(config, resume=run.resume, allowed=run.resume_allow_changes)
    summary = RunSummary(
        dirs.run_dir, summaries.ensemble_fields(run, dirs.run_dir), started=started
    )
    summary.start(config, chief=dirs.chief)
    attempt["summary"] = summary
    members = _train_members(config, run, dirs, summary, train_member)
    first = dirs.run_dir / MEMBERS / "0"
    splits = load_splits(
        run.dataset, allowed_targets=run.allowed_targets,
        stats_cache=StatsCache(first, chief=False), task=run.task,
    )  # fmt: skip
    summary.update(as_single_run(members))
    if dirs.chief:  # the members' inputs and outputs are the ensemble's (predict reads it)
        signature.write(dirs.run_dir, signature.read(first))
    model = load(
        dirs.run_dir, seeds=run.ensemble.seeds, task=run.task, allowed_targets=run.allowed_targets
    )
    scored = scores(  # test, and val_ metrics
        model, splits, pipeline=run.pipeline, seed=run.seed,
        batch_size=run.batching.per_replica_batch_size,
    )  # fmt: skip
    summary.update(test=scored["test"])
    summary.update(exports=export(model, dirs.run_dir, splits))
    if fit_baselines is not None:
        summary.update(baselines=fit_baselines(splits))
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
    return summary


def _train_members(config, run: schema.RunConfig, dirs: Dirs, summary: RunSummary, train_member):
    """Each member's summary, trained unless an earlier attempt completed it."""
    members = []
    for index in range(run.ensemble.seeds):
        member_dir = dirs.run_dir / MEMBERS / str(index)
        member_run, member_cfg = member_config(run, config, index)
        done = rundir.read_summary(member_dir)
        if not (done and done.get("status") == "completed"):
            log.info("ensemble: member %d of %d (seed %d)", index + 1, run.ensemble.seeds,
                     member_run.seed)  # fmt: skip
            done = train_member(member_cfg, member_run, Dirs(member_dir, member_dir))
        members.append(done)
        summary.update(ensemble=record(run.ensemble.seeds, members))
        summary.write()
    return members
