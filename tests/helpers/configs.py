"""`validate` as the tests call it: a composed config checked with the trust a command line of
exactly those overrides would have (none by default: most tests' configs grant nothing)."""

from __future__ import annotations

from collections.abc import Sequence

from tfrecipe.config import schema
from tfrecipe.config.trust import Trust


def validate(cfg, *, granting: Sequence[str] = ()) -> schema.RunConfig:
    """schema.validate(cfg) under the trust of a command line that typed `granting`."""
    return schema.validate(cfg, trust=Trust.from_command_line(granting))
