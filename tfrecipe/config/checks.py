"""`config_problems`: the one check of a composed config, found without importing or running
anything: its `allowed_targets` entries, every `_target_` by its slot's kind (`instantiate`) and
its arguments by the types its signature declares (`argument_types`), and Hydra's own node
(`hydra_node`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tfrecipe.config.argument_types import argument_type_problems
from tfrecipe.config.grants import Grants, allowed_prefix_problem
from tfrecipe.config.hydra_node import hydra_problems
from tfrecipe.config.instantiate import iter_targets, target_problem, target_problems
from tfrecipe.config.trust import Trust
from tfrecipe.errors import Problem


def config_problems(
    container: Mapping[str, Any],
    hydra: DictConfig | None,
    *,
    trust: Trust,
    output_dir: Path | None = None,
) -> list[Problem]:
    """Everything a composed config may not do, found without importing or running anything: the
    one check of a run's config, of each sweep point's and of a received run dir's.

    Args:
      container: the config without Hydra's node, resolved (where it resolves).
      hydra: Hydra's node (`cfg.hydra`), when the config was composed with it.
      trust: what this invocation's command line grants: `allowed_targets` entries it does not
        give are refused (a recipe or run dir cannot trust code for you).
      output_dir: the job's directory, where Hydra writes (None: `hydra.run.dir`).
    """
    allowed = container.get("allowed_targets")
    allowed = allowed if isinstance(allowed, list) else []  # not a list: the schema's problem
    problems = [p for p in (allowed_prefix_problem(e, trust=trust) for e in allowed) if p]
    grants = Grants.checked(allowed, trust=trust)
    refused = [e for e in allowed if e not in grants.prefixes]
    problems += target_problems(container, grants=grants, refused=refused)
    # the arguments of the targets it allows, by the types their signatures declare
    problems += argument_type_problems(
        (key, target, node)
        for key, target, node in iter_targets(container)
        if isinstance(target, str) and target_problem(target, key=key, grants=grants) is None
    )
    problems += command_line_only_problems(container, trust=trust)
    if hydra is not None:
        problems += hydra_problems(hydra, grants=grants, output_dir=output_dir)
    return problems


# Writes outside the run dir that only the command line may aim: key -> the values that are not
# paths.
COMMAND_LINE_ONLY = {
    "pipeline.cache": (None, "memory", ""),
    # XLA loads the programs it finds there: a folder only the command line may name.
    "batching.compile_cache": ("auto", False),
    # A tracking server receives the config, every metric and the model: the default (null)
    # is a sqlite file in the run or sweep dir, else MLFLOW_TRACKING_URI, your environment's.
    "logger.mlflow.tracking_uri": (None, ""),
}


def command_line_only_problems(container: Mapping[str, Any], *, trust: Trust) -> list[Problem]:
    """A config file may not aim a write outside the run dir (a cache, which a later run also
    reads back): those values count only when the command line gives them."""
    problems = []
    for key, plain in COMMAND_LINE_ONLY.items():
        value = _select(container, key)
        if value in plain or trust.gave(key, value):
            continue
        problems.append(
            Problem(
                key,
                value,
                "aims what the run writes or sends outside its run dir: only your command line may "
                f"name where, not a config file; pass {key}=... yourself if you mean it",
            )
        )
    return problems


def _select(container: Mapping[str, Any], key: str) -> Any:
    node: Any = container
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node
