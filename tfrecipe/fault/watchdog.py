"""The progress watchdog: a worker that makes no training step for too long (a hung collective, a
peer that died without an error, a stuck input pipeline) writes every thread's Python stack to the
run dir and exits with EXIT_STALLED, which the launchers treat as a restartable failure: the run
resumes from its last backup instead of hanging while the cluster manager keeps billing it.

Progress is any finished training or evaluation batch and any finished epoch. The watch starts
at the first finished training step of each start (that step traces and compiles the step function
and meets the other workers; `strategy.timeout_seconds` bounds a collective there) and ends with
training (`on_train_end`).

`cluster.stall_timeout`: null = automatic on a cluster (AUTO_FACTOR x the longest gap between two
progress points seen so far, at least AUTO_FLOOR_S), off for a single process; 0 = off; else that
many seconds, also for a single process. Each stall leaves `RUN_DIR/stall-TASK.txt` (TASK: the
task's type and index, e.g. `worker-1`), whose first line is a JSON record; the chief lists every
record in summary.json's `stalls`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import keras

from tfrecipe import files, reading, rundir
from tfrecipe.fault import backup
from tfrecipe.outcome import ATTEMPT_ENV, EXIT_STALLED

log = logging.getLogger("tfrecipe")

AUTO_FLOOR_S = 300.0  # below this, a slow epoch end or a loaded machine reads as a stall
AUTO_FACTOR = 20.0
_HEADER = "# tfrecipe stall record: "
_CHECK_EVERY_S = 0.5
AUTO = -1.0  # the timeout comes from the step time seen so far


def build_watchdog(
    configured: float | None, *, task: str | None, home: rundir.RunFiles, chief: bool
) -> StallWatchdog | None:
    """The watchdog `cluster.stall_timeout` asks for; None when it is off.

    Args:
      configured: cluster.stall_timeout (None: automatic on a cluster, off for one process).
      task: this process's task as `worker-1`; None for a single process.
      home: the chief's run dir, shared by every worker.
      chief: this process writes summary.json.
    """
    if configured == 0 or (configured is None and task is None):
        return None
    timeout = AUTO if configured is None else configured
    return StallWatchdog(timeout=timeout, task=task or "worker-0", home=home, chief=chief)


def stall_file(home: rundir.RunFiles, task: str) -> Path:
    return home.path / f"stall-{task}.txt"


class StallWatchdog(keras.callbacks.Callback):
    """Stops this process with EXIT_STALLED when training makes no progress for `timeout` s.

    Args:
      timeout: seconds, or AUTO.
      task: this process's task, as `worker-1` (its stack file's name).
      home: the chief's run dir (shared): where the stack file goes.
      chief: this process also marks summary.json "failed" with the stall before it exits.
      exit: what ends the process (os._exit: the main thread is stuck; a test passes its own).
    """

    reads_logs_only = True  # may watch a group of epochs in one call (loops.epoch_groups)

    def __init__(
        self, *, timeout: float, task: str, home: rundir.RunFiles, chief: bool, exit=os._exit
    ) -> None:
        super().__init__()
        self.timeout, self.task, self.home, self.chief = timeout, task, home, chief
        self._exit = exit
        self._last = 0.0  # monotonic time of the last progress; 0: not armed yet
        self._longest = 0.0  # longest gap between two progress points seen
        # The last finished step: read once an epoch (a read costs ~0.3 ms), counted from the
        # batch indexes in between (fit's and the custom loop's: the last step of each call).
        self._step, self._previous_batch = 0, None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # --- progress, from the training thread --------------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        self._previous_batch = None

    def on_train_batch_end(self, batch, logs=None):
        self._progress()
        if self._previous_batch is None:
            self._step = backup.current_step(self.model)
        else:
            self._step += batch - self._previous_batch
        self._previous_batch = batch

    def on_test_batch_end(self, batch, logs=None):
        self._progress()

    def on_epoch_end(self, epoch, logs=None):
        self._progress()

    def on_train_begin(self, logs=None):
        if self._thread is not None and self._thread.is_alive():
            return  # another fit() of the same training run: the watch goes on
        self._done.clear()
        self._last, self._longest = 0.0, 0.0  # armed again by the first step
        self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
        self._thread.start()

    def on_train_end(self, logs=None):
        self.stop()

    def stop(self) -> None:
        """Ends the watch (training ended, or failed and is being recorded)."""
        self._done.set()

    def _progress(self) -> None:
        now = time.monotonic()
        if self._last:
            self._longest = max(self._longest, now - self._last)
        self._last = now

    def limit(self) -> float:
        """The current timeout in seconds."""
        if self.timeout != AUTO:
            return self.timeout
        return max(AUTO_FLOOR_S, AUTO_FACTOR * self._longest)

    # --- the watch, in its own thread --------------------------------------------------------
    def _watch(self) -> None:
        while not self._done.wait(_CHECK_EVERY_S):
            last = self._last
            if last and time.monotonic() - last > self.limit() and not self._done.is_set():
                self._stalled(time.monotonic() - last)
                return

    def _stalled(self, idle_s: float) -> None:
        """Leaves the stall's record and stacks, then ends the process, whatever happens."""
        try:
            self._record(idle_s)
        finally:
            for handler in logging.getLogger().handlers + log.handlers:
                with contextlib.suppress(Exception):
                    handler.flush()
            sys.stdout.flush()
            sys.stderr.flush()
            self._exit(EXIT_STALLED)

    def _record(self, idle_s: float) -> None:
        path = stall_file(self.home, self.task)
        attempt = os.environ.get(ATTEMPT_ENV, "0")
        record = {
            "worker": self.task,
            "step": self._step,
            "idle_s": round(idle_s, 1),
            "timeout_s": round(self.limit(), 1),
            "attempt": int(attempt) if attempt.isdigit() else 0,
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "stack_file": path.name,
        }
        message = (
            f"{self.task} made no training step for {idle_s:.0f} s after step {self._step} "
            f"(cluster.stall_timeout: {record['timeout_s']} s); every thread's stack: {path}; "
            f"exiting with code {EXIT_STALLED} (restartable: a rerun resumes from the last backup)"
        )
        log.error("stalled: %s", message)
        files.write_atomic(path, _HEADER + json.dumps(record) + "\n" + thread_stacks())
        files.Manifest.of(self.home.path).claim([path.name])  # a worker's too: the run wrote it
        if self.chief:
            _record_in_summary(self.home, record, message)


def thread_stacks() -> str:
    """Every thread's Python stack, innermost call last, as a traceback prints it."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"\nThread {names.get(ident, '?')} ({ident}):\n")
        parts.extend(traceback.format_stack(frame))
    return "".join(parts)


def _record_in_summary(home: rundir.RunFiles, record: dict[str, Any], message: str) -> None:
    summary = home.summary()
    if summary is None:
        return
    stalls = merge_stalls(summary.get("stalls"), [record])
    home.record_status("failed", f"stalled: {message}", fields=summary, stalls=stalls)


_STACK_FILE_BYTES = 16 * 1024 * 1024  # every thread's stack: far less


def recorded_stalls(home: rundir.RunFiles, earlier: object = None) -> list[dict[str, Any]]:
    """The stalls of this run: those summary.json already lists (`earlier`) and those the stack
    files in `home` record. A stack file counts only where the run's manifest lists it (the
    run wrote it: `files.Manifest.claim`); a file is data: a record that does not read as one is
    skipped."""
    found = []
    written = files.Manifest.of(home.path).owned()
    for path in sorted(p for p in home.path.glob("stall-*.txt") if p.name in written):
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
            # through the reader: a link to /dev/zero or a FIFO planted there is skipped, not read
            text = reading.read_text(path, limit=_STACK_FILE_BYTES, what="a stall record")
            first = text.partition("\n")[0]
            if first.startswith(_HEADER):
                record = _checked(json.loads(first[len(_HEADER) :]))
                if record is not None and record["stack_file"] == path.name:
                    found.append(record)
    return merge_stalls(earlier, found)


_RECORD = {
    "worker": str,
    "step": int,
    "idle_s": (int, float),
    "timeout_s": (int, float),
    "attempt": int,
    "time": str,
    "stack_file": str,
}


def _checked(record: object) -> dict[str, Any] | None:
    """The record with exactly its fields and their types; None for anything else."""
    if not isinstance(record, dict) or set(record) != set(_RECORD):
        return None
    if not all(isinstance(record[key], kind) for key, kind in _RECORD.items()):
        return None
    return {key: record[key] for key in _RECORD}


def merge_stalls(earlier: object, more: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`earlier` + `more` without repeats, oldest first."""
    merged: dict[tuple, dict[str, Any]] = {}
    for record in map(_checked, [*(earlier if isinstance(earlier, list) else []), *more]):
        if record is not None:
            key = (record.get("worker"), record.get("step"), record.get("time"))
            merged.setdefault(key, record)
    return sorted(merged.values(), key=lambda r: str(r.get("time")))
