"""`cluster=local`: starts a training cluster on this machine and watches over it.

Each task is a `python -m tfrecipe` process with the user's overrides, `cluster=tf_config` and its
own TF_CONFIG on free 127.0.0.1 ports; all share one run directory (`hydra.run.dir`), which only
the chief writes. Their output is streamed with a `[worker i]` / `[ps i]` / `[chief 0]` prefix.
Tasks get no shell: every command is an argument list.

Faults, as a cluster manager (Kubernetes, SLURM) would handle them, at most `max_restarts` times:
- mirrored workers: when one dies, the others are stopped and the whole cluster starts again; it
  resumes from the chief's last backup.
- parameter servers: the coordinator (the `chief` task) reschedules a dead worker's steps on the
  others, and the dead worker is started again at its address (the coordinator takes it back); a
  dead parameter server loses the variables it held, so the whole cluster starts again from the
  last backup.
- preemption: SIGTERM or Ctrl-C reaching the launcher reaches every task (the coordinator first);
  the chief saves a backup and exits with EXIT_PREEMPTED, and so does the launcher: rerunning the
  same command resumes with no step lost.
- a stall: a worker that makes no training step for `cluster.stall_timeout` seconds writes its
  threads' stacks to RUN_DIR/stall-TASK.txt and exits with EXIT_STALLED, a failure like any other:
  the cluster starts again from the last backup.
- a port taken between the launcher picking it and its task binding it (another process's): the
  task exits with EXIT_PORT_TAKEN and the cluster starts again on new ports, not counted as a
  restart (PORT_RETRIES times).
- no wait is unbounded: once a worker has exited, the others get `exit_grace_s` to finish, then
  they are stopped and named; a task that ignores SIGTERM is killed after `grace_period_s`.

This module imports no TensorFlow: every task starts its own runtime, and the launching process
only supervises them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tfrecipe.distribute.processes import TaskGroup, log
from tfrecipe.outcome import (
    ATTEMPT_ENV,
    EXIT_CONFIG,
    EXIT_PORT_TAKEN,
    EXIT_PREEMPTED,
    EXIT_STALLED,
)
from tfrecipe.outcome import EXIT_TRAINING as EXIT_FAILED

_POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """Args:
    num_workers: worker processes (worker 0 is the chief unless there is a coordinator).
    num_ps: parameter-server processes; > 0 adds a coordinator task (the chief).
    max_restarts: how often the whole cluster may be started again after a task died.
    grace_period_s: seconds a task gets after SIGTERM before SIGKILL.
    exit_grace_s: seconds the other tasks get to finish once a worker has exited.
    evaluator: also start a sidecar evaluator task.
    stall_timeout: cluster.stall_timeout for every task (None: their automatic one).
    """

    num_workers: int
    num_ps: int = 0
    max_restarts: int = 0
    grace_period_s: float = 10.0
    exit_grace_s: float = 300.0
    evaluator: bool = False
    stall_timeout: float | None = None


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the launcher."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


# Starts on new ports after a task found its port taken (free_ports releases the ports it found
# for the tasks to bind: another process may take one in between).
PORT_RETRIES = 3


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (all held open until every one is found)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def cluster_spec(options: LaunchOptions) -> dict[str, list[str]]:
    """Loopback addresses for every task; a chief entry (the coordinator) with parameter servers."""
    roles = {"worker": options.num_workers}
    if options.num_ps:
        roles = {"chief": 1, "worker": options.num_workers, "ps": options.num_ps}
    ports = iter(free_ports(sum(roles.values())))
    return {role: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for role, n in roles.items()}


def tf_config(spec: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": spec, "task": {"type": task_type, "index": index}})


def _is_cluster_override(arg: str) -> bool:
    key = arg.lstrip("+~").split("=", 1)[0]
    return key == "cluster" or key.startswith("cluster.")


@functools.cache
def _recipe_cluster_deletions(overrides: tuple[str, ...]) -> list[str]:
    """`~cluster.KEY` for the local-cluster keys a recipe sets in its body (num_workers, num_ps,
    ...): its tasks join through TF_CONFIG, where those keys mean nothing (and would be refused
    as unknown)."""
    from tfrecipe.config.compose import compose

    cluster = compose(list(overrides)).cluster
    return [f"~cluster.{key}" for key in cluster if key not in _TASK_KEYS]


_TASK_KEYS = ("name", "evaluator", "stall_timeout")  # cluster keys tf_config has as well


def task_argv(
    overrides: Sequence[str],
    *,
    chief: bool,
    evaluator: bool = False,
    stall_timeout: float | None = None,
) -> list[str]:
    """The command of one task: the same overrides, but joining the cluster through TF_CONFIG.

    Non-chief tasks keep Hydra from writing into the shared run directory (its `.hydra/` copy of
    the config and the job log), so that the chief alone writes there.
    """
    argv = [a for a in overrides if not _is_cluster_override(a)]
    argv.append("cluster=tf_config")
    argv += _recipe_cluster_deletions(tuple(argv))
    if evaluator:
        argv.append("cluster.evaluator=true")
    if stall_timeout is not None:
        argv.append(f"cluster.stall_timeout={stall_timeout}")
    if not chief:
        argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    return tfrecipe_command(argv)


def tfrecipe_command(argv: Sequence[str]) -> list[str]:
    """`python -m tfrecipe ARGV` for a child process, with -P: `-m` would put the current
    directory first on its import path, and a module there (a planted `keras.py`, a `tfrecipe/`
    folder) would run. `child_environment` names the folder this tfrecipe came from instead."""
    return [sys.executable, "-P", "-m", "tfrecipe", *argv]


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the folder this tfrecipe was imported from first on PYTHONPATH."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**env, "PYTHONPATH": os.pathsep.join([_PACKAGE_ROOT, *paths])}


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Turns SIGINT and SIGTERM into `Interrupted` in the main thread, for orderly cleanup."""

    fired: list[int] = []

    def handler(signum, frame):
        if not fired:  # a second Ctrl-C must not interrupt the cleanup the first one started
            fired.append(signum)
            raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


# The folder this process imported tfrecipe from: a task imports the same one.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _task_env(spec, task_type: str, index: int, attempt: int) -> dict[str, str]:
    env = child_environment(
        {
            **os.environ,
            "TF_CONFIG": tf_config(spec, task_type, index),
            ATTEMPT_ENV: str(attempt),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if "ps" in spec:
        # Parameter-server clusters: fail RPCs to a dead task at once, so the coordinator can
        # reschedule (TensorFlow's guidance for ClusterCoordinator).
        env["GRPC_FAIL_FAST"] = "use_caller"
    return env


class _Restarts:
    """The restart budget of one launch (`max_restarts`), shared by every kind of restart."""

    def __init__(self, allowed: int):
        self.allowed = allowed
        self.used = 0

    def take(self) -> bool:
        if self.used == self.allowed:
            return False
        self.used += 1
        return True

    def __str__(self) -> str:
        return f"{self.used} of {self.allowed} restarts"


def _chief(options: LaunchOptions) -> str:
    return "chief 0" if options.num_ps else "worker 0"


def _start(group: TaskGroup, overrides, spec, options: LaunchOptions, attempt: int) -> None:
    """Servers first, then the workers; the coordinator last (it connects to all of them)."""
    for task_type in ("ps", "worker", "chief"):
        for index in range(len(spec.get(task_type, []))):
            name = f"{task_type} {index}"
            argv = task_argv(
                overrides,
                chief=name == _chief(options),
                evaluator=options.evaluator,
                stall_timeout=options.stall_timeout,
            )
            group.start(name, argv, _task_env(spec, task_type, index, attempt))
    if options.evaluator:  # outside the cluster spec: it joins no collective
        group.start(
            "evaluator 0",
            task_argv(overrides, chief=False, evaluator=True, stall_timeout=options.stall_timeout),
            _task_env(spec, "evaluator", 0, attempt),
        )


def _watch(group: TaskGroup, options: LaunchOptions, restarts: _Restarts) -> int:
    """Waits until the run ends; returns its exit code (0: every worker/the coordinator done)."""
    finishing = _Finishing(options.exit_grace_s, chief=_chief(options))
    while True:
        if options.num_ps:
            code = _watch_coordinator(group, restarts)
        else:
            code = _watch_workers(group, finishing)
        if code is not None:
            return code
        time.sleep(_POLL_S)


_NOTES = {
    EXIT_PORT_TAKEN: " (its port was taken)",
    EXIT_PREEMPTED: " (preempted: the workers saved a backup to resume from)",
    EXIT_STALLED: " (stalled: no training step within cluster.stall_timeout; its threads' stacks "
    "are in the run dir's stall-*.txt)",
}


class _Finishing:
    """The grace the other tasks get once one worker has exited 0 (they train in lockstep and
    should follow within moments; the chief also writes its outputs)."""

    def __init__(self, grace_s: float, *, chief: str):
        self.grace_s, self.chief = grace_s, chief
        self.since: float | None = None

    def overdue(self, codes: dict[str, int | None]) -> int | None:
        """None while the run may go on; else its exit code, the stragglers named."""
        if self.since is None:
            self.since = time.monotonic()
        if time.monotonic() - self.since < self.grace_s:
            return None
        running = [name for name, code in codes.items() if code is None]
        log(
            f"{', '.join(running)} still running {self.grace_s:g} s after "
            f"{', '.join(n for n, c in codes.items() if c == 0)} exited: stopping "
            f"{'them' if len(running) > 1 else 'it'} (cluster.exit_grace_s)"
        )
        # The chief done: the run is complete (its summary.json says so); else it failed.
        return 0 if codes.get(self.chief) == 0 else EXIT_FAILED


def _watch_workers(group: TaskGroup, finishing: _Finishing) -> int | None:
    """Mirrored workers train in lockstep: one that fails stops the run; once one has exited
    0, the others get `finishing`'s grace."""
    codes = group.poll()
    for name, code in codes.items():
        if code not in (None, 0):
            log(f"{name} exited with code {code}{_NOTES.get(code, '')}")
            return code
    if all(code == 0 for code in codes.values()):
        return 0
    # A training task done starts the grace (the evaluator ends when it reads a final summary:
    # an earlier attempt's, maybe, before this attempt's chief has written its own).
    trained = [code for name, code in codes.items() if not name.startswith("evaluator")]
    return finishing.overdue(codes) if 0 in trained else None


def _watch_coordinator(group: TaskGroup, restarts: _Restarts) -> int | None:
    """The coordinator's exit ends the run. Servers run until they are stopped: a dead parameter
    server fails the run; a dead worker's steps go to the others, and it is started again."""
    for name, code in group.poll().items():
        task = group.tasks[name]
        if code is None or not task.watched or (task.role == "evaluator" and code == 0):
            continue
        if task.role == "chief":
            if code:
                log(f"the coordinator ({name}) exited with code {code}")
            return code
        log(f"{name} exited with code {code} during training{_NOTES.get(code, '')}")
        if task.role != "worker":
            return EXIT_PORT_TAKEN if code == EXIT_PORT_TAKEN else EXIT_FAILED
        if not restarts.take():
            log(f"the coordinator goes on without {name} (no restarts left)")
            task.watched = False
            continue
        log(f"restarting {name} ({restarts}); the coordinator reschedules its steps meanwhile")
        group.restart(name, restarts.used)
    return None


def launch(overrides: Sequence[str], options: LaunchOptions) -> int:
    """Runs the cluster to the end, restarting it after a failure; returns the exit code.

    Args:
      overrides: the user's command-line overrides, with `hydra.run.dir` pinned to one directory.
      options: cluster shape and restart policy.
    """
    restarts, new_ports = _Restarts(options.max_restarts), _Restarts(PORT_RETRIES)
    starts = 0  # every start after the first continues the same run (ATTEMPT_ENV)
    with _signals_interrupt():
        while True:
            spec = cluster_spec(options)
            coordinator = _chief(options) if options.num_ps else None
            group = TaskGroup(options.grace_period_s, stop_first=coordinator)
            interrupt = None
            try:
                if restarts.used:  # the first start is what the user asked for: nothing to say
                    attempt = f"attempt {restarts.used + 1} of {options.max_restarts + 1}"
                    log(f"starting {_describe(spec)} ({attempt})")
                _start(group, overrides, spec, options, starts)
                starts += 1
                code = _watch(group, options, restarts)
            except Interrupted as caught:
                log(f"{caught}: stopping every task")
                interrupt = caught
            finally:
                group.stop()
            if interrupt is not None:
                return _interrupted_exit_code(group, options, interrupt)
            if code in (0, EXIT_CONFIG):  # a configuration error repeats on every start
                return code
            if not _start_again(code, restarts, new_ports):
                break
    log(f"the cluster could not finish after {options.max_restarts} restart(s)")
    # Preempted or stalled: the code says so to whatever runs the launcher (it may try again).
    return code if code in (EXIT_PREEMPTED, EXIT_STALLED) else EXIT_FAILED


def _start_again(code: int, restarts: _Restarts, new_ports: _Restarts) -> bool:
    """Whether a cluster that ended with `code` starts again: on new ports after a port was
    taken (not a restart: nothing ran), else while restarts remain."""
    if code == EXIT_PORT_TAKEN and new_ports.take():
        log(
            "a task could not listen on its port (another process took it after it was "
            f"picked): starting again on new ports ({new_ports.used} of {PORT_RETRIES})"
        )
        return True
    if not restarts.take():
        return False
    log(f"restarting the cluster ({restarts})")
    return True


def _interrupted_exit_code(group: TaskGroup, options: LaunchOptions, interrupt) -> int:
    """EXIT_PREEMPTED when the chief saved a backup on the way out, else 128 + the signal."""
    if group.exit_code(_chief(options)) == EXIT_PREEMPTED:
        log("the chief saved a backup; rerun the same command to resume")
        return EXIT_PREEMPTED
    return interrupt.exit_code


def _describe(spec: dict[str, list[str]]) -> str:
    plural = {"worker": "workers", "evaluator": "evaluators"}  # "1 chief", "2 ps"
    return ", ".join(
        f"{len(addrs)} {role if len(addrs) == 1 else plural.get(role, role)}"
        for role, addrs in spec.items()
    )


def run_local_cluster(argv: Sequence[str], spec) -> int:
    """`cluster=local` from the command line: returns the exit code of the whole cluster.

    Args:
      argv: the command line's overrides, `hydra.run.dir` pinned.
      spec: the validated `cluster` config (schema.LocalCluster).
    """
    # Each option is the `cluster` key of its name.
    options = {f.name: getattr(spec, f.name) for f in dataclasses.fields(LaunchOptions)}
    return launch(argv, LaunchOptions(**options))
