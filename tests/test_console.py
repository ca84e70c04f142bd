"""What a run prints: what differs from the default config, and the plan, only where someone
watches a single run (`print_config`),
final metrics at 4 significant digits (the table at the end of a sweep:
test_sweep_report.py)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

import pytest
from conftest import TINY

from tfrecipe.cli.display import metrics_line, shows_config

TREE = re.compile(r"^[├└]── (strategy|model|loop)$", re.MULTILINE)  # a branch of a tree
CHANGES = "config: what differs from the defaults (all of it: "
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.mark.parametrize(
    ("setting", "sweeping", "verbose", "terminal", "shown"),
    [
        ("auto", False, "auto", True, True),  # a single run on a terminal
        ("auto", False, 2, True, True),
        ("auto", False, 0, True, False),  # loop.verbose=0: silent means silent
        ("auto", True, "auto", True, False),  # a sweep's jobs
        ("auto", False, "auto", False, False),  # a log file, a pipe, SLURM's output
        (True, True, 0, False, True),
        (False, False, "auto", True, False),
    ],
)
def test_print_config_auto_is_a_single_watched_run(setting, sweeping, verbose, terminal, shown):
    assert shows_config(setting, sweeping=sweeping, verbose=verbose, terminal=terminal) is shown


def test_metrics_show_4_significant_digits():
    metrics = {"accuracy": 0.9888888597488403, "loss": 0.043128, "mae": 2970.385498046875}
    assert metrics_line(metrics) == "accuracy=0.9889 loss=0.04313 mae=2970"
    assert metrics_line({}) == "-"


def _on_a_terminal(args: list[str], cwd) -> str:
    """Runs `python -m tfrecipe ARGS` with stdout on a pseudo-terminal; returns what it showed."""
    leader, follower = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "tfrecipe", *args], cwd=cwd, stdout=follower, stderr=follower
    ) as process:
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process is done writing
                break
            if not chunk:
                break
            shown += chunk
        assert process.wait(timeout=300) == 0, shown.decode(errors="replace")[-3000:]
    os.close(leader)
    return ANSI.sub("", shown.decode(errors="replace").replace("\r\n", "\n"))


def test_what_differs_from_the_defaults_shows_on_a_terminal_not_in_a_log(cli, tmp_path):
    """A watched run shows the options and keys it changed and its plan, not the whole tree
    (config.yaml and --cfg job hold that)."""
    args = [*TINY, "loop.verbose=2", "model=mlp", "model.hidden_units=[32]"]
    watched = _on_a_terminal([*args, f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)
    shown = watched.split(CHANGES, 1)[1].split("\n", 1)[1].split("\nplan:\n", 1)
    assert shown[0].splitlines() == [
        "  model=mlp",
        "  model.hidden_units=[32]",
        "  batching.per_replica_batch_size=16",
        "  loop.epochs=2",
        "  loop.steps_per_epoch=3",
        "  loop.verbose=2",
    ], watched[-3000:]
    assert shown[1].startswith("  loop: fit (one process)\n  precision: float32\n")
    assert not TREE.search(watched)
    done = re.search(r"done: completed in [\d.]+s; test accuracy=(\S+) loss=(\S+);", watched)
    significant = [value.lstrip("0.").replace(".", "") for value in done.groups()] if done else []
    assert significant and all(0 < len(digits) <= 4 for digits in significant), watched

    logged = cli(*TINY, "loop.verbose=2", f"hydra.run.dir={tmp_path / 'b'}")
    assert logged.returncode == 0, logged.stderr[-3000:]
    assert CHANGES not in logged.stdout and "done: completed" in logged.stdout + logged.stderr
