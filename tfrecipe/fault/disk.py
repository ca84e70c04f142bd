"""A full disk: the run still says how it ended, in one line, and leaves no partial files.

A disk that fills during a run fails whatever writes next: a backup, `best.weights.h5` (where
h5py, failing to close the file, then crashed the process with a segmentation fault), a log line,
the summary itself, which stayed `running`. So:

- `reserve` sets aside `RESERVE_BYTES` in the run dir (`.reserve`, allocated, not sparse) as the
  run starts; `release` frees them right before the final summary.json is written, which then
  fits however full the disk is;
- `check_room` raises an ENOSPC `OSError` before a weights file (h5py) is written where there is
  less free space than the weights take (`callbacks.BestCheckpoint`, `models.export.export_model`);
- `is_disk_full` recognizes the error wherever it was raised (Python's `OSError`, TensorFlow's
  and h5py's messages), and `remove_partial_files` deletes the temporary files the failed writes
  left (`.NAME.tmp`, `.partial-*`, a backup's `*_temp` files);
- a disk full before training starts (Hydra's own `.hydra/` files fail to write) ends the same
  way: one line, and summary.json says "failed", disk full (`record_failed_start`).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
from pathlib import Path

from tfrecipe import files

RESERVE = ".reserve"
RESERVE_BYTES = 256 * 1024  # a final summary.json is a few KB
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_FULL_MESSAGES = ("No space left on device", "Disk quota exceeded", "File too large")


def reserve(run_dir: Path) -> None:
    """Sets aside RESERVE_BYTES for the final summary (raises OSError on a disk already full), in
    a file of its own: one left there (a crash's, or a received run dir's) is removed first."""
    release(run_dir)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    descriptor = os.open(run_dir / RESERVE, flags, 0o600)
    try:
        os.posix_fallocate(descriptor, 0, RESERVE_BYTES)
    except OSError:
        os.close(descriptor)
        release(run_dir)
        raise
    os.close(descriptor)


def release(run_dir: Path) -> None:
    """Frees the reserve (a no-op when there is none)."""
    with contextlib.suppress(OSError):
        (run_dir / RESERVE).unlink()


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, says the disk (or quota) is full."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _FULL_ERRNOS:
            return True
        if any(message in str(error) for message in _FULL_MESSAGES):
            return True  # TensorFlow's errors carry the OS's message only
        error = error.__cause__ or error.__context__
    return False


def error_text(error: BaseException, run_dir: Path) -> str:
    """summary.json's `error` (and the console's line): for a full disk, that it is one."""
    if isinstance(error, KeyboardInterrupt):  # a second Ctrl-C: no text of its own
        return (
            "interrupted (a second Ctrl-C): stopped at once, without a backup of this point; "
            "rerun the same command to resume from the last one"
        )
    if not is_disk_full(error):
        return f"{type(error).__name__}: {error}"
    return (
        f"disk full: no space left in {run_dir} (free some, then rerun the same command to "
        f"resume from the last backup); {type(error).__name__}: {_first_line(error)}"
    )


def settle(run_dir: Path) -> None:
    """Before the final summary.json: the reserve freed for it, partial files removed."""
    release(run_dir)
    remove_partial_files(run_dir)


def _first_line(error: BaseException) -> str:
    """The line saying the disk is full (TensorFlow's first line names an op), else the first."""
    lines = str(error).strip().splitlines() or [""]
    full = [line for line in lines if any(m in line for m in _FULL_MESSAGES)]
    return (full or lines)[0].strip()[:300]


def record_failed_start(run_dir: Path, error: BaseException) -> str:
    """A disk that filled before training could start (Hydra writing `.hydra/` or the log):
    Hydra's half-written files removed, then summary.json says the run failed, disk full (it
    fits where those files were). Returns the console's one line.

    Raises:
      OSError: summary.json cannot be written either (the disk is full to the last byte).
    """
    from tfrecipe.rundir import SUMMARY, RunFiles

    text = error_text(error, run_dir)
    if (run_dir / SUMMARY).exists():  # a run that got further says how it ended itself
        return f"tfrecipe: training failed: {text}"
    shutil.rmtree(run_dir / ".hydra", ignore_errors=True)  # Hydra's, cut short: not a record
    for log_file in run_dir.glob("*.log"):
        if log_file.stat().st_size == 0:
            log_file.unlink()
    remove_partial_files(run_dir)
    RunFiles(run_dir).record_status("failed", text, fields={})
    return f"tfrecipe: training failed: {text}"


def remove_partial_files(run_dir: Path) -> None:
    """Deletes what interrupted writes leave: atomic writes' `.NAME.tmp`, exports' `.partial-*`
    and `.saved_model*.tmp`, TensorFlow's `*_temp` checkpoint files in `backup/`; a write still
    under way beside training (best.weights.h5's thread) lands first."""
    files.wait_for_writers(run_dir)
    for pattern in (".*.tmp", ".partial-*", "backup/*_temp*", "backup/*.tempstate*"):
        for path in run_dir.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


def check_room(directory: Path, needed: int) -> None:
    """Raises ENOSPC when `directory`'s file system has less than `needed` bytes free."""
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"{os.strerror(errno.ENOSPC)} ({free} bytes free, {needed} needed to write "
            f"weights in {directory})",
        )


def weights_bytes(model) -> int:
    """Room to write the model's weights file (`.weights.h5` and `.keras` alike hold the
    optimizer's variables too: 939,768 bytes for the digits CNN's 74,602 parameters with Adam),
    with h5's own overhead and 64 KB to spare."""
    optimizer = getattr(model, "optimizer", None)
    variables = [*model.weights, *(optimizer.variables if optimizer is not None else ())]
    size = 0
    for variable in variables:
        count = math.prod(int(dim) for dim in variable.shape)
        size += count * _itemsize(variable.dtype)
    return int(size * 1.2) + 64 * 1024


def _itemsize(dtype) -> int:
    import numpy  # not at import: the command line reads this module without NumPy

    try:
        return numpy.dtype(str(dtype)).itemsize
    except TypeError:
        return 4
