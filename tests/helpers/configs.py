"""`validate` as the tests call it: a composed config checked with the trust a command line of
exactly those overrides would have (none by default: most tests' configs grant nothing); a shown
command's earlier run stood in for."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tfrecipe.config import schema
from tfrecipe.config.trust import Trust


def validate(cfg, *, granting: Sequence[str] = ()) -> schema.RunConfig:
    """schema.validate(cfg) under the trust of a command line that typed `granting`."""
    return schema.validate(cfg, trust=Trust.from_command_line(granting))


def with_earlier_runs(args: Sequence[str], scratch: Path) -> list[str]:
    """A shown command's `model.init_from=RUN_DIR` pointed at a stand-in run dir under
    `scratch` (RUN_DIR/model.keras): the run the command before it makes, which `validate`
    requires as the run does."""
    stand_ins = []
    for arg in args:
        key, _, path = arg.partition("=")
        if key.lstrip("+") == "model.init_from" and path not in ("", "null"):
            run_dir = scratch / path.lstrip("/")
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "model.keras").touch()
            arg = f"{key}={run_dir}"
        stand_ins.append(arg)
    return stand_ins
