"""What a config file may set under `hydra.launcher`, `hydra.job` and `hydra.sweeper`.

These nodes reach a shell (submitit writes the launcher's values into each job's sbatch script,
one `#SBATCH` line each, where a newline starts a command), names (the job's name becomes log
files and SLURM job names), folders (submitit's folder, joblib's temporary folder) and files
(an Optuna storage). A recipe someone else wrote may set only keys whose values are inert:
numbers, flags, durations and fixed choices (`INERT`). Every other key there, free text or a path,
counts only as the plugin ships it (its ConfigStore node, tfrecipe's conf/config.yaml) or when
this invocation's command line gives it (`Trust`), like `setup` (hydra_node.LAUNCHER_SHELL_KEYS).

Keys with a rule of their own (`GUARDED`) are checked there. A folder or storage file
(`SWEEP_PATHS`) that a config file names must lie inside the sweep dir: anywhere else is the
command line's to choose. Whatever the source, no value under `hydra.*` holds a control
character (a newline in an `#SBATCH` line is a shell command, an escape sequence in a folder's
name rewrites the terminal that prints it).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tfrecipe.config.trust import Trust
from tfrecipe.errors import Problem


@dataclasses.dataclass(frozen=True)
class Kind:
    """An inert kind of value: what it is, in the user's words, and the test of a value."""

    name: str
    accepts: Callable[[Any], bool]


def _count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _number(value: Any) -> bool:
    return _count(value) or isinstance(value, float)


def _choice(*values: Any) -> Kind:
    return Kind(f"one of {', '.join(map(str, values))}", lambda v: v in values)


def _pattern(name: str, pattern: str) -> Kind:
    compiled = re.compile(pattern)
    return Kind(name, lambda v: _count(v) or (isinstance(v, str) and bool(compiled.fullmatch(v))))


COUNT = Kind("a whole number or null", _count)
NUMBER = Kind("a number or null", _number)
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
SCALAR = Kind("a number, true, false or null", lambda v: _number(v) or isinstance(v, bool))
SIZE = _pattern("a size (e.g. 4G) or null", r"\d+[KMGT]?B?")
DIRECTION = Kind(
    "minimize, maximize or a list of them",
    lambda v: all(d in ("minimize", "maximize") for d in (v if isinstance(v, list) else [v])),
)

# key (a glob) -> the kind of value a config file may give it.
INERT: Mapping[str, Kind] = {
    # submitit (SLURM and local): resources and time, in numbers.
    **dict.fromkeys(
        [
            "timeout_min",
            "cpus_per_task",
            "gpus_per_node",
            "tasks_per_node",
            "nodes",
            "cpus_per_gpu",
            "gpus_per_task",
            "signal_delay_s",
            "max_num_timeout",
            "array_parallelism",
        ],
        COUNT,
    ),
    "mem_gb": NUMBER,
    "mem_per_gpu": SIZE,
    "mem_per_cpu": SIZE,
    "stderr_to_stdout": FLAG,
    # joblib
    "n_jobs": COUNT,
    "verbose": COUNT,
    "timeout": NUMBER,
    "backend": _choice(None, "loky", "threading", "multiprocessing"),
    "prefer": _choice(None, "processes", "threads"),
    "require": _choice(None, "sharedmem"),
    "pre_dispatch": _pattern("a count, all or N*n_jobs", r"all|(\d+\s*\*\s*)?n_jobs"),
    "batch_size": _pattern("a count or auto", r"auto"),
    "max_nbytes": SIZE,
    "mmap_mode": _choice(None, "r+", "r", "w+", "c"),
}
INERT = {f"hydra.launcher.{key}": kind for key, kind in INERT.items()} | {
    "hydra.job.chdir": FLAG,
    # sweepers: the basic one's batches; optuna's trials, objective and sampler/pruner numbers.
    "hydra.sweeper.max_batch_size": COUNT,
    "hydra.sweeper.n_trials": COUNT,
    "hydra.sweeper.n_jobs": COUNT,
    "hydra.sweeper.max_failure_rate": NUMBER,
    "hydra.sweeper.direction": DIRECTION,
    "hydra.sweeper.sampler.*": SCALAR,
    "hydra.sweeper.pruner.*": SCALAR,
}

# key (a glob) -> the rule that checks it (hydra_node, cli.sweeps, instantiate).
GUARDED: Mapping[str, str] = {
    "hydra.*._target_": "instantiate: a Hydra plugin's slot",
    "hydra.sweeper.*._target_": "instantiate: the sampler's slot",
    "hydra.sweeper.params*": "cli.sweeps: every job's values checked as a run's",
    "hydra.sweeper.search_space*": "cli.sweeps: expanded and checked like params",
    "hydra.sweeper.custom_search_space": "hydra_node: your own function only",
    "hydra.job.env_set*": "hydra_node.SAFE_ENV",
    "hydra.job.env_copy*": "hydra_node: no secret's name",
    "hydra.launcher.setup*": "hydra_node.LAUNCHER_SHELL_KEYS: command line only",
    "hydra.launcher.srun_args*": "hydra_node.LAUNCHER_SHELL_KEYS: command line only",
    "hydra.launcher.additional_parameters*": "hydra_node.LAUNCHER_SHELL_KEYS: command line only",
    "hydra.sweeper.storage": "SWEEP_PATHS: inside the sweep dir, else command line only",
    "hydra.launcher.submitit_folder": "SWEEP_PATHS: inside the sweep dir, else command line only",
}
# Hydra's own node outside the three sections, each key with its own check in hydra_node: the
# run and sweep dirs, logging, the output subdir, callbacks.
# Values Hydra sets itself as a job starts (a config file's would be replaced).
SET_BY_HYDRA = (
    "hydra.job.id",
    "hydra.job.num",
    "hydra.job.override_dirname",
    "hydra.job.config_name",
)
# Folders and files a config file may name only inside the sweep dir: key -> the path its value
# names, given the sweep dir (None: no path, the plugin's default place).
_URL_PATH = re.compile(r"^(sqlite|journal):///?(?P<path>.+)$")
SWEEP_PATHS: Mapping[str, Callable[[str, Path], Path | None]] = {
    "hydra.launcher.submitit_folder": lambda value, _: Path(value),
    "hydra.sweeper.storage": lambda value, _: (m := _URL_PATH.match(value)) and Path(m["path"]),
    "hydra.sweep.subdir": lambda value, sweep_dir: sweep_dir / value,  # each job's dir
}
# Hydra's records of the command line as typed and of the job (not a config file's to set).
RECORDS = ("overrides", "runtime")
# Texts printed whole (`--help`), where a newline is content; an escape sequence is not.
_TEXT_NODES = ("help", "hydra_help")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x80-\x9f]")
_TEXT_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")
SECTIONS = ("launcher", "job", "sweeper")


def hydra_key_problems(node: DictConfig, *, trust: Trust) -> list[Problem]:
    """What a config file sets under `hydra.{launcher,job,sweeper}` that only the command line
    may, and control characters anywhere in Hydra's node.

    Args:
      node: the composed config's `hydra` node.
      trust: what this invocation's command line grants.
    """
    written = OmegaConf.to_container(node, resolve=False)
    problems = _control_problems(written)
    choices = written.get("runtime", {}).get("choices", {})
    defaults = shipped_defaults(tuple(sorted((k, v) for k, v in choices.items() if v)))
    for section in SECTIONS:
        settings = dict(leaves(written.get(section), f"hydra.{section}"))
        for key, value in settings.items():
            if value is None or _matches(key, GUARDED) or key in SET_BY_HYDRA:
                continue  # null: no text at all, the plugin's own default
            if value == defaults.get(key):
                continue
            kind = next((k for glob, k in INERT.items() if fnmatch.fnmatchcase(key, glob)), None)
            if (kind and kind.accepts(value)) or trust.gave(key, value):
                continue
            if key not in {p.key for p in problems}:
                problems.append(Problem(key, value, _hint(key, kind, settings)))
    return problems + _sweep_path_problems(node, dict(leaves(written, "hydra")), defaults, trust)


def _hint(key: str, kind: Kind | None, settings: Iterable[str]) -> str:
    """What a config file may give `key` (`kind`), or which keys beside it it may set."""
    if kind is not None:
        return f"expected {kind.name}"
    section = key.split(".")[1]
    inert = [k.split(".", 2)[2] for k in settings if _matches(k, INERT)] or ["none"]
    return (
        "free text or a path here reaches a shell, a name or a folder, so only your command line "
        f"may set it, not a config file (pass {key}=... yourself); a config file may set only "
        f"numbers, flags and fixed choices under hydra.{section}: {', '.join(inert)}"
    )


def leaves(node: Any, prefix: str) -> Iterable[tuple[str, Any]]:
    """(dotted key, value) of each non-mapping value under `node` (a list is one value)."""
    if isinstance(node, Mapping):
        for name, value in node.items():
            yield from leaves(value, f"{prefix}.{name}")
    else:
        yield prefix, node


def _matches(key: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, glob) for glob in globs)


@functools.lru_cache(maxsize=32)
def shipped_defaults(choices: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """key -> value as written, of what the selected plugins ship (their ConfigStore nodes, a
    nested group's too: `hydra/sweeper/sampler`) and of tfrecipe's conf/config.yaml.

    Args:
      choices: Hydra's (group, option) pairs (`hydra.runtime.choices`), sorted.
    """
    from hydra.conf import HydraConf
    from hydra.core.config_store import ConfigStore

    hydra = OmegaConf.to_container(OmegaConf.structured(HydraConf), resolve=False)
    defaults: dict[str, Any] = dict(leaves(hydra, "hydra"))  # Hydra's own
    for group, choice in choices:  # a group before its nested groups
        if not group.startswith("hydra/") or not isinstance(choice, str):
            continue
        try:
            stored = ConfigStore.instance().load(f"{group}/{choice}.yaml")
        except OSError:  # hydra's ConfigLoadError
            continue  # not a ConfigStore node (a YAML file): its values need the command line
        container = OmegaConf.to_container(OmegaConf.create(stored.node), resolve=False)
        container.pop("defaults", None)
        defaults.update(leaves(container, group.replace("/", ".")))
    defaults.update(leaves(_own_hydra_node(), "hydra"))
    return defaults


def _own_hydra_node() -> dict[str, Any]:
    """conf/config.yaml's `hydra` node (tfrecipe's own defaults, e.g. the job's name)."""
    from tfrecipe import reading
    from tfrecipe.config.compose import config_dir

    config = reading.read_yaml(config_dir() / "config.yaml", what="tfrecipe's config")
    return OmegaConf.to_container(config, resolve=False).get("hydra") or {}


def _control_problems(written: Mapping[str, Any]) -> list[Problem]:
    problems = []
    for key, value in leaves(written, "hydra"):
        section = key.split(".")[1]
        values = value if isinstance(value, list) else [value]
        if section in RECORDS or _matches(key, ("hydra.launcher.setup*",)):
            continue
        control = _TEXT_CONTROL if section in _TEXT_NODES else _CONTROL
        if any(isinstance(v, str) and control.search(v) for v in values):
            problems.append(
                Problem(
                    key,
                    value,
                    "holds a control character (a newline, an escape): Hydra's values become "
                    "script lines, names and folders, where one would start a command or rewrite "
                    "the terminal; write plain text",
                )
            )
    return problems


def _sweep_path_problems(
    node: DictConfig, written: Mapping[str, Any], defaults: Mapping[str, Any], trust: Trust
) -> list[Problem]:
    """A folder or storage file (`SWEEP_PATHS`) a config file names outside the sweep dir."""
    problems = []
    sweep_dir = _resolved(node, "sweep.dir")
    for key, path_of in SWEEP_PATHS.items():
        value, as_written = _resolved(node, key.removeprefix("hydra.")), written.get(key)
        if not isinstance(value, str) or as_written == defaults.get(key):
            continue
        if trust.gave(key, as_written):
            continue
        path = path_of(value, Path(str(sweep_dir)))
        if path is None or (sweep_dir and _inside(path, Path(str(sweep_dir)))):
            continue
        problems.append(
            Problem(
                key,
                as_written,
                "is outside the sweep dir (hydra.sweep.dir): a config file may name a place inside "
                f"it only; elsewhere is your command line's choice (pass {key}=... yourself)",
            )
        )
    return problems


def _resolved(node: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(node, key, throw_on_missing=True)
    except Exception:  # a value set only in the job (`${hydra.job.num}`): as written
        return OmegaConf.select(node, key, throw_on_resolution_failure=False)


def _inside(path: Path, folder: Path) -> bool:
    path, folder = (Path(os.path.normpath(p.absolute())) for p in (path, folder))
    return path != folder and path.is_relative_to(folder)
