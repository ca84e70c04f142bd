"""The local cluster's task processes (`cluster=local`, tfrecipe.distribute.launcher): each a
`python -m tfrecipe` with its own environment, its output streamed with its name as prefix,
stopped with its whole process group (SIGTERM, SIGKILL after a grace period), and killed should
the launcher die. No shell: every command is an argument list. No TensorFlow either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tfrecipe.outcome import ATTEMPT_ENV


def log(message: str) -> None:
    """The launcher's own lines on stderr, `[launcher]` first."""
    print(f"[launcher] {message}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it if the launcher dies without cleaning up."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the launcher's own cleanup has to do
        pass


@dataclasses.dataclass
class Task:
    name: str  # "worker 1": its role and index, as its output's prefix shows it
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen
    streamer: threading.Thread
    watched: bool = True  # False: its exit was dealt with, the run goes on without it

    @property
    def role(self) -> str:
        return self.name.split()[0]


def _stream(prefix: str, pipe, lock: threading.Lock) -> None:
    for line in iter(pipe.readline, ""):
        with lock:
            sys.stdout.write(f"{prefix} {line}")
            sys.stdout.flush()
    pipe.close()


class TaskGroup:
    """One start of the cluster's processes; stops them all, whatever happens.

    Args:
      grace_period_s: seconds a task gets after SIGTERM before SIGKILL.
      stop_first: the task stopped (and waited for) before the others: a parameter-server
        cluster's coordinator, which needs the servers to save its backup.
    """

    def __init__(self, grace_period_s: float, stop_first: str | None = None):
        self.grace_period_s = grace_period_s
        self.stop_first = stop_first
        self.tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        # Each task's TMPDIR: what a killed task could not delete (its scratch run dir,
        # autograph's files) goes with this folder when the cluster stops.
        self.scratch = Path(tempfile.mkdtemp(prefix="tfrecipe-cluster-"))

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        tmp = self.scratch / name.replace(" ", "")
        tmp.mkdir(exist_ok=True)
        process = subprocess.Popen(
            argv,
            env={**env, "TMPDIR": str(tmp)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # signals reach it only through us, and its whole group
            preexec_fn=_die_with_parent,
        )
        streamer = threading.Thread(
            target=_stream, args=(f"[{name}]", process.stdout, self._lock), daemon=True
        )
        streamer.start()
        self.tasks[name] = Task(name, argv, env, process, streamer)

    def restart(self, name: str, attempt: int) -> None:
        """Starts the (dead) task `name` again with its command, at its address."""
        task = self.tasks[name]
        task.streamer.join(timeout=5)
        self.start(name, task.argv, {**task.env, ATTEMPT_ENV: str(attempt)})

    def poll(self) -> dict[str, int | None]:
        return {name: task.process.poll() for name, task in self.tasks.items()}

    def exit_code(self, name: str) -> int | None:
        task = self.tasks.get(name)
        return task.process.poll() if task else None

    def stop(self) -> None:
        """SIGTERM to every task's process group (`stop_first` alone first), SIGKILL after the
        grace period."""
        first = [t for name, t in self.tasks.items() if name == self.stop_first]
        self._terminate(first)
        self._terminate([t for t in self.tasks.values() if t not in first])
        for task in self.tasks.values():
            _signal_group(task.process, signal.SIGKILL)  # whatever its children left behind
            task.streamer.join(timeout=5)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _terminate(self, tasks: list[Task]) -> None:
        running = [t for t in tasks if t.process.poll() is None]
        for task in running:
            _signal_group(task.process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period_s
        for task in running:
            try:
                task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"{task.name} did not stop {self.grace_period_s:g} s after SIGTERM: killed")
                _signal_group(task.process, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    task.process.wait(timeout=self.grace_period_s)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)
