"""`cluster=local`: starts a training cluster on this machine and watches over it.

Each task is a `python -m tfrecipe` process with the user's overrides, `cluster=tf_config` and its
own TF_CONFIG on free 127.0.0.1 ports; all share one run directory (`hydra.run.dir`), which only
the chief writes. Their output is streamed with a `[worker i]` / `[ps i]` prefix. Ctrl-C and
SIGTERM reach every task. When a task dies, the others are stopped and the whole cluster starts
again, at most `max_restarts` times. Tasks get no shell: every command is an argument list.

This module imports no TensorFlow: mirrored workers each start their own runtime, and the
launching process only supervises them. With parameter servers, the launching process is also the
coordinator (`run_coordinator`), which does import TensorFlow, after the servers are up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tfrecipe import cluster

EXIT_CONFIG = 2
EXIT_FAILED = 1
_POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """Args:
    num_workers: worker processes (worker 0 is the chief unless there is a coordinator).
    num_ps: parameter-server processes; > 0 makes this process the coordinator (chief).
    max_restarts: how often the whole cluster may be started again after a task died.
    grace_period_s: seconds a task gets after SIGTERM before SIGKILL.
    """

    num_workers: int
    num_ps: int = 0
    max_restarts: int = 0
    grace_period_s: float = 10.0
    evaluator: bool = False


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the launcher."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


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
    from tfrecipe.configs import compose

    cluster = compose(list(overrides)).cluster
    return [f"~cluster.{key}" for key in cluster if key not in ("name", "evaluator")]


def task_argv(overrides: Sequence[str], *, chief: bool, evaluator: bool = False) -> list[str]:
    """The command of one task: the same overrides, but joining the cluster through TF_CONFIG.

    Non-chief tasks keep Hydra from writing into the shared run directory (its `.hydra/` copy of
    the config and the job log), so that the chief alone writes there.
    """
    argv = [a for a in overrides if not _is_cluster_override(a)]
    argv.append("cluster=tf_config")
    argv += _recipe_cluster_deletions(tuple(argv))
    if evaluator:
        argv.append("cluster.evaluator=true")
    if not chief:
        argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    return [sys.executable, "-m", "tfrecipe", *argv]


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it if the launcher dies without cleaning up."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the launcher's own cleanup has to do
        pass


@dataclasses.dataclass
class _Task:
    name: str
    process: subprocess.Popen
    streamer: threading.Thread


def _stream(prefix: str, pipe, lock: threading.Lock) -> None:
    for line in iter(pipe.readline, ""):
        with lock:
            sys.stdout.write(f"{prefix} {line}")
            sys.stdout.flush()
    pipe.close()


class _Cluster:
    """One start of the cluster's processes; stops them all, whatever happens."""

    def __init__(self, grace_period_s: float):
        self.grace_period_s = grace_period_s
        self.tasks: list[_Task] = []
        self._lock = threading.Lock()
        # Each task's TMPDIR: what a killed task could not delete (its scratch run dir,
        # autograph's files) goes with this folder when the cluster stops.
        self.scratch = Path(tempfile.mkdtemp(prefix="tfrecipe-cluster-"))

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        tmp = self.scratch / name.replace(" ", "")
        tmp.mkdir()
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
        self.tasks.append(_Task(name, process, streamer))

    def poll(self) -> dict[str, int | None]:
        return {task.name: task.process.poll() for task in self.tasks}

    def stop(self) -> None:
        """SIGTERM to every task's process group, SIGKILL after the grace period."""
        running = [t for t in self.tasks if t.process.poll() is None]
        for task in running:
            _signal_group(task.process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period_s
        for task in running:
            try:
                task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(task.process, signal.SIGKILL)
                task.process.wait()
        for task in self.tasks:
            _signal_group(task.process, signal.SIGKILL)  # whatever its children left behind
            task.streamer.join(timeout=5)
        shutil.rmtree(self.scratch, ignore_errors=True)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


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


def _log(message: str) -> None:
    print(f"[launcher] {message}", file=sys.stderr, flush=True)


def _task_env(spec, task_type: str, index: int, attempt: int) -> dict[str, str]:
    env = {
        **os.environ,
        "TF_CONFIG": tf_config(spec, task_type, index),
        cluster.ATTEMPT_ENV: str(attempt),
        "PYTHONUNBUFFERED": "1",
    }
    if "ps" in spec:
        # Parameter-server clusters: fail RPCs to a dead task at once, so the coordinator can
        # reschedule (TensorFlow's guidance for ClusterCoordinator).
        env["GRPC_FAIL_FAST"] = "use_caller"
    return env


def _start(group: _Cluster, overrides, spec, options: LaunchOptions, attempt: int) -> None:
    for task_type in ("ps", "worker"):
        for index in range(len(spec.get(task_type, []))):
            chief = task_type == "worker" and index == 0 and not options.num_ps
            group.start(
                f"{task_type} {index}",
                task_argv(overrides, chief=chief, evaluator=options.evaluator),
                _task_env(spec, task_type, index, attempt),
            )
    if options.evaluator:  # outside the cluster spec: it joins no collective
        group.start(
            "evaluator 0",
            task_argv(overrides, chief=False, evaluator=True),
            _task_env(spec, "evaluator", 0, attempt),
        )


def _watch(group: _Cluster, coordinator: Callable[[], int] | None) -> int:
    """Waits until the run ends; returns its exit code (0: every worker/the coordinator done)."""
    if coordinator is not None:
        return _coordinate(group, coordinator)
    while True:
        codes = group.poll()
        failed = {name: code for name, code in codes.items() if code not in (None, 0)}
        if failed:
            name, code = next(iter(failed.items()))
            _log(f"{name} exited with code {code}")
            return code
        if all(code == 0 for code in codes.values()):
            return 0
        time.sleep(_POLL_S)


def _coordinate(group: _Cluster, coordinator: Callable[[], int]) -> int:
    """Runs the coordinator in this process while the servers run (a dead server fails it)."""
    code = coordinator()
    for name, exit_code in group.poll().items():
        if exit_code is not None:
            _log(f"{name} exited with code {exit_code} during training")
    return code


def launch(
    overrides: Sequence[str],
    options: LaunchOptions,
    *,
    coordinator: Callable[[dict[str, list[str]]], int] | None = None,
) -> int:
    """Runs the cluster to the end, restarting it after a failure; returns the exit code.

    Args:
      overrides: the user's command-line overrides, with `hydra.run.dir` pinned to one directory.
      options: cluster shape and restart policy.
      coordinator: with parameter servers, runs training in this process given the cluster spec
        (it sets its own TF_CONFIG) and returns an exit code.
    """
    attempts = options.max_restarts + 1
    with _signals_interrupt():
        for attempt in range(attempts):
            spec = cluster_spec(options)
            group = _Cluster(options.grace_period_s)
            try:
                _log(f"starting {_describe(spec)} (attempt {attempt + 1} of {attempts})")
                _start(group, overrides, spec, options, attempt)
                code = _watch(group, coordinator and functools.partial(coordinator, spec))
            except Interrupted as interrupt:
                _log(f"{interrupt}: stopping every task")
                return interrupt.exit_code
            finally:
                group.stop()
            if code == 0:
                return 0
            if code == EXIT_CONFIG:  # a configuration error repeats on every start
                return EXIT_CONFIG
            if attempt + 1 < attempts:
                _log(f"restarting the cluster ({attempt + 1} of {options.max_restarts} restarts)")
    _log(f"the cluster could not finish after {options.max_restarts} restart(s)")
    return EXIT_FAILED


def _describe(spec: dict[str, list[str]]) -> str:
    return ", ".join(f"{len(addrs)} {role}" for role, addrs in spec.items())


def _exit_code(run: Callable[[], None]) -> int:
    try:
        run()
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def run_local_cluster(argv: Sequence[str], spec, *, run_task: Callable[[], None]) -> int:
    """`cluster=local` from the command line: returns the exit code of the whole cluster (with
    parameter servers this process is the coordinator, and it exits with that code itself).

    Args:
      argv: the command line's overrides, `hydra.run.dir` pinned.
      spec: the validated `cluster` config (schema.LocalCluster).
      run_task: runs one training task in this process from `sys.argv` (the Hydra entry point);
        used for the coordinator of a parameter-server cluster.
    """
    options = LaunchOptions(
        num_workers=spec.num_workers,
        num_ps=spec.num_ps,
        max_restarts=spec.max_restarts,
        grace_period_s=spec.grace_period_s,
        evaluator=spec.evaluator,
    )
    if not options.num_ps:
        return launch(argv, options)
    if options.max_restarts:
        # The coordinator's TensorFlow runtime is bound to the cluster it connected to, so this
        # process cannot start over; ClusterCoordinator itself retries a failed worker's steps.
        _log("parameter-server clusters are not restarted as a whole; max_restarts is ignored")
        options = dataclasses.replace(options, max_restarts=0)

    def coordinator(spec: dict[str, list[str]]) -> int:
        os.environ["TF_CONFIG"] = tf_config(spec, "chief", 0)
        os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
        sys.argv = [sys.argv[0], *task_argv(argv, chief=True, evaluator=options.evaluator)[3:]]
        return _exit_code(run_task)

    code = launch(argv, options, coordinator=coordinator)
    # This process's TensorFlow runtime would now try to reach the servers just stopped, and
    # print a page of gRPC errors while exiting: skip its teardown.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
