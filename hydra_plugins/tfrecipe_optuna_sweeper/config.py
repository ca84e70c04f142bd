"""The config groups of tfrecipe's Optuna sweeper: `hydra/sweeper=optuna`, its samplers
(`hydra/sweeper/sampler=tpe|random|cmaes|nsgaii|qmc|grid`) and pruners
(`hydra/sweeper/pruner=none|median|percentile|hyperband|successive_halving`), each with Optuna's
parameters as keys. The keys of the stock hydra-optuna-sweeper keep their meaning.

Hydra imports this module by its file (no `from __future__ import annotations`: dataclasses
then fail to resolve it), and OmegaConf reads `Optional[...]`, not `X | None`."""

# ruff: noqa: UP006, UP035, UP045

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

PROVIDER = "tfrecipe"


@dataclass
class TPESamplerConfig:
    _target_: str = "optuna.samplers.TPESampler"
    seed: Optional[int] = None
    n_startup_trials: int = 10
    multivariate: bool = False
    # Several workers on one study: a running trial counts as a bad result for the others' picks.
    constant_liar: bool = False


@dataclass
class RandomSamplerConfig:
    _target_: str = "optuna.samplers.RandomSampler"
    seed: Optional[int] = None


@dataclass
class CmaEsSamplerConfig:
    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: Optional[int] = None
    n_startup_trials: int = 1


@dataclass
class NSGAIISamplerConfig:
    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: Optional[int] = None
    population_size: int = 50


@dataclass
class QMCSamplerConfig:
    _target_: str = "optuna.samplers.QMCSampler"
    seed: Optional[int] = None
    qmc_type: str = "sobol"


@dataclass
class GridSamplerConfig:
    # The grid is the search space's values, filled in when the sweep starts.
    _target_: str = "optuna.samplers.GridSampler"
    _partial_: bool = True
    seed: Optional[int] = None


@dataclass
class NonePrunerConfig:
    name: str = "none"


@dataclass
class MedianPrunerConfig:
    name: str = "median"
    n_startup_trials: int = 5
    n_warmup_steps: int = 0  # steps are epochs
    interval_steps: int = 1
    n_min_trials: int = 1


@dataclass
class PercentilePrunerConfig(MedianPrunerConfig):
    # Optuna's PercentilePruner: the median pruner's keys, and the percentile of trials kept.
    name: str = "percentile"
    percentile: float = 25.0


@dataclass
class HyperbandPrunerConfig:
    name: str = "hyperband"
    min_resource: int = 1
    max_resource: Any = "auto"
    reduction_factor: int = 3
    bootstrap_count: int = 0


@dataclass
class SuccessiveHalvingPrunerConfig:
    name: str = "successive_halving"
    min_resource: Any = "auto"
    reduction_factor: int = 4
    min_early_stopping_rate: int = 0
    bootstrap_count: int = 0


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.tfrecipe_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    defaults: List[Any] = field(default_factory=lambda: [{"sampler": "tpe"}, {"pruner": "none"}])

    sampler: Any = MISSING
    pruner: Any = MISSING
    # minimize or maximize `sweep.objective` (the value each job returns).
    direction: str = "minimize"
    # sqlite:///FILE, journal:///FILE (a file several machines share) or, from your command
    # line or TFRECIPE_SWEEP_STORAGE only, a database server's URL; null: SWEEP_DIR/study.db.
    storage: Optional[str] = None
    # null: "tfrecipe" (the study of the storage; name one to keep several in one file).
    study_name: Optional[str] = None
    # The study's finished (complete or pruned) trials to reach: a rerun continues up to it.
    n_trials: int = 20
    # Trials run at once on this machine, each worker starting the next as soon as it is free.
    n_jobs: int = 1
    # Failed trials (of this invocation's) tolerated, as a share of n_trials, before stopping.
    max_failure_rate: float = 0.0
    search_space: Optional[Dict[str, Any]] = None
    params: Optional[Dict[str, str]] = None
    custom_search_space: Optional[str] = None


_STORE = ConfigStore.instance()
_STORE.store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider=PROVIDER)
for _name, _node in {
    "tpe": TPESamplerConfig,
    "random": RandomSamplerConfig,
    "cmaes": CmaEsSamplerConfig,
    "nsgaii": NSGAIISamplerConfig,
    "qmc": QMCSamplerConfig,
    "grid": GridSamplerConfig,
}.items():
    _STORE.store(group="hydra/sweeper/sampler", name=_name, node=_node, provider=PROVIDER)
for _name, _node in {
    "none": NonePrunerConfig,
    "median": MedianPrunerConfig,
    "percentile": PercentilePrunerConfig,
    "hyperband": HyperbandPrunerConfig,
    "successive_halving": SuccessiveHalvingPrunerConfig,
}.items():
    _STORE.store(group="hydra/sweeper/pruner", name=_name, node=_node, provider=PROVIDER)
