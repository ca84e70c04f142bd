"""The Python API names what its caller typed (issue 49, item 5): a completed run's dir is
refused as `run_dir=` (train's argument) from Python, and as `hydra.run.dir=` from the command
line, in the same words otherwise."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tfrecipe.errors import ConfigError
from tfrecipe.outcome import ensure_fresh_run_dir, run_dir_named


def _completed(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    return run_dir


def test_python_names_run_dir_and_the_command_line_hydra_run_dir(tmp_path):
    run_dir = _completed(tmp_path)
    with pytest.raises(ConfigError) as python:
        ensure_fresh_run_dir(run_dir)
    assert str(python.value) == (
        f"run_dir={run_dir}: already holds a completed run (summary.json); choose another run_dir"
    )
    with run_dir_named("hydra.run.dir"), pytest.raises(ConfigError) as command_line:
        ensure_fresh_run_dir(run_dir)
    assert str(command_line.value).startswith(f"hydra.run.dir={run_dir}: already holds")
    with pytest.raises(ConfigError, match=r"^run_dir="):  # the command line's name was put back
        ensure_fresh_run_dir(run_dir)


def test_the_command_line_refuses_a_completed_run_dir_by_its_key(tmp_path):
    run_dir = _completed(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "tfrecipe", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"tfrecipe: invalid configuration: hydra.run.dir={run_dir}: already holds a completed run "
        "(summary.json); choose another hydra.run.dir"
    )
