"""Where the configs live, and composing them without TensorFlow.

`conf/` holds the config groups and `recipes/` the recipes. In a checkout they sit beside the
package; an installed wheel carries them inside it (pyproject's force-include).
"""

from __future__ import annotations

import functools
import os
import re
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
    """Composes the config the way `python -m tfrecipe` does (for tests and subcommands).

    Raises:
      hydra.errors.HydraException: the first unknown group option, unknown key or bad override;
        its `later_errors` attribute holds the others (Hydra stops at the first: composing
        again without each offending override finds them all, `every_error`), and
        `composed_without` the config the other overrides compose (or None), for `validate`
        to report that config's problems beside them.
    """
    from hydra.errors import HydraException

    overrides = recipe_file_overrides(overrides or [])
    try:
        return _compose(overrides, return_hydra_config)
    except HydraException as error:
        later, rest = _later_errors(overrides, error, return_hydra_config)
        error.later_errors = later  # type: ignore[attr-defined]
        error.composed_without = rest  # type: ignore[attr-defined]
        raise


def every_error(error: BaseException) -> list[BaseException]:
    """`error` and the errors composing found after it (`compose`)."""
    return [error, *getattr(error, "later_errors", [])]


def _compose(overrides: list[str], return_hydra_config: bool) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from tfrecipe.config import changes  # noqa: F401  (the resolver of hydra.output_subdir)

    register_recipes()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return hydra_compose(
            PRIMARY_CONFIG, overrides=overrides, return_hydra_config=return_hydra_config
        )


def _later_errors(
    overrides: list[str], error: BaseException, return_hydra_config: bool
) -> tuple[list[BaseException], DictConfig | None]:
    """The errors composing meets once each offending override before is left out, in turn,
    and the config the other overrides compose (None: an error named no override of the list)."""
    from hydra.errors import HydraException

    found: list[BaseException] = []
    while (left := _without_offender(overrides, error)) is not None and len(found) < 50:
        overrides = left
        try:
            return found, _compose(overrides, return_hydra_config)
        except HydraException as later:
            found.append(later)
            error = later
    return found, None


def _without_offender(overrides: list[str], error: BaseException) -> list[str] | None:
    """`overrides` without the ones `error` is about (None: it names none of them)."""
    missing = getattr(error, "missing_cfg_file", None)
    if getattr(error, "options", None) is not None and missing:
        keys = {missing.rpartition("/")[0]}  # an unknown option of group G: G=...
    else:
        keys = set(re.findall(r"'([^'\s]+)'", str(error).split("\n")[0]))
    left = [o for o in overrides if _override_key(o) not in keys and o not in keys]
    return left if len(left) < len(overrides) else None


def _override_key(override: str) -> str:
    """`model.dropout` for `++model.dropout=0.1`; `model` for `model@x=cnn`."""
    key = override.partition("=")[0].lstrip("+~")
    return key.partition("@")[0]
