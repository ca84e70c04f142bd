"""Where the configs live, and composing them without TensorFlow.

`conf/` holds the config groups and `recipes/` the recipes. In a checkout they sit beside the
package; an installed wheel carries them inside it (pyproject's force-include).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from tfrecipe.errors import ConfigError

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # tfrecipe/

# conf/PRIMARY_CONFIG.yaml: the defaults list every run starts from.
PRIMARY_CONFIG = "config"


def _find(name: str) -> Path:
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"tfrecipe's {name}/ folder is missing from {_PACKAGE_DIR}")


def config_dir() -> Path:
    return _find("conf")


def recipes_dir() -> Path:
    return _find("recipes")


@functools.cache
def register_recipes() -> None:
    """Makes `recipe=NAME` select recipes/NAME.yaml.

    Recipes live outside `conf/` (they are what users copy and edit), so they enter Hydra's
    search path through the ConfigStore as the `recipe` group, each at package `_global_`.
    """
    for path in sorted(recipes_dir().glob("*.yaml")):
        register_recipe_file(path)


def register_recipe_file(path: Path) -> None:
    """Makes `recipe=STEM` select a recipe file outside `recipes/` (validate/cat a user's copy)."""
    from hydra.core.config_store import ConfigStore

    from tfrecipe import reading

    node = reading.read_yaml(path, what="a recipe")  # a regular file of a config's size
    ConfigStore.instance().store(group="recipe", name=path.stem, node=node, package="_global_")


def recipe_file_overrides(overrides: Sequence[str]) -> list[str]:
    """`recipe=PATH.yaml` (a user's recipe file, e.g. a `tfrecipe cp` copy) as `recipe=STEM`, the
    file registered under its stem: Hydra finds options by name, never by path. Every process
    that composes (a local cluster's tasks too) calls this on the user's own overrides."""
    result = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "recipe" and value.endswith((".yaml", ".yml")):
            path = Path(value).expanduser()
            if not os.path.lexists(path):
                raise ConfigError(f"recipe={value}: no such file")
            try:
                register_recipe_file(path)
            except ValueError as error:  # reading.UnreadableFile: a FIFO, a device, damaged YAML
                raise ConfigError(f"recipe={value}: {error}") from None
            override = f"recipe={path.stem}"
        result.append(override)
    return result


def compose(overrides: list[str] | None = None, *, return_hydra_config: bool = False) -> DictConfig:
    """Composes the config the way `python -m tfrecipe` does (for tests and subcommands)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from tfrecipe import rundir  # noqa: F401  (the resolver of hydra.output_subdir)

    register_recipes()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return hydra_compose(
            PRIMARY_CONFIG,
            overrides=recipe_file_overrides(overrides or []),
            return_hydra_config=return_hydra_config,
        )
