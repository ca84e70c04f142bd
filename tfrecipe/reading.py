"""One reader for every file tfrecipe reads: a user's data, a recipe, a run dir's files.

A file read is data, whoever wrote it, so before anything reads one:

- it is a regular file: what a path resolves to (links followed) is checked on the open
  descriptor itself, so a link to `/dev/zero`, a FIFO, a device or a socket is refused with one
  line naming the path, never read (a FIFO is opened without blocking, to be refused);
- it is at most as large as a file of its kind can sensibly be (`limit`), counted before it is
  read; a file that grows while it is read is cut off at the cap and refused too;
- an archive (`model.keras` and `.npz` files are zip archives) is measured from its central
  directory before any member is inflated: the inflated total, and how far it inflates
  (`MAX_INFLATION`), so a 4 MB file that would inflate to 4 GiB is refused up front. Python's
  `zipfile` (which Keras and NumPy read them with) stops each member at the size its directory
  entry declares, so the directory's sizes bound what is inflated.

Every refusal is an `UnreadableFile` (a `ValueError`: the data builders' callers report it as a
config error, exit code 2). No TensorFlow, no NumPy: every floor uses this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

MiB = 1024**2
GiB = 1024**3
# A run dir's JSON files (signature.json, summary.json, data_stats.json, evaluation.json): a few
# KB, data_stats.json up to a few MB with large vocabularies.
MAX_JSON_BYTES = 64 * MiB
# A resolved config (config.yaml, a recipe, Hydra's overrides.yaml): a few KB.
MAX_CONFIG_BYTES = 16 * MiB
# One example's file: no single image of a training set is this large (a 100-megapixel RGB bitmap
# is 300 MB); a file beyond it is a mistake (a disk image, a video renamed .jpg) that would be
# read whole into memory per step.
MAX_IMAGE_BYTES = 512 * MiB
# One text example (a `.txt` file): a book is a few MB.
MAX_TEXT_BYTES = 64 * MiB
# What an archive may hold inflated in all (a saved model's weights, an .npz's arrays)...
MAX_INFLATED_BYTES = 64 * GiB
# ...and how many times its compressed size it may inflate to, once past `_SMALL_ARCHIVE`:
# weights and data compress about 1-3x (float noise barely at all); a zip bomb, 1000x and more.
MAX_INFLATION = 100
_SMALL_ARCHIVE = 64 * MiB


class UnreadableFile(ValueError):
    """A file tfrecipe refuses to read: one line naming it and why."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _describe(path: Path, mode: int) -> str:
    """`a character device` or `a link to /dev/zero, a character device`."""
    kind = _kind(mode)
    if os.path.islink(path):
        return f"a link to {os.path.realpath(path)}, {kind}"
    return kind


def _refuse_kind(path: Path, mode: int, what: str) -> UnreadableFile:
    return UnreadableFile(
        f"{path}: {_describe(path, mode)}; {what or 'a file tfrecipe reads'} must be a regular file"
    )


def _refuse_size(path: Path, size: int, limit: int, what: str) -> UnreadableFile:
    return UnreadableFile(
        f"{path}: {human_bytes(size)}, more than {what or 'such a file'} can be (at most "
        f"{human_bytes(limit)}); is it the file you meant?"
    )


def human_bytes(count: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if count < 1024 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError  # not reached


def check_file(path: str | os.PathLike, *, limit: int | None = None, what: str = "") -> int:
    """The size of the regular file `path` resolves to.

    Args:
      path: the file (a link is followed: what it points to is what would be read).
      limit: the most bytes a file of this kind may hold (None: no cap, e.g. a streamed table).
      what: the kind of file in the user's words, for the message ("a text example").

    Raises:
      UnreadableFile: missing, not a regular file, or larger than `limit`.
    """
    path = Path(path)
    try:
        info = path.stat()
    except OSError as error:
        raise UnreadableFile(f"{path}: cannot be read ({error.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise _refuse_kind(path, info.st_mode, what)
    if limit is not None and info.st_size > limit:
        raise _refuse_size(path, info.st_size, limit, what)
    return info.st_size


@contextlib.contextmanager
def open_file(
    path: str | os.PathLike, *, limit: int | None = None, what: str = ""
) -> Iterator[IO[bytes]]:
    """The regular file `path` open for reading in binary, checked on its descriptor (no race
    between the check and the open: a path swapped for a FIFO meanwhile is refused too).

    Raises:
      UnreadableFile: as `check_file`.
    """
    path = Path(path)
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer before it can be refused
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise UnreadableFile(f"{path}: cannot be read ({error.strerror})") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse_kind(path, info.st_mode, what)
        if limit is not None and info.st_size > limit:
            raise _refuse_size(path, info.st_size, limit, what)
        os.set_blocking(descriptor, True)
        handle = os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
    with handle:
        yield handle


def read_bytes(path: str | os.PathLike, *, limit: int, what: str = "") -> bytes:
    """The whole of a regular file of at most `limit` bytes (one that grows past the cap while it
    is read is refused as well)."""
    with open_file(path, limit=limit, what=what) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise _refuse_size(Path(path), len(data), limit, what)
    return data


def read_text(path: str | os.PathLike, *, limit: int = MAX_CONFIG_BYTES, what: str = "") -> str:
    """A UTF-8 text file, as `read_bytes` reads it.

    Raises:
      UnreadableFile: as `read_bytes`, or the bytes are not UTF-8.
    """
    data = read_bytes(path, limit=limit, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnreadableFile(
            f"{path}: not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None


def read_json(path: str | os.PathLike, *, limit: int = MAX_JSON_BYTES, what: str = "") -> Any:
    """A JSON file (at most `limit` bytes).

    Raises:
      UnreadableFile: as `read_text`, or not JSON (with the line and column where it breaks).
      FileNotFoundError: there is no such file (callers often treat that as "not written yet").
    """
    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    text = read_text(path, limit=limit, what=what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UnreadableFile(
            f"{path}: damaged JSON ({error.msg} at line {error.lineno}, column {error.colno}); "
            "it was not written by tfrecipe, or was cut short"
        ) from None


def read_yaml(path: str | os.PathLike, *, limit: int = MAX_CONFIG_BYTES, what: str = ""):
    """A YAML config (OmegaConf's container of it): the text read through `read_text`, then parsed.

    Raises:
      UnreadableFile: as `read_text`, or not YAML OmegaConf takes (the parser's first line).
      FileNotFoundError: there is no such file.
    """
    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    text = read_text(path, limit=limit, what=what)
    from omegaconf import OmegaConf

    try:
        return OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except Exception as error:  # yaml's ScannerError/ParserError, OmegaConf's errors
        raise UnreadableFile(f"{path}: damaged YAML ({first_line(error)})") from None


def first_line(error: BaseException) -> str:
    text = " ".join(str(error).split("\n")[:1]).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def op_reason(error: BaseException) -> str:
    """A TensorFlow op error's first line without the graph's plumbing around it
    (`{{function_node __wrapped__IteratorGetNext_...}}` before, `[Op:DecodeImage] name:` after)."""
    lines = str(getattr(error, "message", error)).splitlines() or [""]
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", lines[0])
    return re.sub(r"\s*\[Op:\w+\]( name: \S*)?\s*$", "", text).strip() or type(error).__name__


def check_archive(
    path: str | os.PathLike,
    *,
    limit: int = MAX_INFLATED_BYTES,
    ratio: int = MAX_INFLATION,
    what: str = "",
) -> int:
    """The inflated size of the zip archive `path`, from its central directory alone (nothing is
    inflated): a regular file whose members together inflate to at most `limit` bytes and, past
    a few MB, to at most `ratio` times the archive's own size.

    Raises:
      UnreadableFile: not a regular file, not a zip archive, or inflating too far.
    """
    path = Path(path)
    with open_file(path, what=what) as handle:
        size = os.fstat(handle.fileno()).st_size
        try:
            with zipfile.ZipFile(handle) as archive:
                members = archive.infolist()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
            raise UnreadableFile(
                f"{path}: not a readable zip archive ({first_line(error)}); "
                f"{what or 'the file'} is damaged or of another kind"
            ) from None
    inflated = sum(member.file_size for member in members)
    too_far = inflated > _SMALL_ARCHIVE and inflated > ratio * max(size, 1)
    if inflated > limit or too_far:
        allowed = f"at most {human_bytes(limit)}"
        if too_far:
            allowed += f" and {ratio}x its own size"
        raise UnreadableFile(
            f"{path}: a {human_bytes(size)} archive whose members inflate to "
            f"{human_bytes(inflated)} ({allowed}); refused before inflating anything"
        )
    return inflated


def check_npz(path: str | os.PathLike, *, limit: int = MAX_INFLATED_BYTES) -> None:
    """An `.npz` file measured before NumPy reads it: `check_archive`'s sizes, and each array's
    header against its member's size (NumPy allocates the shape a header declares before it
    reads a byte of it: a header can declare terabytes in a few bytes).

    Raises:
      UnreadableFile: as `check_archive`, or an array larger than its member holds.
    """
    check_archive(path, limit=limit, what="an .npz file")
    import numpy as np

    with open_file(path) as handle, zipfile.ZipFile(handle) as archive:
        for member in archive.infolist():
            if not member.filename.endswith(".npy"):
                continue
            try:
                with archive.open(member) as stream:
                    version = np.lib.format.read_magic(stream)
                    read_header = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0  # 3.0: the same, in UTF-8
                    )
                    shape, _, dtype = read_header(stream, max_header_size=1 << 20)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
                raise UnreadableFile(
                    f"{path}: {member.filename} is not a readable array ({first_line(error)})"
                ) from None
            declared = dtype.itemsize * _product(shape)
            if declared > member.file_size:
                raise UnreadableFile(
                    f"{path}: {member.filename} declares an array of shape {list(shape)} "
                    f"({human_bytes(declared)}) but holds {human_bytes(member.file_size)}; the "
                    "file is damaged"
                )


def _product(shape) -> int:
    total = 1
    for size in shape:
        total *= int(size)
    return total
