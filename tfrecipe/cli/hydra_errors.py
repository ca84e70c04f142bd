"""Hydra's and OmegaConf's errors about a config (an unknown option or key, a bad override),
as the one line tfrecipe reports for them."""

from __future__ import annotations

import re


def hydra_errors() -> tuple[type[BaseException], ...]:
    """The exception types Hydra and OmegaConf raise for a config (imported when asked: no
    Hydra import before it is needed)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return (HydraException, OmegaConfBaseException)


def describe(error: BaseException) -> str:
    """`group=option: unknown option ...; available: ...`, `key: unknown key ...; did you mean
    ...`, else the lines of Hydra's message that say what is wrong."""
    from hydra.errors import MissingConfigException

    if isinstance(error, MissingConfigException) and error.options is not None:
        group, _, option = (error.missing_cfg_file or "").rpartition("/")
        return (
            f"{group}={option}: unknown option for group '{group}'; available: "
            f"{', '.join(error.options)}"
        )
    # Hydra: "Could not override 'KEY'.\nTo append to your config use +KEY=VALUE"
    override = re.match(r"Could not override '([^']+)'.*use \+(\S+)", str(error), re.DOTALL)
    if override and "not in struct" in str(error.__cause__):
        from tfrecipe.config.schema import did_you_mean

        key, received = override.groups()
        suggestion = did_you_mean(key, getattr(error.__cause__, "parent_node", None) or [])
        to_add = f"to add a new key use +{key}=..."
        fix = f"{suggestion} (or {to_add})" if suggestion else to_add
        return f"{key}: unknown key (received {received}); {fix}"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # Hydra explains in several lines; keep the ones that say what is wrong.
    skip = ("full_key", "object_type", "Config search")
    useful = [line for line in lines if not line.startswith(skip)]
    return " ".join(useful[:3])
