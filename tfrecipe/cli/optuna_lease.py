"""A running trial's lease: how a worker of an Optuna sweep shows that it is alive where the
study lives in a file (`sqlite:///FILE`, `journal:///FILE`).

Optuna's heartbeat fails a trial whose worker stopped beating, but only on RDB storage: the
journal storage has none (Optuna 4 and 5), so a trial of a killed worker would stay RUNNING for
ever. tfrecipe's own: the worker holds an exclusive `flock` on `FILE.trials/<trial id>` from
the moment it asked for the trial until it told the study how the trial ended. The kernel
releases it when the worker ends in any way (SIGKILL included), and on a shared file system
(NFS) the server does when the client machine is lost; a worker or a rerun that can take the
lock knows the trial's worker is gone (`worker_gone`), and cli.optuna_study fails the trial and
retries it. No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from tfrecipe.files import NotOurs

# Beside the study's file: FILE.trials/<trial id>, one empty file per running trial.
SUFFIX = ".trials"
# In that folder: the lock a worker holds while it counts the trials and asks for the next.
ASK_LOCK = "ask"


def lease_dir(storage_url: str) -> Path | None:
    """Where the leases of a study in `storage_url` live: beside its file (None: a database
    server, which has Optuna's heartbeat)."""
    if storage_url.startswith("journal:///"):
        path = storage_url.removeprefix("journal://")  # as tracking.optuna_trial opens it
    elif storage_url.startswith("sqlite:///"):  # sqlite:///rel.db, sqlite:////abs.db
        path = storage_url.removeprefix("sqlite:///").split("?", 1)[0]
    else:
        return None
    if not path.strip("/") or path == ":memory:":
        return None
    file = Path(path).absolute()
    return file.with_name(file.name + SUFFIX)


@contextlib.contextmanager
def held(folder: Path | None, trial_id: int) -> Iterator[None]:
    """Holds the lease of trial `trial_id` while the block runs (nothing for a database server;
    nothing either, but the same run, on a file system without locks)."""
    if folder is None:
        yield
        return
    path = folder / str(trial_id)
    descriptor = _create(path)
    try:
        with contextlib.suppress(OSError):  # no locks here: worker_gone then tells nothing
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # before the lock goes: nobody takes a finished trial's lease
        os.close(descriptor)


def worker_gone(folder: Path | None, trial_id: int) -> bool | None:
    """Whether the worker of running trial `trial_id` is gone (its lease can be taken): True,
    and the lease is removed; False while its worker holds it; None when nothing tells (no lease
    yet, a database server, a file system without locks)."""
    if folder is None:
        return None
    path = folder / str(trial_id)
    try:  # for writing: NFS takes an exclusive flock only on a file open for writing
        descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:  # not taken yet (or already given back): nothing to tell
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return True
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def asking(folder: Path | None) -> Iterator[None]:
    """One worker at a time counts the study's trials and asks for the next while the block
    runs (an exclusive `flock` on FILE.trials/ask): two workers that each see one trial left
    would otherwise both ask for it. Nothing for a database server, which has no file to lock
    (cli.optuna_study then drops a surplus trial unrun)."""
    if folder is None:
        yield
        return
    descriptor = _create(folder / ASK_LOCK)
    try:
        with contextlib.suppress(OSError):  # no locks here: as without the file
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _create(path: Path) -> int:
    """`path` (a lease, the ask lock) opened for its lock, made if missing with its folder, never
    through a link: a link or a non-folder in their place is refused in one line (exit 2)."""
    folder = path.parent
    problem = None
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        problem = f"{folder}: a link or not a folder, where the sweep keeps its trials' leases"
    else:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as error:
            problem = f"{path}: {'a symbolic link' if path.is_symlink() else error.strerror}"
    raise NotOurs(f"{problem}; tfrecipe writes only files it made, never through a link: remove it")
