"""A sweep job's side of an Optuna trial: the objective reported after every validation, and
the run stopped cleanly at that epoch's end when the study's pruner says so.

tfrecipe's Optuna sweeper (hydra_plugins/tfrecipe_optuna_sweeper) hands each job its trial
through the environment (`TRIAL_ENV`, which no config may set: `hydra_node.SAFE_ENV`): the
study's storage, its name, the trial's id and the pruner's settings, so a job in another process
(a SLURM job) reports as one in the sweeper's own. A pruned run finishes like a completed one
(backup, history.csv, model.keras, the trackers), says `status: pruned` in summary.json, and
marks its trial (`PRUNED_ATTR`) for the sweeper, which tells Optuna. The Keras side is
tracking.optuna_reporter; this module imports no TensorFlow (the sweep's process reads it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from tfrecipe.errors import Problem

log = logging.getLogger("tfrecipe")

TRIAL_ENV = "TFRECIPE_OPTUNA_TRIAL"
# The trial's user attribute a pruned job sets: the number of epochs it trained.
PRUNED_ATTR = "pruned_at_epoch"

# hydra/sweeper/pruner=NAME -> Optuna's pruner class (a fixed table: nothing is imported by name).
PRUNERS = {
    "none": "NopPruner",
    "median": "MedianPruner",
    "percentile": "PercentilePruner",
    "hyperband": "HyperbandPruner",
    "successive_halving": "SuccessiveHalvingPruner",
}


def make_pruner(spec: Mapping[str, Any] | None):
    """Optuna's pruner for `hydra.sweeper.pruner` ({name: median, n_startup_trials: 3, ...})."""
    import optuna

    spec = dict(spec or {"name": "none"})
    name = spec.pop("name", "none")
    if name not in PRUNERS:
        raise ValueError(f"hydra.sweeper.pruner.name={name!r}: expected one of {list(PRUNERS)}")
    if name == "none":
        return optuna.pruners.NopPruner()
    return getattr(optuna.pruners, PRUNERS[name])(**spec)


def pruner_problems(spec: Mapping[str, Any] | None) -> list[Problem]:
    """What Optuna refuses in `hydra.sweeper.pruner`'s parameters, found by building the pruner
    (before any study exists): the parameter Optuna's message names, else the whole setting."""
    import re

    spec = dict(spec or {"name": "none"})
    name = spec.get("name", "none")
    if name not in PRUNERS or name == "none":  # an unknown name: Hydra's group refuses it
        return []
    try:
        make_pruner(spec)
    except (TypeError, ValueError) as error:
        hint = f"Optuna's {PRUNERS[name]} refuses it: {error}"
        named = [key for key in spec if re.search(rf"\b{re.escape(key)}\b", str(error))]
        if named:
            return [Problem(f"hydra.sweeper.pruner.{named[0]}", spec[named[0]], hint)]
        return [Problem("hydra.sweeper.pruner", spec, hint)]
    return []


@dataclasses.dataclass(frozen=True)
class TrialHandle:
    """Where a job's trial lives: what the sweeper puts into TRIAL_ENV."""

    storage: str  # the study's storage URL (sqlite:///, journal:///, a database server's)
    study_name: str
    trial_id: int
    pruner: dict[str, Any]

    def environ(self) -> dict[str, str]:
        return {TRIAL_ENV: json.dumps(dataclasses.asdict(self))}

    @classmethod
    def of_this_process(cls) -> TrialHandle | None:
        raw = os.environ.get(TRIAL_ENV)
        if not raw:
            return None
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError):
            log.warning(
                "%s is not a trial handle tfrecipe wrote: not reporting to Optuna", TRIAL_ENV
            )
            return None


def open_storage(url: str):
    """Optuna's storage for `url`: `journal:///FILE` (a journal file), else an RDB URL."""
    import optuna

    if url.startswith("journal:///"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal://")))
    return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))


def _engine_kwargs(url: str) -> dict[str, Any] | None:
    """SQLite waits for another writer (several workers on one file) instead of failing."""
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite:") else None
