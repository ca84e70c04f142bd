"""What data a run was trained on: a fingerprint of every file its dataset names, kept in the
run dir (`data_fingerprint.json`), so that a resume or `tfrecipe evaluate` on other data is
refused instead of silently mixing two datasets into one model.

A file's fingerprint is its size, its modification time and a hash of its content: the whole
file up to `WHOLE_FILE_BYTES`, else its first, middle and last `BLOCK_BYTES` (with its size), so
that taking it costs at most a few MB of reading per file. A rewrite that keeps size and
modification time is still found in a small file, and in a large one where it touches a sampled
block; a large file whose modification time moved counts as changed (its unsampled bytes cannot
be vouched for). Past `MAX_HASHED_BYTES` read in all (a huge image folder), files are
fingerprinted by size and modification time only, and the log says so.

The files are the values of the dataset config's `path`, `*_path` and `*_files` keys: a file, a
directory (every regular file under it, as the readers list it: hidden ones left out, see
tfrecipe/data/listing.py) or a glob. Each file is recorded under its key, by its
name relative to that key's file, directory or glob root, so data moved to another machine
(`dataset.path=...` given again) matches as long as its contents do. TFDS' `data_dir` is not
fingerprinted (TFDS versions its datasets itself, and one data_dir holds many).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfrecipe import rundir
from tfrecipe.config.changes import Resuming
from tfrecipe.errors import ConfigError
from tfrecipe.files import write_atomic

log = logging.getLogger("tfrecipe")

FILE = rundir.FINGERPRINT
WHOLE_FILE_BYTES = 3 << 20  # hashed whole up to this size: no more than the blocks would read
BLOCK_BYTES = 1 << 20  # else the first, middle and last block of this size
MAX_HASHED_BYTES = 2 << 30  # read in all at a run's start; past it, size and mtime only
_VERSION = 1


# --- taking it ------------------------------------------------------------------------------------
# Digests this process already took, by file and (size, mtime, ctime): a write changes the
# ctime, which no `touch` can set back, so a file read at a run's start is not read again for
# its statistics' key.
_TAKEN: dict[tuple, tuple[str, bool]] = {}


def file_digest(path: str | os.PathLike) -> tuple[str, bool]:
    """(hex digest, sampled) of a file's content: whole when small, else first/middle/last
    blocks; the size is part of the digest either way."""
    info = os.stat(path)
    version = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if version not in _TAKEN:
        _TAKEN[version] = _digest(path, info.st_size)
    return _TAKEN[version]


def _digest(path: str | os.PathLike, size: int) -> tuple[str, bool]:
    digest = hashlib.sha256(str(size).encode())  # SHA-NI: faster than blake2b on x86
    with open(path, "rb") as f:
        if size <= WHOLE_FILE_BYTES:
            while chunk := f.read(BLOCK_BYTES):
                digest.update(chunk)
            return digest.hexdigest(), False
        for offset in (0, (size - BLOCK_BYTES) // 2, size - BLOCK_BYTES):
            f.seek(offset)
            digest.update(f.read(BLOCK_BYTES))
    return digest.hexdigest(), True


def data_files(dataset: Mapping[str, Any], prefix: str = "dataset") -> dict[str, dict[str, Path]]:
    """`{key: {name: file}}` for each key of `dataset` that names data files (see the module's
    docstring); a name is relative to the key's root. A path that does not exist names nothing
    here (the dataset reports it)."""
    found: dict[str, dict[str, Path]] = {}
    for key, value in dataset.items():
        key, where = str(key), f"{prefix}.{key}"
        if isinstance(value, Mapping):
            found.update(data_files(value, where))
        elif _names_files(key) and value:
            values = [value] if isinstance(value, str | os.PathLike) else value
            files: dict[str, Path] = {}
            for item in values if isinstance(values, list | tuple) else []:
                files.update(_expand(str(item)))
            found[where] = files
    return found


def _names_files(key: str) -> bool:
    return key == "path" or key.endswith("_path") or key.endswith("_files")


def _expand(spec: str) -> dict[str, Path]:
    """The regular files a path, directory or glob names, by name relative to its root."""
    path = Path(spec).expanduser()
    if glob.has_magic(spec):
        root = Path(spec.split("*")[0].split("?")[0].split("[")[0])
        root = root if spec.endswith("/") or root.is_dir() else root.parent
        matches = [Path(m) for m in glob.glob(str(path), recursive=True)]
        files = [f for m in matches for f in (_walk(m) if m.is_dir() else [m])]
    elif path.is_dir():
        root, files = path, _walk(path)
    else:
        root, files = path.parent, [path] if path.exists() else []
    return {os.path.relpath(f, root): f for f in sorted(files) if _regular(f)}


def _walk(folder: Path) -> list[Path]:
    """Every file under `folder` as the readers list it (`listing.folder_files`: hidden ones and
    links to folders left out)."""
    from tfrecipe.data.listing import folder_files

    return folder_files(folder)


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def take(dataset: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint of the files `dataset` (the dataset config) names, as saved."""
    budget, unhashed = MAX_HASHED_BYTES, 0
    keys: dict[str, dict[str, Any]] = {}
    for key, files in data_files(dataset).items():
        entries = keys.setdefault(key, {})
        for name, path in files.items():
            info = path.stat()
            entry = {
                "path": str(path.absolute()),
                "size": info.st_size,
                "mtime_ns": info.st_mtime_ns,
                "digest": None,
                "sampled": True,
            }
            read = min(info.st_size, WHOLE_FILE_BYTES)
            if read <= budget:
                entry["digest"], entry["sampled"] = file_digest(path)
                budget -= read
            else:
                unhashed += 1
            entries[name] = entry
    if unhashed:
        log.warning(
            "data fingerprint: %d files past the first %s read are kept by size and modification "
            "time only (a rewrite keeping both would go unnoticed there)",
            unhashed,
            f"{MAX_HASHED_BYTES >> 30} GiB",
        )
    return {"version": _VERSION, "files": keys}


# --- comparing it ---------------------------------------------------------------------------------
def changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(key, file, what changed) for each file added, removed or changed between two
    fingerprints."""
    found = []
    before, after = saved.get("files", {}), now.get("files", {})
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key, {}), after.get(key, {})
        for name in sorted(old.keys() | new.keys()):
            if name not in new:
                found.append((key, old[name].get("path", name), "is gone"))
            elif name not in old:
                found.append((key, new[name]["path"], "is new"))
            else:
                why = _changed(old[name], new[name])
                if why:
                    found.append((key, new[name]["path"], why))
    return found


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    if old.get("size") != new["size"]:
        return f"changed size ({old.get('size')} -> {new['size']} bytes)"
    if old.get("digest") and new["digest"] and old["digest"] != new["digest"]:
        return "changed content"
    vouched = old.get("digest") and new["digest"] and not (old.get("sampled") or new["sampled"])
    if not vouched and old.get("mtime_ns") != new["mtime_ns"]:
        return "was modified (a large file, whose unsampled bytes cannot be compared)"
    return None


def _allows(entry: str, key: str, path: str) -> bool:
    return key == entry or key.startswith(f"{entry}.") or path in (entry, os.path.abspath(entry))


def check_unchanged(
    saved: Mapping[str, Any], now: Mapping[str, Any], resuming: Resuming, *, command: str
) -> None:
    """Refuses data that changed since `saved` was taken, except under a key or a file
    `resuming` allows to change (`resume_allow_changes`).

    Raises:
      ConfigError: one line naming the first changed file, its key and how to accept it.
    """
    allowed = resuming.allow_changes
    found = [c for c in changes(saved, now) if not any(_allows(a, c[0], c[1]) for a in allowed)]
    if not found:
        return
    key, path, why = found[0]
    more = f" (and {len(found) - 1} more files)" if len(found) > 1 else ""
    raise ConfigError(
        f"{command}: {key} file {path} {why} since the run started{more}; the run's model "
        f"was trained on the old data. Start a new run in a new hydra.run.dir, or accept the "
        f"change with resume_allow_changes=[{key}]"
    )


def load(home: rundir.RunFiles) -> dict[str, Any] | None:
    """The run's saved fingerprint; None: the run has none (a run from before fingerprints).

    Raises:
      ConfigError: the file is there but not a fingerprint (damaged or edited).
    """
    from tfrecipe import reading

    path = home.file("fingerprint")
    if not os.path.lexists(path):
        return None
    try:  # through the reader: a link to a device or a huge file is refused, not read
        saved = reading.read_json(path, what="a run's data fingerprint")
        if saved.get("version") != _VERSION or not isinstance(saved.get("files"), dict):
            raise ValueError("not a data fingerprint")
    except (OSError, ValueError, AttributeError) as error:
        raise ConfigError(
            f"{path}: cannot be read ({error}); the data the run was trained on cannot be "
            "checked. Remove the file to accept the data as it is now"
        ) from None
    return saved


# --- what a run calls -----------------------------------------------------------------------------
def check_resumed(
    home: rundir.RunFiles, dataset: Mapping[str, Any], resuming: Resuming
) -> dict[str, Any]:
    """At the start of a run (the chief, before the data is read): a run dir that holds a
    fingerprint is being resumed, so its data must be the same (`check_unchanged`).

    Returns:
      the fingerprint of the data as it is now, for `record` once the run dir is written.
    """
    now = take(dataset)
    saved = load(home) if resuming.mode != "never" else None
    if saved is not None:
        check_unchanged(saved, now, resuming, command=f"resume={resuming.mode}")
    return now


def record(home: rundir.RunFiles, fingerprint: Mapping[str, Any]) -> None:
    """Keeps `fingerprint` (`check_resumed`'s) as the run's data (a change a resume allowed is
    the run's data from now on)."""
    write_atomic(home.file("fingerprint"), json.dumps(fingerprint, indent=1) + "\n")


def check_and_record(home: rundir.RunFiles, dataset: Mapping[str, Any], resuming: Resuming) -> None:
    """`check_resumed`, then `record` (for a run dir that exists)."""
    record(home, check_resumed(home, dataset, resuming))


def check_run_data(home: rundir.RunFiles, run, *, command: str) -> None:
    """Every command that reads a finished run's data (`tfrecipe evaluate`, `baseline`,
    `export`'s check examples), given the run's validated config: the data must be what the run
    was trained on (where it kept a fingerprint), or allowed to differ (`resume_allow_changes`)."""
    saved = load(home)
    if saved is not None:
        now = take(run.dataset.model_dump(by_alias=True))
        check_unchanged(saved, now, Resuming.of(run), command=command)
