"""The commit of a git checkout, read from git's own files, running no program.

`git` in a user's folder runs what that folder's configuration names: a clean filter
(`filter.NAME.clean`, applied by `git status` to every file it re-hashes), an fsmonitor hook, a
`core.pager`, and whatever a `.git` *file* there points at elsewhere. A folder is data, whoever
made it, so nothing here executes anything: the commit is read from `HEAD`, the ref it names (a
loose ref or `packed-refs`, in the worktree's own git dir or the common one), and whether the
checkout has changes is judged from the index's recorded sizes and times against the files, each
file whose times differ hashed as git hashes a blob (its raw bytes: no filter runs, so a checkout
whose filters change files reads as changed, never as clean when it is not).

Every file is read through the one reader (regular files, capped sizes): a `.git/HEAD` that is a
FIFO or a link to `/dev/zero` reads as no checkout.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
from pathlib import Path

from tfrecipe import reading

_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
_SMALL = 1024**2  # HEAD, a ref, a `.git` file, `commondir`
_PACKED_REFS = 64 * 1024**2
_INDEX = 256 * 1024**2
# Files re-hashed to tell a touched file from a changed one; past these, changes are unknown.
_MAX_REHASHED_FILES = 200
_MAX_REHASHED_BYTES = 64 * 1024**2
_ENTRY = struct.Struct(">10I20sH")  # ctime s/ns, mtime s/ns, dev, ino, mode, uid, gid, size


def find(directory: Path) -> tuple[Path, Path] | None:
    """(the work tree, its git dir) of the checkout holding `directory`: a `.git` folder, or the
    folder a `.git` file's `gitdir:` line names; None outside one."""
    for folder in (directory, *directory.parents):
        dot_git = folder / ".git"
        if dot_git.is_dir():
            return folder, dot_git
        if dot_git.is_file():
            line = _read(dot_git, _SMALL).strip()
            if not line.startswith("gitdir:"):
                return None
            target = Path(line.removeprefix("gitdir:").strip())
            return folder, target if target.is_absolute() else folder / target
    return None


def commit(git: Path) -> str | None:
    """The commit `HEAD` names in the git dir `git` (following `ref:` lines), None if unborn."""
    common = _common_dir(git)
    text = _read(git / "HEAD", _SMALL).strip()
    for _ in range(5):  # symbolic refs may chain; git stops at 5 as well
        if _SHA.match(text):
            return text
        if not text.startswith("ref:"):
            return None
        text = _ref(git, common, text.removeprefix("ref:").strip())
    return None


def dirty(git: Path, work_tree: Path) -> bool | None:
    """Whether a tracked file differs from the index (None: cannot tell: an index format this
    does not read, or too much to re-hash). Untracked files do not count, as in
    `git status --untracked-files=no`; staged changes are not compared with the commit."""
    try:
        data = reading.read_bytes(git / "index", limit=_INDEX, what="git's index")
    except (OSError, ValueError):
        return None
    if data[:4] != b"DIRC" or struct.unpack(">I", data[4:8])[0] not in (2, 3):
        return None
    budget = [_MAX_REHASHED_FILES, _MAX_REHASHED_BYTES]
    for entry, name in _entries(data):
        changed = _changed(entry, work_tree / name, budget)
        if changed is not False:
            return changed
    return False


def _entries(data: bytes):
    """(the fixed fields, the path) of each entry of a version 2 or 3 index."""
    count, offset = struct.unpack(">I", data[8:12])[0], 12
    for _ in range(count):
        entry = _ENTRY.unpack_from(data, offset)
        flags = entry[-1]
        start = offset + _ENTRY.size + (2 if flags & 0x4000 else 0)  # v3 extended flags
        end = data.index(b"\0", start)
        yield entry, os.fsdecode(data[start:end])
        length = end - offset
        offset += (length // 8 + 1) * 8  # 1 to 8 NULs pad an entry to a multiple of 8


def _changed(entry: tuple, path: Path, budget: list[int]) -> bool | None:
    mode, size, sha = entry[6], entry[9], entry[10]
    if stat.S_IFMT(mode) == 0o160000:  # a submodule: its own checkout
        return False
    try:
        info = path.lstat()
    except OSError:
        return True  # deleted
    if info.st_size % 2**32 != size:
        return True
    if divmod(info.st_mtime_ns, 10**9) == (entry[2], entry[3]):
        return False
    if not stat.S_ISREG(info.st_mode):  # a link, or a file replaced by something else
        return not stat.S_ISLNK(info.st_mode) or None
    budget[0] -= 1
    budget[1] -= info.st_size
    if budget[0] < 0 or budget[1] < 0:
        return None
    try:
        content = reading.read_bytes(path, limit=info.st_size, what="a tracked file")
    except (OSError, ValueError):
        return None
    blob = hashlib.sha1(b"blob %d\0" % len(content) + content, usedforsecurity=False)
    return blob.digest() != sha


def _common_dir(git: Path) -> Path:
    """Where a linked worktree's shared refs live (its `commondir` file), else `git` itself."""
    named = git / "commondir"
    if not named.is_file():
        return git
    target = Path(_read(named, _SMALL).strip())
    return target if target.is_absolute() else git / target


def _ref(git: Path, common: Path, name: str) -> str:
    """The content of the ref `name`: a loose ref (the worktree's, then the common dir's), else its
    line in `packed-refs`; "" when there is none."""
    if ".." in Path(name).parts or Path(name).is_absolute():
        return ""
    for base in (git, common):
        if (base / name).is_file():
            return _read(base / name, _SMALL).strip()
    for line in _read(common / "packed-refs", _PACKED_REFS).splitlines():
        sha, _, ref = line.partition(" ")
        if ref.strip() == name and _SHA.match(sha):
            return sha
    return ""


def _read(path: Path, limit: int) -> str:
    """A small text file of git's, "" when it is missing or not a regular file."""
    try:
        return reading.read_text(path, limit=limit, what="a git file")
    except (OSError, ValueError):
        return ""
