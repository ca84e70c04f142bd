"""`batching.compile_cache`: where XLA keeps the programs it compiled, so that a second identical
run loads them instead of compiling them again (TensorFlow's persistent cache,
`TF_XLA_FLAGS=--tf_xla_persistent_cache_directory=DIR`), decided from the device description
before the first program runs. No TensorFlow here: the plan and `tfrecipe validate` say it too.

- `auto`: on where the run compiles with XLA on a GPU or TPU (`batching.jit_compile=true`, or
  `auto` where Keras turns it on: an accelerator, no tf.distribute strategy), in a folder tfrecipe
  owns under the user's cache dir (`$XDG_CACHE_HOME/tfrecipe/xla`, else `~/.cache/tfrecipe/xla`):
  not in a run dir, which gets copied around; off otherwise, and off on a CPU (`CPU_OFF`).
- `false`: off.
- an absolute path: that folder instead of the user's cache dir, wherever XLA compiles, a CPU
  included (your command line only: XLA loads programs from it, so a config file may not aim it;
  `config.checks.COMMAND_LINE_ONLY`).

Programs compiled for one CPU can crash another (XLA:CPU warns of SIGILL on a mismatch), and the
cache's file names do not say which device compiled them: every machine (host, CPU model and
flags, GPUs, TensorFlow version) gets a subfolder of its own (`machine`). TensorFlow reads
TF_XLA_FLAGS once, when it first lists its devices (measured on 2.21: set after
`tf.config.list_physical_devices()`, nothing is cached), so the training command decides before
it imports TensorFlow (tfrecipe.perf.xla_cache). A TF_XLA_FLAGS that names a cache already is
yours: kept as it is.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

ENV = "TF_XLA_FLAGS"
FLAG = "--tf_xla_persistent_cache_directory"
# Why `auto` leaves it off on a CPU, though it pays there too (docs/benchmarks.md, "A tenth
# pass": the default CNN's second run spent 0.53x the first's CPU seconds): XLA:CPU's loader logs
# three error lines per program it loads (a text-format parse it falls back from, and "could
# lead to execution errors such as SIGILL" for two target features its build names), which a
# user would take for a failure. jit_compile=auto never compiles on a CPU anyway.
CPU_OFF = (
    "XLA:CPU's loader logs three error lines per program it loads; measured, the second run "
    "still spent 0.53x the first's CPU seconds"
)
# Strategies under which Keras' jit_compile=auto compiles: the default (no tf.distribute scope).
_AUTO_JIT_STRATEGIES = ("default",)


@dataclasses.dataclass(frozen=True)
class Devices:
    """What decides whether a run compiles with XLA: the kinds of device the strategy computes
    on ("CPU", "GPU", "TPU") and whether a tf.distribute strategy holds the model (Keras'
    `jit_compile=auto` compiles only without one, and only on an accelerator)."""

    kinds: frozenset[str]
    distributed: bool


@dataclasses.dataclass(frozen=True)
class Choice:
    """The folder XLA's persistent cache uses (None: off), and why (one line, in summary.json)."""

    directory: Path | None
    reason: str

    def fields(self) -> dict[str, object]:
        directory = None if self.directory is None else str(self.directory)
        return {"directory": directory, "reason": self.reason}


def xla_compiles(jit_compile: bool | str, devices: Devices) -> str | None:
    """Why the run compiles with XLA, or None where it does not (Keras' rule for `auto`)."""
    if jit_compile is True:
        return "batching.jit_compile=true"
    if jit_compile != "auto":
        return None
    accelerators = sorted(devices.kinds - {"CPU"})
    if accelerators and not devices.distributed:
        return f"batching.jit_compile=auto on a {'/'.join(accelerators)} without a strategy scope"
    return None


def default_root(environment: Mapping[str, str]) -> Path:
    """The folder tfrecipe owns for compiled programs: under the user's cache dir."""
    base = environment.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tfrecipe" / "xla"


def choose(
    setting: str | bool,
    *,
    jit_compile: bool | str,
    devices: Devices,
    machine: Callable[[], str],
    environment: Mapping[str, str],
) -> Choice:
    """Whether XLA's persistent cache is used, in which folder, and why.

    Args:
      setting: `batching.compile_cache` (auto, false or an absolute path).
      jit_compile: `batching.jit_compile` (true, false or auto).
      devices: what the run computes on.
      machine: gives this machine's key (its subfolder: programs of one machine only), asked
        only where the cache is on (reading it costs milliseconds: the CPU, GPUs, TensorFlow's
        version).
      environment: the process's environment (TF_XLA_FLAGS, XDG_CACHE_HOME).
    """
    key = "batching.compile_cache"
    if setting is False:
        return Choice(None, f"{key}=false")
    if FLAG in environment.get(ENV, ""):
        return Choice(None, f"{ENV} names XLA's cache already (kept as it is)")
    why = xla_compiles(jit_compile, devices)
    if why is None:
        why_not = _no_xla(jit_compile, devices)
        return Choice(None, f"{key}={setting}: off, nothing compiles with XLA ({why_not})")
    if setting == "auto" and devices.kinds <= {"CPU"}:
        return Choice(None, f"{key}=auto: off on a CPU ({CPU_OFF}); name a folder to use it")
    root = default_root(environment) if setting == "auto" else Path(str(setting))
    return Choice(root / machine(), f"{key}={setting}: on, {why}")


def _no_xla(jit_compile: bool | str, devices: Devices) -> str:
    if jit_compile is False:
        return "batching.jit_compile=false"
    if devices.kinds <= {"CPU"}:
        return "jit_compile=auto is off on a CPU"
    return "jit_compile=auto is off under a tf.distribute strategy"


def plan_line(setting: str | bool, *, jit_compile: bool | str, strategy: str) -> str:
    """The plan's line (`tfrecipe validate`): what the config decides before the devices do."""
    head = f"compile cache: batching.compile_cache={str(setting).lower()}"
    if setting is False:
        return f"{head}: off (XLA compiles every run afresh)"
    where = "the user's cache dir" if setting == "auto" else str(setting)
    on_cpu = "off on a CPU" if setting == "auto" else "on a CPU too"
    if jit_compile is True:
        return f"{head}: on a GPU or TPU ({where}, a folder per machine), {on_cpu}"
    if jit_compile == "auto" and strategy in _AUTO_JIT_STRATEGIES:
        return (
            f"{head}: on a GPU or TPU ({where}, a folder per machine), where Keras' "
            "jit_compile=auto compiles with XLA; off on a CPU, where it does not"
        )
    jit = str(jit_compile).lower()
    return f"{head}: off (batching.jit_compile={jit} under strategy={strategy}: no XLA)"


def xla_plan_line(jit_compile: bool | str, *, strategy: str) -> str:
    """The plan's line on what XLA compiles (`batching.jit_compile`): with a training split held
    on one device, each call whole (tfrecipe.loops.resident_fit.compiles_loop), else each
    step; summary.json's `resident.xla` says which ran."""
    head = f"xla: batching.jit_compile={str(jit_compile).lower()}"
    whole = (
        "each call on a training split held on one device is one XLA program{}, else each "
        "step compiles; summary.json's resident.xla says which"
    )
    if jit_compile is True:
        return f"{head}: " + whole.format(" (on a CPU: models without convolutions)")
    if jit_compile == "auto" and strategy in _AUTO_JIT_STRATEGIES:
        return f"{head}: off on a CPU; on a GPU or TPU (Keras' auto) " + whole.format("")
    if jit_compile == "auto":
        return f"{head}: off (Keras compiles only without a strategy scope: strategy={strategy})"
    return f"{head}: off"


def path_problem(value: str) -> str | None:
    """What is wrong with a folder given as `batching.compile_cache`, or None."""
    if not os.path.isabs(value):
        return "expected auto, false or an absolute path (a folder for XLA's compiled programs)"
    return unsafe_folder(Path(value))


def unsafe_folder(path: Path) -> str | None:
    """Why XLA may not load programs from `path` (each parent it has), or None: a folder that
    is a link, belongs to another user or that others may write could hold someone's code."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:  # made by the run, for this user only
        return _unsafe_parent(path)
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a link: XLA loads programs from this folder; name the folder itself"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder"
    if info.st_uid != os.getuid():
        return f"{path} belongs to another user: XLA would load programs they put there"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others: XLA would load programs they put there"
    return None


def _unsafe_parent(path: Path) -> str | None:
    """A folder still to be made: its nearest parent may not let others swap it (a folder
    anyone may write, unless sticky as /tmp is: there others cannot replace yours)."""
    parent = next((p for p in path.parents if os.path.lexists(p)), None)
    if parent is None:
        return None
    mode = os.stat(parent).st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        return f"{parent} is writable by anyone: XLA would load programs others put there"
    return None


def flags_with(flags: str, directory: Path) -> str:
    """TF_XLA_FLAGS with the cache's folder added to the flags already there."""
    return " ".join(part for part in (flags.strip(), f"{FLAG}={directory}") if part)
