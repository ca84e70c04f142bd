"""How a run ends, and what that allows the next start: the exit codes, `TrainingError`, where
backups go, and the guard that never lets a new run overwrite a finished one.

Without TensorFlow: the command line checks the run dir and maps errors to exit codes before
(or without) importing it, and the local launcher reads the same codes from its tasks.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from tfrecipe import files, rundir
from tfrecipe.errors import ConfigError

EXIT_TRAINING = 1  # training failed: summary.json says "failed"
EXIT_CONFIG = 2  # invalid configuration or usage: one line per problem, nothing written
# EX_TEMPFAIL (sysexits.h): "temporary failure, try again" — rerun the same command to resume.
EXIT_PREEMPTED = 75
# A worker made no training step for cluster.stall_timeout seconds: it wrote its threads' stacks
# to RUN_DIR/stall-TASK.txt and stopped. Restartable: a rerun resumes from the last backup.
EXIT_STALLED = 76
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C before the run could save anything
# A cluster task could not listen on its address: the port the local launcher picked was taken
# by another process before the task bound it. EX_UNAVAILABLE (sysexits.h); the launcher starts
# the cluster again on new ports without spending a restart.
EXIT_PORT_TAKEN = 69

# How a run that ended on its own ends: trained to its last epoch, or stopped by an Optuna
# sweep's pruner at an epoch's end. Neither is resumed or trained over.
FINISHED = ("completed", "pruned")

BACKUP_DIR = rundir.BACKUP  # RUN_DIR/backup: the chief's backups, which every worker restores from
# The local launcher numbers its attempts at running a cluster (0 first) in every task's env:
# a restarted attempt continues the same run in the same run dir.
ATTEMPT_ENV = "TFRECIPE_CLUSTER_ATTEMPT"


_CHECKPOINT_INDEX = re.compile(r"ckpt-(\d+)\.index")


def listed_checkpoints(path: Path) -> list[str]:
    """The `ckpt-STEP` checkpoints whose index file is in `path`, newest (highest step) first."""
    steps = []
    with contextlib.suppress(OSError):
        for entry in path.iterdir():
            if match := _CHECKPOINT_INDEX.fullmatch(entry.name):
                steps.append(int(match[1]))
    return [str(path / f"ckpt-{step}") for step in sorted(steps, reverse=True)]


def port_taken(error: BaseException) -> bool:
    """TensorFlow's server could not bind its address (its words are the only sign it gives)."""
    return "Could not start gRPC server" in str(error)


# How refusals of a run dir name it: `run_dir`, the Python API's argument (`train(run_dir=...)`),
# unless the command line names Hydra's key (`run_dir_named`, tfrecipe/cli/main.py).
_run_dir_key = "run_dir"


@contextlib.contextmanager
def run_dir_named(key: str) -> Iterator[None]:
    """Meanwhile, refusals of a run dir name it `key` (the command line: `hydra.run.dir`)."""
    global _run_dir_key
    before, _run_dir_key = _run_dir_key, key
    try:
        yield
    finally:
        _run_dir_key = before


class TrainingError(RuntimeError):
    """Training itself failed (not the configuration): exit code 1, summary status "failed"."""


def ensure_fresh_run_dir(run_dir: Path, *, resume: str = "auto") -> None:
    """Refuses a run dir that already holds a finished run: its outputs are never overwritten.

    A failed, preempted or interrupted run is what `resume=auto` continues; `resume=never`
    refuses it too (except when the local launcher restarts this same run after a crash).
    """
    home = rundir.RunFiles(run_dir)
    _check_is_a_run_dir(home)
    previous = home.summary()
    if previous and previous.get("status") in FINISHED:
        raise ConfigError(
            f"{_run_dir_key}={run_dir}: already holds a {previous['status']} run (summary.json); "
            f"choose another {_run_dir_key}"
        )
    restarted = int(os.environ.get(ATTEMPT_ENV, "0")) > 0  # by the launcher: same run
    held = previous is not None or (run_dir / BACKUP_DIR).is_dir()
    if resume == "never" and held and not restarted:
        status = (previous or {}).get("status", "a backup")
        raise ConfigError(
            f"resume=never: {_run_dir_key}={run_dir} already holds a run ({status}); choose a new "
            f"{_run_dir_key}, or resume=auto to continue that run"
        )


def check_resume_batch(home: rundir.RunFiles, *, global_batch: int, num_replicas: int) -> None:
    """Refuses to continue a run at another global batch than it trained at: another number
    of workers or GPUs with `batching=per_replica` (the config itself unchanged) would read the
    input from another position than the backup's step says, at another learning rate."""
    previous, run_dir = home.summary() or {}, home.path
    saved, replicas = previous.get("global_batch_size"), previous.get("num_replicas")
    if not previous.get("steps_completed") or saved in (None, global_batch):
        return  # nothing trained yet, or the same batch
    raise ConfigError(
        f"num_replicas={num_replicas}: {_run_dir_key}={run_dir} holds a run trained on "
        f"{replicas} replicas at a global batch of {saved}, and this start's global batch "
        f"would be {global_batch}; resume it on {replicas} replicas, or keep its batch with "
        f"batching=global batching.global_batch_size={saved}"
    )


RUN_FILES = rundir.RUN_FILES


def _check_is_a_run_dir(home: rundir.RunFiles) -> None:
    """Refuses a dir whose summary.json cannot be read (a completed run's, maybe: never retrain
    over it), and one holding files a run would overwrite but no summary (the user's own)."""
    run_dir, summary = home.path, home.file("summary")
    if summary.exists() and home.summary() is None:
        raise ConfigError(
            f"{_run_dir_key}={run_dir}: its summary.json cannot be read, so whether the run "
            "there completed is unknown (nothing is overwritten); repair or move it, or choose "
            f"another {_run_dir_key}"
        )
    if summary.exists() or (run_dir / files.MANIFEST).is_file() or not run_dir.is_dir():
        return
    theirs = [name for name in RUN_FILES if (run_dir / name).exists()]
    if theirs:
        raise ConfigError(
            f"{_run_dir_key}={run_dir}: holds {', '.join(theirs)} but no summary.json, so it is "
            "not a tfrecipe run dir and a run would overwrite them; choose a new or empty "
            f"{_run_dir_key}"
        )
