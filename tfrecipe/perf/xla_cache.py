"""XLA's persistent compile cache for this process (`batching.compile_cache`: the decision is
tfrecipe.config.compile_cache's): the folder made for this user only, TF_XLA_FLAGS set, and what
this process uses. Without TensorFlow: TensorFlow reads TF_XLA_FLAGS once, when it first lists
its devices (measured on 2.21: `tf.config.list_physical_devices()` before the flag is set, and
nothing is cached), and tfrecipe's import of TensorFlow lists them. So the training command
decides before it imports TensorFlow (cli/job.py), from a device description read without it
(`devices`); a later run in the same process keeps the first one's cache, or none. A run
started from Python (`tfrecipe.train`) imported TensorFlow already: there TF_XLA_FLAGS of your
own, set before, is the way."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path

from tfrecipe.config import compile_cache
from tfrecipe.config.compile_cache import Choice, Devices
from tfrecipe.errors import ConfigError, Problem
from tfrecipe.perf import provenance

_LATE = "TensorFlow was loaded before: if it listed its devices, it read TF_XLA_FLAGS without it"
_in_use: Choice | None = None  # what this process's XLA was told (TF reads it once)
_chosen: Choice | None = None  # the last run's choice, on or off (summary.json)


def use(setting: str | bool, *, jit_compile: bool | str, devices: Devices) -> Choice:
    """Turns XLA's persistent cache on where `compile_cache.choose` says so: the folder made
    (mode 0700) and checked, TF_XLA_FLAGS set; the choice, for summary.json.

    Raises:
      ConfigError: the folder is a link, another user's or writable by others.
    """
    global _in_use, _chosen
    if _in_use is not None:  # TensorFlow read TF_XLA_FLAGS already: this process keeps it
        _chosen = _in_use
        return _in_use
    choice = compile_cache.choose(
        setting,
        jit_compile=jit_compile,
        devices=devices,
        machine=machine_key,
        environment=os.environ,
    )
    if choice.directory is not None:
        _make_private(choice.directory, setting)
        flags = compile_cache.flags_with(os.environ.get(compile_cache.ENV, ""), choice.directory)
        os.environ[compile_cache.ENV] = flags
        if "tensorflow" in sys.modules:  # loaded by a caller: it may have read the flag already
            choice = Choice(choice.directory, f"{choice.reason} ({_LATE})")
        _in_use = choice
    _chosen = choice  # said in the run's log once its run dir is its own (summary.log_choices)
    return choice


def _make_private(directory: Path, setting: str | bool) -> None:
    """The cache's folders, made for this user only, then checked as validate checks a path."""
    for folder in (directory.parent, directory):
        problem = compile_cache.unsafe_folder(folder)
        if problem is None and not folder.exists():
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            problem = compile_cache.unsafe_folder(folder)
        if problem is not None:
            raise ConfigError(Problem("batching.compile_cache", setting, problem))


def devices(strategy: str, environment: Mapping[str, str]) -> Devices:
    """What the run will compute on, read without TensorFlow: NVIDIA GPUs the driver lists
    (unless CUDA_VISIBLE_DEVICES hides them all), a Cloud TPU VM's chips; and whether a
    tf.distribute strategy holds the model (every strategy but `default`)."""
    kind = "CPU"
    if _gpu_models() and environment.get("CUDA_VISIBLE_DEVICES", "0").strip() not in ("", "-1"):
        kind = "GPU"
    elif glob.glob("/dev/accel[0-9]*") or environment.get("TPU_ACCELERATOR_TYPE"):
        kind = "TPU"
    return Devices(frozenset({kind}), distributed=strategy != "default")


def _gpu_models() -> list[str]:
    """The NVIDIA driver's GPU models (/proc/driver/nvidia/gpus/*/information)."""
    models = []
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            lines = Path(info).read_text().splitlines()
        except OSError:
            continue
        models += [line.split(":", 1)[1].strip() for line in lines if line.startswith("Model:")]
    return models


def machine_key() -> str:
    """The machine a compiled program is for: its host, CPU (model and flags), GPUs and
    TensorFlow (XLA:CPU programs of another CPU can crash with SIGILL)."""
    cpu = provenance.cpu()
    text = json.dumps(
        [
            os.uname().nodename,
            cpu.get("model"),
            sorted(cpu.get("flags") or []),
            _gpu_models(),
            version("tensorflow"),
        ],
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def chosen(environment: Mapping[str, str]) -> dict[str, object]:
    """summary.json's `compile_cache`: the folder this process's XLA caches its programs in
    (null: none) and why."""
    if _chosen is not None:
        return _chosen.fields()
    flags = environment.get(compile_cache.ENV, "")
    named = [f.split("=", 1)[1] for f in flags.split() if f.startswith(compile_cache.FLAG + "=")]
    if named:
        return {"directory": named[-1], "reason": f"{compile_cache.ENV} (yours)"}
    return {"directory": None, "reason": "not set: the run started without the training command"}
