"""A user sees tfrecipe's lines (issue 49, item 8): TensorFlow's start-up lines stay off the
console of commands that do not train (the Python API, `baseline`), and tfrecipe's own notes
on the Keras fixes it installs are debug lines, not one INFO line per worker."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys

import pytest

# TensorFlow's start-up lines (absl's notice, C++ INFO lines, cpu_feature_guard's second line)
# and the cuInit error where no driver is installed.
NOISE = ("I0000 ", "absl::InitializeLog", "To enable the following instructions", "cuInit")


def _fresh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, **(env or {})},
    )


@pytest.mark.heavy  # a fresh interpreter imports TensorFlow
def test_the_python_api_imports_tensorflow_off_the_console():
    """As a notebook or script does it: no TF_CPP_MIN_LOG_LEVEL set, `tfrecipe.train` imported."""
    script = (
        "import os\n"
        "from tfrecipe.train import train  # imports TensorFlow\n"
        "import tensorflow as tf\n"
        "print(tf.constant(2).numpy() * 21)\n"
        "os.write(2, b'after\\n')\n"
    )
    result = _fresh("-c", script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["42"]
    assert result.stderr.splitlines() == ["after"], result.stderr[-3000:]


@pytest.mark.heavy
def test_tensorflow_loads_without_full_garbage_collections_and_collection_resumes():
    """Each full pass of the collector over TensorFlow's import cost 0.1-0.25 s (0.8 s in all), and
    Keras' `clear_session` at a run's start another 0.2 s: none while it loads, its objects frozen
    after it, and the collector on again as it was."""
    script = (
        "import gc\n"
        "passes = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'stop' and info['generation'] == 2\n"
        "                    and passes.append(1))\n"
        "import tfrecipe.train  # imports TensorFlow\n"
        "print(len(passes), gc.get_freeze_count() > 100_000, gc.isenabled())\n"
    )
    result = _fresh("-c", script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["0", "True", "True"], result.stdout


@pytest.mark.heavy
def test_the_python_api_shows_them_when_asked():
    result = _fresh("-c", "import tfrecipe.train", env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert any(noise in result.stderr for noise in NOISE[:2]), result.stderr[-3000:]


@pytest.mark.heavy
def test_baseline_refuses_in_one_line_without_tensorflows(tmp_path):
    result = _fresh("-m", "tfrecipe", "baseline", str(tmp_path / "missing"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"tfrecipe: invalid configuration: baseline: {tmp_path / 'missing'} is not a directory"
    ]


def test_installing_a_keras_fix_is_a_debug_line(caplog, monkeypatch):
    from tfrecipe import compat

    trainer = importlib.import_module("keras.src.backend.tensorflow.trainer").TensorFlowTrainer
    monkeypatch.setattr(compat, "_original", {})  # as in a new process: nothing installed yet
    monkeypatch.setattr(trainer, "train_step", trainer.train_step)  # put back afterwards
    with caplog.at_level(logging.DEBUG, logger="tfrecipe"):
        compat._install("train_step", compat._train_step)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "installed" in r.getMessage()]
    assert said == [(logging.DEBUG, "installed tfrecipe's fix of Keras' train_step")]
