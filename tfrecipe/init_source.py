"""`model.init_from`'s source: which of the accepted forms a path is (a run dir, a `.keras`
model, a `.weights.h5` file, a backup checkpoint), decided without TensorFlow: the warm start
(tfrecipe/models/warm_start.py) resolves it as it loads, and `tfrecipe validate` reports what a
run would refuse in it, in the same words. So too `resume=PATH`'s checkpoints
(tfrecipe/fault/recovery.py refuses a path that holds none: `no_checkpoint`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from tfrecipe import rundir
from tfrecipe.errors import ConfigError, Problem
from tfrecipe.outcome import BACKUP_DIR, listed_checkpoints

KEY = "model.init_from"
_ACCEPTED = "a run dir, a .keras model, a .weights.h5 file or a backup checkpoint (dir or prefix)"


@dataclasses.dataclass(frozen=True)
class Source:
    """A resolved `init_from`: `kind` is "keras" (a .keras zip), "h5" or "checkpoint" (a prefix)."""

    path: Path
    kind: str


def resolve(path: str | Path, *, checkpoints: Callable[[Path], list[str]]) -> Source:
    """Which of the accepted forms `path` is (a directory: its model.keras, else the newest
    backup, found as `resume=` finds it).

    Args:
      path: `model.init_from`.
      checkpoints: a directory's backup checkpoints, newest first (the warm start's:
        `fault.backup.resolve_checkpoints`, as `resume=` finds them).

    Raises:
      ConfigError: it does not exist or is none of them.
    """
    given = Path(str(path)).expanduser()
    if given.is_dir():
        if (given / rundir.MODEL).is_file():
            return Source(given / rundir.MODEL, "keras")
        newest = next(iter(checkpoints(given)), None)
        if newest is not None and Path(f"{newest}.index").is_file():
            return Source(Path(newest), "checkpoint")
        raise ConfigError(
            f"{KEY}={path}: the directory holds no model.keras and no backup checkpoint; "
            f"expected {_ACCEPTED}"
        )
    if given.is_file() and given.name.endswith(".keras"):
        return Source(given, "keras")
    if given.is_file() and given.name.endswith(".weights.h5"):
        return Source(given, "h5")
    if Path(f"{given}.index").is_file():
        return Source(given, "checkpoint")
    what = "does not exist" if not given.exists() else "is not one of them"
    raise ConfigError(f"{KEY}={path}: {what}; expected {_ACCEPTED}")


def source_problems(path: str | Path | None) -> list[Problem]:
    """What a run refuses in `model.init_from=path` before reading its tensors (`tfrecipe
    validate`): a backup directory's checkpoints found by their files, without TensorFlow."""
    if path is None:
        return []
    try:
        resolve(path, checkpoints=_listed_backups)
    except ConfigError as error:
        return error.problems
    return []


def no_checkpoint(resume: str) -> str:
    """A run's refusal of `resume=PATH` where no checkpoint is found there; where the path is a
    finished run's dir (its model.keras, no backups: they are off by default for one process),
    the way to go on from it: its weights by `model.init_from`."""
    if (Path(resume).expanduser() / rundir.MODEL).is_file():
        return (
            f"resume={resume}: no checkpoint there, but a finished model ({rundir.MODEL}, no "
            "backups: callbacks.backup.enabled=true keeps them); to start from its weights, "
            f"give {KEY}={resume} and a new hydra.run.dir"
        )
    return (
        f"resume={resume}: no checkpoint there; expected a checkpoint prefix (e.g. "
        "RUN_DIR/backup/ckpt-100), a backup dir or a run dir, or resume=auto|never"
    )


def resume_problems(resume: str) -> list[Problem]:
    """What a run refuses in `resume=PATH` before reading a checkpoint (`tfrecipe validate`):
    a path holding none, its backups found by their files, without TensorFlow."""
    if resume in ("auto", "never"):
        return []
    path = Path(resume)
    found = _listed_backups(path) if path.is_dir() else Path(f"{path}.index").is_file()
    return [] if found else ConfigError(no_checkpoint(resume)).problems


def _listed_backups(directory: Path) -> list[str]:
    """A run dir's or a backup dir's checkpoints, as `fault.backup.resolve_checkpoints` finds
    them where their state file is whole."""
    return listed_checkpoints(directory) or listed_checkpoints(directory / BACKUP_DIR)
