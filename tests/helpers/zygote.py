"""A fork server for `python -m tfrecipe`: TensorFlow is imported once, each command runs in a
fork of that process. The suite runs the command line a few hundred times, and importing
TensorFlow and Keras is ~5 s of CPU each time on this 2-core machine: the fork starts in
milliseconds, and what runs in it is what `python -m tfrecipe` runs (the same module as
`__main__`, arguments, working directory, environment, `sys.path`, standard streams and exit
status), in its own process.

Only what is the same for every command is imported ahead: TensorFlow, Keras and the libraries of
the config, nothing of tfrecipe. A command whose environment changes what those imports read
(`import_sensitive`) runs in a new interpreter instead, as does one asked for with `fresh=True`.

    server = Zygote.start(socket_dir)        # one per test process, reused by every command
    result = server.run(["train", ...], cwd=..., env=..., timeout=300)  # a CompletedProcess
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# What the server imports before it forks: the slow imports every training command makes.
PRELOAD = ("tensorflow", "keras", "numpy", "hydra", "omegaconf", "pydantic", "yaml")

# Environment variables read while those modules are imported (or by the interpreter at start):
# a command whose environment sets them differently gets a new interpreter.
_SENSITIVE_PREFIXES = (
    "PYTHON",
    "TF_CPP_",
    "TF_ENABLE_",
    "KERAS_",
    "CUDA_",
    "LD_",
    "MPL",
    "OMP_",
    "MKL_",
    "XLA_",
    "TF_XLA_",
    "HOME",
    "XDG_",
    "LANG",
    "LC_",
)
_HANDLED = {"PYTHONPATH"}  # the fork rebuilds sys.path from it, as an interpreter does
_TFRECIPE_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def import_sensitive(env: dict[str, str], base: dict[str, str]) -> list[str]:
    """The variables on which `env` differs from the server's `base` environment and which the
    preloaded imports (or the interpreter's start) would have read. (TF_CPP_MIN_LOG_LEVEL unset
    is 2: tfrecipe sets that before it imports TensorFlow, the server did as well.)"""
    env, base = ({**_TFRECIPE_DEFAULTS, **e} for e in (env, base))
    changed = {k for k in env.keys() | base.keys() if env.get(k) != base.get(k)} - _HANDLED
    return sorted(k for k in changed if k.startswith(_SENSITIVE_PREFIXES))


class Zygote:
    """The test side: starts the server, sends it commands."""

    def __init__(self, process: subprocess.Popen, address: str, env: dict[str, str]):
        self.process, self.address, self.env = process, address, env

    @classmethod
    def start(cls, where: Path) -> Zygote:
        address = str(where / "zygote.sock")
        env = {**_TFRECIPE_DEFAULTS, **os.environ}
        log = where / "zygote.log"
        with open(log, "w") as stderr:
            process = subprocess.Popen(
                [sys.executable, __file__, address],
                env=env,
                stdin=subprocess.PIPE,  # closed when the test process ends: the server ends too
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        if process.stdout.readline().strip() != "ready":
            process.kill()
            raise RuntimeError(f"the fork server did not start:\n{log.read_text()[-3000:]}")
        return cls(process, address, env)

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.kill()
        self.process.wait()

    def run(
        self, args: list[str], *, cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        """As `subprocess.run(capture_output=True, text=True, timeout=timeout)`."""
        return self.spawn(args, cwd=cwd, env=env, timeout=timeout).wait()

    def spawn(
        self,
        args: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        timeout: float,
        merge_stderr: bool = False,
    ) -> Forked:
        """Starts the command and returns at once; `merge_stderr`: stderr into stdout."""
        return Forked(self.address, args, cwd, env, timeout, merge_stderr)


class Forked:
    """One command running in a fork of the server."""

    def __init__(self, address, args, cwd, env, timeout, merge_stderr):
        self.args = [sys.executable, "-m", "tfrecipe", *args]
        self.timeout = timeout
        self._streams = tempfile.TemporaryDirectory()
        self._out = Path(self._streams.name, "stdout")
        self._err = self._out if merge_stderr else Path(self._streams.name, "stderr")
        request = {
            "args": args,
            "cwd": str(cwd),
            "env": env,
            "timeout": timeout,
            "stdout": str(self._out),
            "stderr": str(self._err),
        }
        self._conn = socket.socket(socket.AF_UNIX)
        self._conn.connect(address)
        self._conn.sendall(json.dumps(request).encode() + b"\n")

    def wait(self) -> subprocess.CompletedProcess:
        """The finished command (the server kills it at its timeout: TimeoutExpired)."""
        with self._conn, self._streams:
            reply = json.loads(self._conn.makefile().readline() or "{}")
            stdout = _read(self._out)
            stderr = None if self._err == self._out else _read(self._err)
        if "returncode" not in reply:
            raise RuntimeError(f"the fork server gave no exit status: {reply}")
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(self.args, self.timeout, stdout, stderr)
        return subprocess.CompletedProcess(self.args, reply["returncode"], stdout, stderr)


def _read(path: Path) -> str:
    """As `subprocess.run(text=True)` decodes a stream."""
    if not path.exists():
        return ""
    with open(path, encoding=None, errors="strict", newline=None) as stream:
        return stream.read()


# --- the server -------------------------------------------------------------------------------
def serve(address: str) -> None:
    """Imports PRELOAD, then forks a handler per request, which forks the command and waits for
    it: requests run side by side, the server itself only accepts, until its stdin closes."""
    for name in PRELOAD:
        __import__(name)
    base_path = [p for p in sys.path[1:] if p not in _pythonpath(os.environ)]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped as they end
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        listener.listen()
        print("ready", flush=True)
        while True:
            ready, _, _ = select.select([listener, sys.stdin], [], [])
            if sys.stdin in ready:  # end of file: the test process is gone
                return
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _handle(conn, base_path)  # never returns
            conn.close()


def _handle(conn: socket.socket, base_path: list[str]) -> None:
    request = json.loads(conn.makefile().readline())
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become_the_command(request, base_path)  # never returns
    reply = _wait(pid, conn, request["timeout"])
    with contextlib.suppress(OSError):  # the test may be gone
        conn.sendall(json.dumps(reply).encode() + b"\n")
    os._exit(0)


def _wait(pid: int, conn: socket.socket, timeout: float) -> dict:
    """The child's exit status, as `subprocess` reports it; killed at the timeout, or when the
    test that asked for it goes away."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd, conn], [], [], timeout)
        timed_out = pidfd not in ready
        if timed_out or conn in ready:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(pidfd)
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}


def _become_the_command(request: dict, base_path: list[str]) -> None:
    """In the fork: the state `python -m tfrecipe ARGS` starts with, then that module as
    `__main__`; the interpreter exits as it would (exit code, traceback, atexit)."""
    import runpy

    streams = (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND),
    )
    for fd, path, flags in streams:
        stream = os.open(path, flags, 0o600)
        os.dup2(stream, fd)
        os.close(stream)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # TMPDIR is read again
    sys.path[:] = [os.getcwd(), *_pythonpath(os.environ), *base_path]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["-m", *request["args"]]
    runpy._run_module_as_main("tfrecipe", alter_argv=True)
    raise SystemExit(0)


def _pythonpath(env) -> list[str]:
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


if __name__ == "__main__":
    serve(sys.argv[1])
