"""A recipe that selects tfrecipe's Optuna sweeper with a given `hydra.sweeper.storage`, and what
`tfrecipe validate` says of it: the storage rule (a recipe keeps its study in a file; a server's
URL only from the command line) is checked by tests/test_optuna_sweeper.py and
tests/trust/test_security.py alike."""

from __future__ import annotations

from pathlib import Path

import pytest


def validate_storage_recipe(folder: Path, storage: str, *, refused: str | None) -> None:
    """Validates a recipe in `folder` whose storage is `storage` (a YAML value); `refused`: the
    error's pattern when it must be refused, None when it must pass."""
    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    recipe = folder / "storage_recipe.yaml"
    recipe.write_text(
        "# @package _global_\ndefaults: [{override /hydra/sweeper: optuna}]\n"
        f"hydra: {{sweeper: {{storage: {storage}}}}}\n"
    )
    if refused is None:
        validate([f"recipe={recipe}"])
        return
    with pytest.raises(ConfigError, match=refused):
        validate([f"recipe={recipe}"])
