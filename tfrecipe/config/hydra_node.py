"""What a config may set in Hydra's own node (`hydra.*`), checked before Hydra acts on it.

Hydra reads its node before any job runs: it instantiates its launcher and sweeper, configures
logging (`logging.config.dictConfig` imports classes and opens files), writes `.hydra/` and puts
`hydra.job.env_set` into the job's environment. A recipe someone else wrote must turn none of
these into code that runs, a file written outside the run dir or a secret sent elsewhere:

- targets (launcher, sweeper, optuna sampler) by their slot's kind (`instantiate`); Hydra
  callbacks are refused;
- logging: standard handler and formatter classes, `ext://sys.stdout`/`stderr` streams, `%`-style
  formats, and log files named `*.log` inside the run dir, appended to (mode `a`);
- `hydra.output_subdir`: null or a folder inside the run dir;
- `hydra.job.env_set`: the variables of `SAFE_ENV` (and those `env_copy` repeats from your own
  environment); `env_copy`: no secret's name;
- the optuna sweeper's `storage`: an sqlite or journal file or none (a server: the command
  line's); `custom_search_space`: your function;
- a launcher's shell settings (`LAUNCHER_SHELL_KEYS`): only from the command line;
- under `hydra.launcher`, `hydra.job` and `hydra.sweeper`, a config file sets only inert values
  (numbers, flags, fixed choices); free text and paths there are the command line's, folders
  and storage files lie inside the sweep dir, and no value anywhere holds a control character
  (`hydra_keys`);
- the run and sweep dirs and the job's name: no secret (`secrets.hydra_value_problems`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, flag_override

from tfrecipe.config.grants import Grants
from tfrecipe.config.hydra_keys import hydra_key_problems
from tfrecipe.config.secrets import hydra_value_problems, looks_secret
from tfrecipe.config.trust import Trust
from tfrecipe.errors import Problem
from tfrecipe.rundir import HYDRA_FILES

# Hydra's logging config goes to logging.config.dictConfig, which imports `class` and calls `()`.
_LOG_CLASSES = frozenset(
    {
        "logging.StreamHandler",
        "logging.FileHandler",
        "logging.NullHandler",
        "logging.Formatter",
        "logging.handlers.RotatingFileHandler",
        "logging.handlers.TimedRotatingFileHandler",
        "logging.handlers.WatchedFileHandler",
    }
)
_LOG_STREAMS = frozenset({"ext://sys.stdout", "ext://sys.stderr"})
# The only log file a config may name: Python runs the lines of a `.pth` file it finds on its
# path at start-up, and other suffixes may be read as code or settings by other programs.
_LOG_SUFFIX = ".log"

# `hydra.job.env_set` goes into the environment of the job and of every process it starts
# (local-cluster workers, joblib workers, TensorFlow's own subprocesses). An allow-list, not a
# blocklist: variables that load code (LD_PRELOAD, PYTHONPATH, BASH_ENV, ...), send data or
# credentials elsewhere (WANDB_BASE_URL, HTTPS_PROXY, TF_CONFIG) or move homes and caches
# (HOME, KERAS_HOME, TMPDIR, WANDB_DIR) are too many to name. These change only how many threads
# run, which devices are seen, what is logged and whether W&B is on.
SAFE_ENV = frozenset(
    {
        # TensorFlow: log level, threads, devices, determinism.
        "TF_CPP_MIN_LOG_LEVEL",
        "TF_NUM_INTEROP_THREADS",
        "TF_NUM_INTRAOP_THREADS",
        "TF_ENABLE_ONEDNN_OPTS",
        "TF_DETERMINISTIC_OPS",
        "TF_CUDNN_DETERMINISTIC",
        "TF_FORCE_GPU_ALLOW_GROWTH",
        "TF_GPU_THREAD_MODE",
        "TF_GPU_THREAD_COUNT",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        # OpenMP / MKL / OpenBLAS thread pools.
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "KMP_BLOCKTIME",
        "KMP_AFFINITY",
        # Python: hashing and output only.
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONFAULTHANDLER",
        "PYTHONDONTWRITEBYTECODE",
        # W&B: on, offline or off, and quiet (where it sends data stays your environment's).
        "WANDB_MODE",
        "WANDB_SILENT",
    }
)

# A launcher's settings that reach a shell: submitit's SLURM launcher writes `setup` lines and
# `additional_parameters` (`#SBATCH --KEY=VALUE`, where a newline starts a command) into each
# job's sbatch script and `srun_args` onto its srun line.
LAUNCHER_SHELL_KEYS = ("setup", "srun_args", "additional_parameters")


def hydra_problems(
    node: DictConfig,
    *,
    grants: Grants,
    output_dir: Path | None = None,
) -> list[Problem]:
    """What Hydra would import, call, write or export from its own node (`hydra.*`).

    Args:
      node: the composed config's `hydra` node.
      grants: the usable `allowed_targets` entries (granted, none refused) and what this
        invocation's command line grants (launcher shell settings).
      output_dir: the job's directory (`hydra.runtime.output_dir`); None: `hydra.run.dir`.
    """
    from tfrecipe.config.instantiate import target_problems

    output_dir, trust = output_dir or _run_dir(node), grants.trust
    hydra = _resolved_leaves(node, output_dir)
    # Hydra callbacks are refused as a whole, whatever they name.
    others = {key: value for key, value in hydra.items() if key != "callbacks"}
    problems = target_problems({"hydra": others}, grants=grants)
    problems += _callback_problems(hydra.get("callbacks") or {})
    for part in ("hydra_logging", "job_logging"):
        problems += _logging_problems(f"hydra.{part}", hydra.get(part) or {}, output_dir)
    problems += _output_subdir_problems(hydra.get("output_subdir"), output_dir)
    job = hydra.get("job") or {}
    problems += _env_set_problems(job) + _env_copy_problems(job)
    sweeper = hydra.get("sweeper") or {}
    problems += _sweeper_key_problems(sweeper)
    if sweeper.get("_target_") == OPTUNA_SWEEPER:
        problems += _optuna_value_problems(sweeper)
    problems += _storage_problems(_raw(node, "sweeper.storage"), sweeper.get("storage"), trust)
    problems += _search_space_problems(sweeper.get("custom_search_space"), grants)
    problems += hydra_value_problems(node)  # secrets in the dirs' and the job's names
    launcher = OmegaConf.to_container(node, resolve=False).get("launcher") or {}
    problems += _launcher_shell_problems(launcher, trust)
    named = {p.key for p in problems}
    return problems + [p for p in hydra_key_problems(node, trust=trust) if p.key not in named]


def _callback_problems(callbacks: Mapping[str, Any]) -> list[Problem]:
    return [
        Problem(
            f"hydra.callbacks.{name}",
            hint="Hydra callbacks are not supported (Hydra would run them outside "
            "tfrecipe's allow-list); use callbacks.extra.NAME for a Keras callback",
        )
        for name in callbacks
    ]


def _run_dir(node: DictConfig) -> Path | None:
    with contextlib.suppress(Exception):
        return Path(str(OmegaConf.select(node, "run.dir", throw_on_missing=True))).absolute()
    return None


def _walk(node: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every entry of a nested container."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield (*path, str(key)), value
            yield from _walk(value, (*path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, (*path, str(index)))


def _resolved_leaves(node: DictConfig, output_dir: Path | None) -> dict[str, Any]:
    """`node` as plain containers, each interpolation resolved where it can be, with
    `runtime.output_dir` (set only once a job runs) as `output_dir`. Hydra's node holds other
    values set only in the job (e.g. `hydra.job.num`): an interpolation that cannot be resolved
    stays as written, which no check accepts."""
    node = _with_output_dir(node, output_dir)
    container = OmegaConf.to_container(node, resolve=False)
    for path, value in list(_walk(container)):
        if isinstance(value, str) and "${" in value:
            with contextlib.suppress(Exception):
                parent = functools.reduce(
                    lambda c, k: c[int(k) if isinstance(c, list) else k], path[:-1], container
                )
                resolved = OmegaConf.select(node, ".".join(path), throw_on_missing=True)
                parent[int(path[-1]) if isinstance(parent, list) else path[-1]] = resolved
    return container


def _with_output_dir(node: DictConfig, output_dir: Path | None) -> DictConfig:
    """A copy of the whole config (Hydra's values may interpolate the job's) with
    `hydra.runtime.output_dir` set; its `hydra` node."""
    if output_dir is None:
        return node
    root = copy.deepcopy(node._get_root())
    with flag_override(root, ["struct", "readonly"], [False, False]):
        OmegaConf.update(root, "hydra.runtime.output_dir", str(output_dir), force_add=True)
    return root.hydra


# --- logging ------------------------------------------------------------------------------------
def _logging_problems(
    key: str, config: Mapping[str, Any], output_dir: Path | None
) -> list[Problem]:
    problems = [
        problem
        for path, value in _walk(config)
        if (problem := _logging_entry_problem(key, path, value)) is not None
    ]
    for name, handler in (config.get("handlers") or {}).items():
        if isinstance(handler, Mapping):
            problems += _log_file_problems(f"{key}.handlers.{name}", handler, output_dir)
    for name, formatter in (config.get("formatters") or {}).items():
        style = formatter.get("style", "%") if isinstance(formatter, Mapping) else "%"
        if style != "%":
            problems.append(
                Problem(
                    f"{key}.formatters.{name}.style",
                    style,
                    "expected % (the default, %(name)s fields): {} and $ formats are not "
                    "allowed ({} reaches attributes of every logged object, secrets included)",
                )
            )
    return problems


def _logging_entry_problem(key: str, path: tuple[str, ...], value: Any) -> Problem | None:
    """What is wrong with one entry of a logging config: anything dictConfig would import, or
    read from elsewhere than the value the checks see (None: nothing)."""
    where = ".".join((key, *path))
    if path[-1] == "()":
        return Problem(where, hint="logging factories ('()') are not allowed; use class")
    if path[-1] == ".":  # attributes set once a handler is built: past the checks of its values
        return Problem(
            ".".join((key, *path[:-1])) + "['.']",
            hint="logging's attribute setters are not allowed (they would change a handler "
            "after its checks, e.g. baseFilename: where it writes); remove it",
        )
    if isinstance(value, str) and value.startswith("cfg://"):
        return Problem(
            where,
            value,
            "logging's cfg:// references are not allowed (the value used would be another "
            "entry's, unchecked); write the value itself",
        )
    if path[-1] == "class" and value not in _LOG_CLASSES:
        return Problem(
            where, value, f"expected a standard logging class: {', '.join(sorted(_LOG_CLASSES))}"
        )
    if isinstance(value, str) and value.startswith("ext://") and value not in _LOG_STREAMS:
        return Problem(where, value, f"expected {' or '.join(sorted(_LOG_STREAMS))}")
    return None


def _log_file_problems(
    where: str, handler: Mapping[str, Any], output_dir: Path | None
) -> list[Problem]:
    """A log file stays inside the run dir, ends in `.log` and is appended to."""
    problems = []
    if "filename" in handler:
        filename = handler["filename"]
        hint = (
            f"expected a {_LOG_SUFFIX} file inside the run dir, e.g. "
            f"${{hydra.runtime.output_dir}}/${{hydra.job.name}}{_LOG_SUFFIX}"
        )
        if not isinstance(filename, str) or not filename.endswith(_LOG_SUFFIX):
            problems.append(Problem(f"{where}.filename", filename, hint))
        else:
            outside = _outside_problem(Path(filename), output_dir)
            if outside:
                problems.append(Problem(f"{where}.filename", filename, f"{outside}; {hint}"))
    mode = handler.get("mode", "a")
    if mode != "a":
        problems.append(
            Problem(
                f"{where}.mode",
                mode,
                "expected a (append, the default): another mode would empty or replace an "
                "existing log",
            )
        )
    return problems


def _outside_problem(path: Path, output_dir: Path | None) -> str | None:
    """Why `path` (a file Hydra writes; relative: to the current directory, as Hydra opens it)
    is not inside `output_dir` (None: it is). A symbolic link inside the run dir would lead a
    write elsewhere (a received run dir could hold one), so none may be on the way."""
    if output_dir is None:
        return "the run dir (hydra.run.dir) cannot be resolved"
    root = Path(os.path.normpath(output_dir.absolute()))
    target = Path(os.path.normpath(path.absolute()))
    if target == root or not target.is_relative_to(root):
        return "is outside the run dir"
    step = root
    for part in target.relative_to(root).parts:
        step = step / part
        if step.is_symlink():
            return f"{step} is a symbolic link (it would lead the write out of the run dir)"
    return None


def _output_subdir_problems(subdir: Any, output_dir: Path | None) -> list[Problem]:
    """`hydra.output_subdir` is where Hydra writes config.yaml, hydra.yaml and overrides.yaml,
    relative to the run dir (an absolute path would take them anywhere)."""
    if subdir is None:
        return []
    hint = "expected null or a folder inside the run dir (default .hydra)"
    if not isinstance(subdir, str) or not subdir or Path(subdir).is_absolute():
        return [Problem("hydra.output_subdir", subdir, hint)]
    base = output_dir or Path("run-dir")  # unresolvable run dir: the relative path still tells
    for name in ("", *HYDRA_FILES):
        outside = _outside_problem(base / subdir / name, base)
        if outside:
            return [Problem("hydra.output_subdir", subdir, f"{outside}; {hint}")]
    return []


# --- environment ----------------------------------------------------------------------------------
def _env_set_problems(job: Mapping[str, Any]) -> list[Problem]:
    """`hydra.job.env_set` entries outside `SAFE_ENV`. A name listed in `hydra.job.env_copy` is
    exempt: Hydra sets it to this environment's own value, which the job inherits anyway."""
    copied = set(job.get("env_copy") or [])
    return [
        Problem(
            f"hydra.job.env_set.{name}",
            value,
            f"a config may set only {', '.join(sorted(SAFE_ENV))}; export others in your "
            "shell if you mean them",
        )
        for name, value in (job.get("env_set") or {}).items()
        if name not in SAFE_ENV and name not in copied
    ]


def _env_copy_problems(job: Mapping[str, Any]) -> list[Problem]:
    """`hydra.job.env_copy` only copies this environment's values (harmless to code), but Hydra
    writes them into the run dir's `.hydra/hydra.yaml`: a secret's name is refused there."""
    return [
        Problem(
            "hydra.job.env_copy",
            name,
            "would write that secret into the run dir's .hydra/hydra.yaml; the job inherits "
            "your environment without it",
        )
        for name in job.get("env_copy") or []
        if looks_secret(str(name))
    ]


# --- sweeper and launcher -------------------------------------------------------------------------
# What each sweeper tfrecipe checks passes to its jobs, by key. A job's values come from
# `params` (and optuna's older `search_space`), which the pre-check expands job by job
# (tfrecipe/cli/sweeps.py); another sweeper, or another key, could hand a job values nothing
# checked, so it is refused.
_OPTUNA_KEYS = (
    "_target_ sampler pruner direction storage study_name n_trials n_jobs max_failure_rate "
    "search_space custom_search_space params"
)
OPTUNA_SWEEPER = "hydra_plugins.tfrecipe_optuna_sweeper.optuna_sweeper.OptunaSweeper"
SWEEPER_KEYS = {
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper": frozenset(
        {"_target_", "max_batch_size", "params"}
    ),
    OPTUNA_SWEEPER: frozenset(_OPTUNA_KEYS.split()),
}


def _sweeper_key_problems(sweeper: Mapping[str, Any]) -> list[Problem]:
    target = sweeper.get("_target_")
    if target is None:
        return []
    keys = SWEEPER_KEYS.get(target)
    if keys is None:
        return [
            Problem(
                "hydra.sweeper._target_",
                target,
                "tfrecipe cannot check the values this sweeper hands its jobs; use "
                "hydra/sweeper=basic (the default) or hydra/sweeper=optuna",
            )
        ]
    return [
        Problem(
            f"hydra.sweeper.{key}",
            hint=f"not a key of {target.rpartition('.')[2]} that tfrecipe checks; expected one "
            f"of {', '.join(sorted(keys - {'_target_'}))}",
        )
        for key in sweeper
        if key not in keys
    ]


def _optuna_value_problems(sweeper: Mapping[str, Any]) -> list[Problem]:
    """tfrecipe's optuna sweeper optimizes one objective (`sweep.objective`), in trials."""
    problems = []
    direction = sweeper.get("direction", "minimize")
    if direction not in ("minimize", "maximize"):
        hint = "expected minimize or maximize (one objective: sweep.objective)"
        problems.append(Problem("hydra.sweeper.direction", direction, hint))
    for key in ("n_trials", "n_jobs"):
        value = sweeper.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(Problem(f"hydra.sweeper.{key}", value, "expected an integer >= 1"))
    return problems


# Study storages a config may name: files, created or opened where it says (like hydra.sweep.dir).
_STORAGE_FILES = ("sqlite:///", "journal:///")


def _storage_problems(raw: Any, storage: Any, trust: Trust) -> list[Problem]:
    """The optuna sweeper's `storage`: an sqlite or journal file, or none (SWEEP_DIR/study.db);
    a database server would receive every trial's parameters and results, so only your command
    line (as typed, before interpolation: `'${oc.env:DB}'` names your environment's) may name
    one, or TFRECIPE_SWEEP_STORAGE."""
    if storage is None or (isinstance(storage, str) and storage.startswith(_STORAGE_FILES)):
        return []
    if isinstance(storage, str) and trust.gave("hydra.sweeper.storage", raw):
        return []
    return [
        Problem(
            "hydra.sweeper.storage",
            storage,
            "expected sqlite:///FILE or journal:///FILE (a study kept in a file) or null; a "
            "config may not send a study to a database server: pass hydra.sweeper.storage=URL "
            "on your command line, or set TFRECIPE_SWEEP_STORAGE",
        )
    ]


def _raw(node: DictConfig, key: str) -> Any:
    """`key` of Hydra's node as written (an interpolation unresolved)."""
    value: Any = OmegaConf.to_container(node, resolve=False)
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _search_space_problems(search_space: Any, grants: Grants) -> list[Problem]:
    """The optuna sweeper calls `custom_search_space` with the trial: the user's own function."""
    from tfrecipe.config.instantiate import under_prefix

    if search_space is None or under_prefix(str(search_space), grants.prefixes):
        return []
    return [
        Problem(
            "hydra.sweeper.custom_search_space",
            search_space,
            f"expected your own function under allowed_targets={list(grants.prefixes)}",
        )
    ]


def _launcher_shell_problems(launcher: Mapping[str, Any], trust: Trust) -> list[Problem]:
    """A launcher's shell settings, each value as written (before interpolation), must be the
    command line's: a recipe cannot know your cluster, and must not run commands on it."""
    problems = []
    for name in LAUNCHER_SHELL_KEYS:
        key = f"hydra.launcher.{name}"
        for path, value in _leaves(launcher.get(name), key):
            if not trust.gave(path, value):
                problems.append(
                    Problem(
                        path,
                        value,
                        "reaches the shell of every SLURM job, so only your command line may "
                        f"set it, not a config file; pass {key}=... yourself if you mean it",
                    )
                )
    return problems


def _leaves(value: Any, key: str) -> Iterable[tuple[str, Any]]:
    """(key, value) of each setting in `value`: a mapping's entries apart, anything else whole."""
    if isinstance(value, Mapping):
        for name, item in value.items():
            yield from _leaves(item, f"{key}.{name}")
    elif value not in (None, [], ""):
        yield key, value
