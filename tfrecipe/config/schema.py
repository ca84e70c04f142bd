"""The typed schema of every config group, checked once, early, with every problem reported.

The YAML files in `conf/` hold the defaults; the sections say what is allowed. `validate` runs
on the composed config before any TensorFlow work and raises one `ConfigError` listing each
problem as `key: what is wrong (received value)`.

The schema lives in four modules, and every name of theirs the package uses is reachable here:
  training_sections.py  how a run trains: strategy, task, model, precision, batching, optimizer,
                        loop
  run_sections.py       what surrounds it: callbacks, export, loggers, cluster, sweep; `RunConfig`
  cross_checks.py       the rules across sections (export limits: export_limits.py)
  messages.py           a pydantic error as one-line `Problem`s
Here too: `member_config`, an ensemble member's run derived from the run's.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError

from tfrecipe.config import messages
from tfrecipe.config.checks import config_problems
from tfrecipe.config.cross_checks import cross_section_problems
from tfrecipe.config.export_limits import EXPORT_FORMATS, PERIODIC_EXPORT_FORMATS
from tfrecipe.config.messages import did_you_mean
from tfrecipe.config.run_sections import (
    Backup,
    Baseline,
    Callbacks,
    Cluster,
    CsvLogger,
    EarlyStopping,
    Ensemble,
    Export,
    ExportFormat,
    K8sCluster,
    LiteRT,
    LocalCluster,
    Logger,
    MlflowLogger,
    ModelCheckpoint,
    NoCluster,
    PeriodicExport,
    RunConfig,
    SlurmCluster,
    Sweep,
    TensorBoardLogger,
    TerminateOnNaN,
    TFConfigCluster,
    WandbLogger,
    mlflow_store_problem,
)
from tfrecipe.config.secrets import redact_text
from tfrecipe.config.training_sections import (
    FREEZE_HELP,
    MODEL_OPTIONS,
    SGD,
    STRATEGY_NAMES,
    TASK_NAMES,
    Adam,
    Batching,
    BinaryTask,
    CentralStorageStrategy,
    ClassificationTask,
    DefaultStrategy,
    Finetune,
    Loop,
    LRFind,
    MirroredStrategy,
    MultilabelTask,
    MultiWorkerMirroredStrategy,
    NonNegativeFloat,
    NonNegativeInt,
    OneDeviceStrategy,
    Optimizer,
    ParameterServerStrategy,
    PositiveFloat,
    PositiveInt,
    Precision,
    RegressionTask,
    Strategy,
    Target,
    Task,
    TPUStrategy,
    parse_freeze,
)
from tfrecipe.config.trust import Trust
from tfrecipe.errors import ConfigError, Problem

# The sections' names the package and its tests use as schema.NAME.
__all__ = [
    "EXPORT_FORMATS",
    "FREEZE_HELP",
    "MODEL_OPTIONS",
    "PERIODIC_EXPORT_FORMATS",
    "SGD",
    "STRATEGY_NAMES",
    "TASK_NAMES",
    "Adam",
    "Backup",
    "Baseline",
    "Batching",
    "BinaryTask",
    "Callbacks",
    "CentralStorageStrategy",
    "ClassificationTask",
    "Cluster",
    "CsvLogger",
    "DefaultStrategy",
    "EarlyStopping",
    "Ensemble",
    "Export",
    "ExportFormat",
    "Finetune",
    "K8sCluster",
    "LRFind",
    "LiteRT",
    "LocalCluster",
    "Logger",
    "Loop",
    "MirroredStrategy",
    "MlflowLogger",
    "ModelCheckpoint",
    "MultiWorkerMirroredStrategy",
    "MultilabelTask",
    "NoCluster",
    "NonNegativeFloat",
    "NonNegativeInt",
    "OneDeviceStrategy",
    "Optimizer",
    "ParameterServerStrategy",
    "PeriodicExport",
    "PositiveFloat",
    "PositiveInt",
    "Precision",
    "RegressionTask",
    "RunConfig",
    "SlurmCluster",
    "Strategy",
    "Sweep",
    "TFConfigCluster",
    "TPUStrategy",
    "Target",
    "Task",
    "TensorBoardLogger",
    "TerminateOnNaN",
    "WandbLogger",
    "did_you_mean",
    "member_config",
    "parse_freeze",
    "validate",
]


def validate(cfg: DictConfig, *, trust: Trust, environment: bool = False) -> RunConfig:
    """Checks the composed config; returns it typed or raises `ConfigError` with every problem.
    A config composed with Hydra's node (`hydra.*`) has that node checked too.

    Args:
      cfg: the composed config.
      trust: what this invocation's command line grants (`allowed_targets` counts only where
        it gives it; `Trust.NOTHING` grants nothing: a config read from a file).
      environment: a run is about to start: this process's environment is checked where it
        decides what the config leaves open (`environment_problems`); False: a finished run's
        config, or one only read.
    """
    cfg_hydra = cfg.hydra if "hydra" in cfg else None
    cfg = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    missing = sorted(OmegaConf.missing_keys(cfg))
    problems = [messages.missing(key) for key in missing]
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except Exception as error:  # an interpolation that cannot be resolved
        key = getattr(error, "full_key", "")
        raise ConfigError(Problem(key, hint=str(error)) if key else str(error)) from None
    problems += environment_problems(container, os.environ) if environment else []
    run, found = container_problems(container, cfg_hydra, trust=trust, missing=missing)
    if problems + found:
        raise ConfigError(problems + found)
    return run


def environment_problems(container: Mapping[str, Any], environ: Mapping[str, str]) -> list[Problem]:
    """What the environment gives a run that would fail it, checked as the config's own value
    would be: MLFLOW_TRACKING_URI, the store of a run that logs to MLflow and names none
    (`tracking.mlflow_run.tracking_uri`). Checked where a run starts and by `tfrecipe validate`,
    not where a finished run's config is read (predict, evaluate: they log nowhere)."""
    uri = environ.get("MLFLOW_TRACKING_URI")
    mlflow = (container.get("logger") or {}).get("mlflow")
    if not uri or not isinstance(mlflow, Mapping) or mlflow.get("tracking_uri") is not None:
        return []  # the config's own store (checked by the schema), or no MLflow
    problem = mlflow_store_problem(uri)
    if problem is None:
        return []
    return [
        Problem(
            "MLFLOW_TRACKING_URI",
            redact_text(uri),
            f"{problem.message()} (the store of a run whose logger.mlflow.tracking_uri is null); "
            "set it to another, or unset it for a sqlite file in the run or sweep dir",
        )
    ]


def container_problems(
    container: Mapping[str, Any],
    hydra: DictConfig | None,
    *,
    trust: Trust,
    missing: Iterable[str] = (),
) -> tuple[RunConfig | None, list[Problem]]:
    """`validate`'s check of a resolved config: the typed config (None where the schema refuses
    it) and every problem, the allow-lists' (`config_problems`) and the rules across sections'.

    Args:
      container: the config without Hydra's node, resolved.
      hydra: Hydra's node, when the config was composed with it.
      trust: what this invocation's command line grants.
      missing: keys already reported missing (the schema's problem there is not repeated).
    """
    allow_list = config_problems(container, hydra, trust=trust)
    try:
        run = RunConfig.model_validate(container)
    except ValidationError as error:
        problems = [p for p in messages.describe(error, container) if p.key not in missing]
        reported = {p.slot for p in problems}
        return None, problems + [p for p in allow_list if p.slot not in reported]
    run = _with_task_monitors(run)
    return run, allow_list + cross_section_problems(run)


def _with_task_monitors(run: RunConfig) -> RunConfig:
    """`monitor: auto` (checkpoint, early stopping) becomes the task's default monitor."""
    from tfrecipe.tasks import default_monitor

    callbacks, updates = run.callbacks, {}
    for key in ("model_checkpoint", "early_stopping"):
        spec = getattr(callbacks, key)
        if spec.monitor == "auto":
            updates[key] = spec.model_copy(update={"monitor": default_monitor(run.task)})
    if not updates:
        return run
    return run.model_copy(update={"callbacks": callbacks.model_copy(update=updates)})


def member_config(
    run: RunConfig, config: Mapping[str, Any], index: int
) -> tuple[RunConfig, dict[str, Any]]:
    """`ensemble.seeds=N`: member `index`'s run (seed + index, no ensemble, model.keras only, no
    baselines: the ensemble exports and fits those) and the config its config.yaml records."""
    seed = run.seed + index
    member_run = run.model_copy(
        update={
            "seed": seed,
            "ensemble": Ensemble(seeds=1),
            "baseline": Baseline(name="none"),
            "export": run.export.model_copy(update={"formats": ["keras"]}),
        }
    )
    member = copy.deepcopy(dict(config))
    member.update(seed=seed, ensemble={"seeds": 1}, baseline={"name": "none"})
    member["export"] = {**member.get("export", {}), "formats": ["keras"]}
    return member_run, member
