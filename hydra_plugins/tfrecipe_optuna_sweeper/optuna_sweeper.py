"""The Hydra sweeper class `hydra/sweeper=optuna` names: a thin shim over tfrecipe's study
(tfrecipe.cli.optuna_study), imported only when a sweep uses it."""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf


class OptunaSweeper(Sweeper):
    """Runs a sweep's trials from an Optuna study that resumes, prunes and shares workers."""

    def __init__(self, **settings: Any) -> None:
        self.settings = {
            key: OmegaConf.to_container(value, resolve=True)
            if isinstance(value, DictConfig)
            else value
            for key, value in settings.items()
        }
        self.study = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from tfrecipe.cli.optuna_study import OptunaStudy

        self.study = OptunaStudy.create(
            self.settings, hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> None:
        assert self.study is not None, "setup() first"
        self.study.sweep(arguments)
