"""The one writer: every file tfrecipe writes goes through `write_atomic` (or `replace_with`).

- A file is written to a temporary name created exclusively (`O_EXCL`, `O_NOFOLLOW`) in the
  target's own folder, fsynced and renamed into place: a crash leaves the old file or the new
  one, never half of either, and a link planted at a predictable temporary name leads nowhere.
- A target that is a symbolic link, or not a regular file, is refused: a write never follows a
  link out of the folder it was aimed at.
- Inside a run dir this process holds (`Manifest.own`), a file is replaced only when the run's
  manifest (`MANIFEST`, in the run dir) lists it: what the user or another program put there is
  never overwritten. Each file written is added to the manifest.
- `check_output` is the rule for outputs a user names (`predict -o`): not an input, not a
  directory, not a link, not a file of a run dir.
- What a library writes goes through here too: weights through `write_weights`, a
  log written as it goes through `open_log`, and a folder a library fills (TensorBoard's events,
  tf.train's checkpoints, W&B's and MLflow's records) through `library_dir`. A run dir a run
  holds is checked whole first (`check_tree`): a received run dir with a link leading out of it,
  or a FIFO or device inside, is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO

from tfrecipe import reading
from tfrecipe.errors import ConfigError

# The run's own files, one path (relative to the run dir) per line, appended as they are made.
MANIFEST = ".tfrecipe-files"
# What marks a dir as a tfrecipe run's (an earlier version wrote no manifest).
RUN_MARKERS = (MANIFEST, "summary.json", "signature.json")
# A run's manifest names each file it wrote once: a few KB (a long run's checkpoints, an ensemble's
# members: tens of KB).
MAX_MANIFEST_BYTES = 16 * 1024 * 1024

_held: set[Path] = set()  # run dirs this process writes
_adopting: set[Path] = set()  # held dirs of an earlier version: their files are the run's
_writers: dict[Path, set[threading.Thread]] = {}  # held dir -> threads writing into it


class NotOurs(ConfigError):
    """A write would replace a file tfrecipe did not create, or follow a link."""


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A run dir's manifest (MANIFEST): the files tfrecipe wrote there, the only ones it may
    replace, and whether this process writes the dir.

    Attributes:
      run_dir: the run dir, its folders' links resolved (`Manifest.of`).
    """

    run_dir: Path

    @classmethod
    def of(cls, run_dir: str | os.PathLike) -> Manifest:
        return cls(_absolute(Path(run_dir)))

    def own(self, *, adopt: bool = False) -> None:
        """Makes the run dir one this process writes; its manifest is made with the first file.
        `adopt`: the files already there become the run's (a run dir of a version that kept no
        manifest)."""
        _held.add(self.run_dir)
        manifest = self.run_dir / MANIFEST
        if manifest.is_symlink() or (manifest.exists() and not manifest.is_file()):
            raise NotOurs(f"{manifest}: not a regular file; tfrecipe will not write through it")
        if adopt and not manifest.exists():
            _adopting.add(self.run_dir)  # listed with the first file written: nothing before

    def held(self) -> bool:
        return self.run_dir in _held

    def release(self) -> None:
        wait_for_writers(self.run_dir)  # a failed run's last write lands, and is listed, while
        _writers.pop(self.run_dir, None)  # the dir is still the run's
        _held.discard(self.run_dir)
        _adopting.discard(self.run_dir)

    def owned(self) -> set[str]:
        """The paths (relative to the run dir) the manifest lists; a folder listed owns its
        contents."""
        manifest = self.run_dir / MANIFEST
        if manifest.is_symlink() or not manifest.is_file():
            return set(self._entries()) if self.run_dir in _adopting else set()
        try:  # through the reader, capped: a received run dir's manifest is data (a sparse 4 GB)
            text = reading.read_text(manifest, limit=MAX_MANIFEST_BYTES, what="a run's manifest")
        except reading.UnreadableFile as error:
            raise NotOurs(f"{error}; tfrecipe will not write into this run dir") from None
        return {line for line in text.splitlines() if line}

    def owns(self, path: Path) -> bool:
        """Whether `path` (in the run dir) is the run's: it, or a folder holding it, is listed."""
        relative = _absolute(path).relative_to(self.run_dir)
        names = self.owned()
        parts = relative.parts
        return any(str(Path(*parts[:n])) in names for n in range(1, len(parts) + 1))

    def claim(self, names: Iterable[str]) -> None:
        """Adds paths written by others on the run's behalf (Hydra's `.hydra/`, its log) to the
        run's manifest."""
        manifest = self.run_dir / MANIFEST
        if not manifest.exists() and self.run_dir in _adopting:
            _append(manifest, sorted(self._entries()))
        new = [n for n in names if n not in self.owned()]
        if new:
            _append(manifest, new)

    def _entries(self) -> list[str]:
        return [p.name for p in self.run_dir.iterdir() if p.name != MANIFEST]


def start_writer(thread: threading.Thread, run_dir: Path | None) -> None:
    """Starts `thread`, which writes a file beside training (best.weights.h5) in the held
    `run_dir` that `check_writable` returned for it (None: none): the dir waits for it before
    it is released (`Manifest.release`). A run that failed while its thread wrote would
    otherwise leave the file there unlisted, and its resume would refuse to replace it."""
    if run_dir is not None:
        running = {t for t in _writers.get(run_dir, ()) if t.is_alive()}
        _writers[run_dir] = running | {thread}
    thread.start()


def wait_for_writers(run_dir: str | os.PathLike) -> None:
    """Until the threads writing into `run_dir` (`start_writer`) are done: a write's scratch
    folder is its own until the file is in its place (a run's end that clears partial files,
    `fault.disk.settle`, would take it from under the write)."""
    for thread in list(_writers.get(_absolute(Path(run_dir)), ())):
        thread.join()


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


def write_cache(path: Path, data: str | bytes, *, is_ours: Callable[[bytes], bool]) -> None:
    """A cache outside any run dir (the perf cache, which an environment variable may aim
    anywhere): written where nothing is, or over a regular file this cache wrote (`is_ours` of
    its bytes). A folder, a link, a device or another program's file is never replaced.

    Raises:
      NotOurs: the target is not this cache's; the caller warns and goes on without it.
    """
    from tfrecipe import reading

    path = Path(path)
    if not os.path.lexists(path):
        write_atomic(path, data)
        return
    if path.is_symlink() or not path.is_file():
        raise NotOurs(f"{path}: a link, folder or device, not a cache tfrecipe wrote")
    try:
        existing = reading.read_bytes(path, limit=reading.MAX_JSON_BYTES, what="a cache")
    except (OSError, ValueError) as error:
        raise NotOurs(f"{path}: {reading.first_line(error)}") from None
    if not is_ours(existing):
        raise NotOurs(f"{path}: not a cache tfrecipe wrote; it is left as it is")
    write_atomic(path, data)


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
        Manifest(root).claim([str(path.relative_to(root))])


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
    if root is not None and path.exists() and not Manifest(root).owns(path):
        raise NotOurs(
            f"{path}: already there and not written by this run (not in {root / MANIFEST}); "
            "tfrecipe never replaces a file it did not create: move it, or choose another dir"
        )
    return root


# Folders of a run dir whose library makes links of its own and never writes through one: W&B
# links its debug logs into its cache and `latest-run` to its newest run, and each start writes a
# new folder and replaces those links.
LINKING_LIBRARIES = frozenset({"wandb"})


def check_tree(folder: Path, *, key: str | None = "hydra.run.dir") -> None:
    """Refuses `folder` when anything inside it is a link leading out of it (but inside
    `LINKING_LIBRARIES`' folders), or neither a regular file, a folder nor a link (a FIFO, a
    device, a socket): what a run or a library writes there then lands inside the folder, in
    files of its own. Links that stay inside are left alone. The refusal names `key` (None: the
    folder alone)."""
    folder = Path(os.path.realpath(folder))
    named, fix = (f"{key}={folder}", f"choose another {key}") if key else (str(folder), "move it")
    for parent, names, file_names in os.walk(folder):
        for name in [*names, *file_names]:
            path = Path(parent) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                target = Path(os.path.realpath(path))
                inside = target == folder or target.is_relative_to(folder)
                if inside or path.relative_to(folder).parts[0] in LINKING_LIBRARIES:
                    continue
                raise NotOurs(
                    f"{named}: {path.relative_to(folder)} is a link to {target}, outside it; "
                    f"tfrecipe writes only files it created, never through a link: remove the "
                    f"link, or {fix}"
                )
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise NotOurs(
                    f"{named}: {path.relative_to(folder)} is not a regular file or folder (a "
                    f"FIFO, device or socket); remove it, or {fix}"
                )


def library_dir(path: Path) -> Path:
    """`path`, a folder filled with files of a library's naming (TensorBoard, tf.train's
    CheckpointManager, W&B, MLflow) or appended to as the run goes: refused as `check_writable`
    and `check_tree` refuse, then made and listed in the run's manifest (a folder listed owns
    its contents)."""
    path = _absolute(path)
    root = check_writable(path)
    if path.exists() and path.name not in LINKING_LIBRARIES:
        check_tree(path, key=None)
    path.mkdir(parents=True, exist_ok=True)
    if root is not None and not Manifest(root).owns(path):
        Manifest(root).claim([str(path.relative_to(root))])
    return path


def write_weights(model, path: Path) -> None:
    """The model's weights (`model.save_weights(path)`), made in `replace_with`'s scratch folder:
    Keras' h5 writer writes in place, so a crash mid-save would leave half a file, and it follows
    a link. Without the optimizer's state, which Keras 3 writes there too: what reads these files
    (evaluate, predict, the sidecar evaluator) loads the weights into a model without one, and a
    resume reads the backup. Adam's two slots per weight made an MLP's file 2.7x larger and its
    save 2x slower (12 against 6 ms on the 2-core EPYC)."""
    import keras  # here: the command line imports this module without TensorFlow

    optimizer = getattr(model, "optimizer", None)
    with replace_with(path) as scratch:
        keras.saving.save_weights(model, scratch, objects_to_skip=[optimizer] if optimizer else [])


def open_log(path: Path, kept: str = "") -> TextIO:
    """A log written as it goes (steps.csv, the evaluator's metrics.csv): `kept` (a resumed run's
    rows) written as a new file by `write_atomic`, then that file opened for appending, never
    through a link."""
    write_atomic(path, kept)
    descriptor = os.open(_absolute(path), os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    return os.fdopen(descriptor, "a", newline="")


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


def _append(manifest: Path, names: list[str]) -> None:
    descriptor = os.open(manifest, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "a") as f:
        f.write("".join(f"{name}\n" for name in names))
