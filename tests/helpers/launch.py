"""A launcher run in a real process, with every process it ever started recorded, so a test can
check that none outlives it (and kill any that does, so a failing test leaves nothing either)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil


class Launch:
    """`python -m tfrecipe ARGS` in a real process, with every descendant it ever had recorded."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tfrecipe", *args],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.seen: dict[int, psutil.Process] = {}
        self.output = ""

    def _record(self) -> None:
        try:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def wait_for(self, predicate, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate() and time.monotonic() < deadline:
            self._record()
            time.sleep(0.2)

    def finish(self, timeout: float = 300) -> int:
        """Waits for the launcher (reading its output), then checks nothing it started is left."""
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(self.process.stdout.read()))
        reader.start()
        self.wait_for(lambda: self.process.poll() is not None, timeout)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        reader.join(timeout=30)
        self.output = "".join(chunks)
        return self.process.returncode

    def leftovers(self) -> list[psutil.Process]:
        alive = []
        for proc in self.seen.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        return alive

    def cleanup(self) -> list[psutil.Process]:
        """Kills whatever is left (so a failing test leaves nothing); returns what was left."""
        left = self.leftovers()
        for proc in left:
            proc.kill()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        return left


def launching(tmp_path: Path):
    """The body of a `launch(*args, env=None)` fixture: `yield from launching(tmp_path)`."""
    launches: list[Launch] = []

    def _launch(*args: str, env: dict[str, str] | None = None) -> Launch:
        # Workers' scratch dirs go to a temp dir of our own, to check they are deleted.
        scratch = tmp_path / "tmp"
        scratch.mkdir(exist_ok=True)
        run = Launch(*args, cwd=tmp_path, env={"TMPDIR": str(scratch), **(env or {})})
        launches.append(run)
        return run

    yield _launch
    left = [proc for run in launches for proc in run.cleanup()]
    assert not left, f"processes left running: {left}"
