"""The one writer: every file tfrecipe writes goes through `write_atomic` (or `replace_with`).

- A file is written to a temporary name created exclusively (`O_EXCL`, `O_NOFOLLOW`) in the
  target's own folder, fsynced and renamed into place: a crash leaves the old file or the new
  one, never half of either, and a link planted at a predictable temporary name leads nowhere.
- A target that is a symbolic link, or not a regular file, is refused: a write never follows a
  link out of the folder it was aimed at.
- Inside a run dir this process holds (`own_dir`), a file is replaced only when the run's
  manifest (`MANIFEST`, in the run dir) lists it: what the user or another program put there is
  never overwritten. Each file written is added to the manifest.
- `check_output` is the rule for outputs a user names (`predict -o`): not an input, not a
  directory, not a link, not a file of a run dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from tfrecipe.errors import ConfigError

# The run's own files, one path (relative to the run dir) per line, appended as they are made.
MANIFEST = ".tfrecipe-files"
# What marks a dir as a tfrecipe run's (an earlier version wrote no manifest).
RUN_MARKERS = (MANIFEST, "summary.json", "signature.json")

_held: set[Path] = set()  # run dirs this process writes
_adopting: set[Path] = set()  # held dirs of an earlier version: their files are the run's


class NotOurs(ConfigError):
    """A write would replace a file tfrecipe did not create, or follow a link."""


def own_dir(run_dir: Path, *, adopt: bool = False) -> None:
    """Makes `run_dir` a dir this process writes; its manifest is made with the first file.
    `adopt`: the files already there become the run's (a run dir of a version that kept no
    manifest)."""
    run_dir = _absolute(run_dir)
    _held.add(run_dir)
    manifest = run_dir / MANIFEST
    if manifest.is_symlink() or (manifest.exists() and not manifest.is_file()):
        raise NotOurs(f"{manifest}: not a regular file; tfrecipe will not write through it")
    if adopt and not manifest.exists():
        _adopting.add(run_dir)  # listed with the first file written: nothing is added before


def is_held(run_dir: Path) -> bool:
    return _absolute(run_dir) in _held


def release_dir(run_dir: Path) -> None:
    _held.discard(_absolute(run_dir))
    _adopting.discard(_absolute(run_dir))


def owned(run_dir: Path) -> set[str]:
    """The paths (relative to `run_dir`) its manifest lists; a folder listed owns its contents."""
    manifest = Path(run_dir) / MANIFEST
    if manifest.is_symlink() or not manifest.is_file():
        return set(_entries(Path(run_dir))) if _absolute(run_dir) in _adopting else set()
    return {line for line in manifest.read_text().splitlines() if line}


def is_owned(path: Path, run_dir: Path) -> bool:
    relative = _absolute(path).relative_to(_absolute(run_dir))
    names = owned(run_dir)
    return any(str(Path(*relative.parts[:n])) in names for n in range(1, len(relative.parts) + 1))


def claim(run_dir: Path, names: Iterable[str]) -> None:
    """Adds paths written by others on the run's behalf (Hydra's `.hydra/`, its log) to the
    run's manifest."""
    manifest = Path(run_dir) / MANIFEST
    if not manifest.exists() and _absolute(run_dir) in _adopting:
        _append(manifest, sorted(_entries(Path(run_dir))))
    new = [n for n in names if n not in owned(run_dir)]
    if new:
        _append(manifest, new)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Writes `data` to `path` through a temporary file of its own (see the module doc)."""
    with replace_with(path) as tmp:
        descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(descriptor, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())


@contextlib.contextmanager
def replace_with(path: Path) -> Iterator[Path]:
    """Yields where to make the new `path` (a file or a folder, with `path`'s own name, so that
    writers that insist on a suffix accept it): inside a scratch folder made exclusively (mode
    0700) beside `path`. On success it is renamed into place (an existing folder is replaced
    only once the new one is whole); on failure nothing is left."""
    path = _absolute(path)
    check_writable(path)  # before the work of filling it
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield scratch / path.name
        put(scratch / path.name, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def put(written: Path, path: Path) -> None:
    """Moves a finished file or folder into place at `path` (same file system), under the
    writer's rules; an existing folder goes only once the new one is in its place."""
    path = _absolute(path)
    root = check_writable(path)
    if path.is_dir() and not path.is_symlink():
        aside = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
        os.replace(path, aside / path.name)
        os.replace(written, path)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(written, path)
    if root is not None:
        claim(root, [str(path.relative_to(root))])


def check_writable(path: Path) -> Path | None:
    """Refuses a write to `path` that would follow a link or replace what is not the run's;
    returns the held run dir `path` is in (None: none)."""
    path = _absolute(path)
    if path.is_symlink():
        raise NotOurs(f"{path}: a symbolic link; tfrecipe does not write through links")
    if path.exists() and not (path.is_file() or path.is_dir()):  # a FIFO, a device
        raise NotOurs(f"{path}: not a regular file; tfrecipe will not write to it")
    # The innermost held dir decides (an ensemble's member runs sit inside its run dir).
    holding = [r for r in _held if path.is_relative_to(r) and path != r]
    root = max(holding, key=lambda r: len(r.parts), default=None)
    if root is not None and path.exists() and not is_owned(path, root):
        raise NotOurs(
            f"{path}: already there and not written by this run (not in {root / MANIFEST}); "
            "tfrecipe never replaces a file it did not create: move it, or choose another dir"
        )
    return root


def check_output(path: Path, *, inputs: Iterable[Path] = (), key: str = "--output") -> None:
    """An output file the user names: a new or replaceable regular file that is not one of
    `inputs` and not inside a tfrecipe run dir (another run's files are that run's)."""
    path = _absolute(path)
    if path.is_symlink():
        raise NotOurs(f"{key}={path}: a symbolic link; name the file itself")
    if path.is_dir():
        raise NotOurs(f"{key}={path}: a directory; name a file (e.g. {path / 'predictions.csv'})")
    if path.exists() and not path.is_file():
        raise NotOurs(f"{key}={path}: not a regular file")
    for given in inputs:
        given = _absolute(given)
        same = path.exists() and given.exists() and os.path.samefile(path, given)
        if same or path == given or (given.is_dir() and path.is_relative_to(given)):
            raise NotOurs(f"{key}={path}: is an input of this command ({given}); name a new file")
    for folder in path.parents:
        if any((folder / marker).exists() for marker in RUN_MARKERS):
            raise NotOurs(
                f"{key}={path}: inside the run dir {folder}, whose files are that run's; write "
                "the output elsewhere"
            )


def _absolute(path: Path) -> Path:
    """`path` with its folders' links resolved, its own name kept (a link there is refused)."""
    path = Path(path)
    return Path(os.path.realpath(path.parent)) / path.name


def _entries(run_dir: Path) -> list[str]:
    return [p.name for p in run_dir.iterdir() if p.name != MANIFEST]


def _append(manifest: Path, names: list[str]) -> None:
    descriptor = os.open(manifest, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "a") as f:
        f.write("".join(f"{name}\n" for name in names))
