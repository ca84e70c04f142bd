"""The configs a sweep (or a run from a user's own config dir) would run, composed as Hydra
composes them, so the pre-check can check each one before Hydra starts anything.

Hydra composes the sweep's own config first (it configures logging and instantiates the sweeper
and launcher from it), then each job's: the command line's overrides plus the sweeper's
`hydra.sweeper.params`, a config file's part of the sweep, one value of each sweep at a time.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, flag_override

from tfrecipe.config.trust import Trust
from tfrecipe.errors import ConfigError, Problem


def sweep_problems(
    args, trust: Trust, task_function: Callable
) -> tuple[list[Problem], list[tuple[DictConfig, Path | None]]]:
    """Checks the sweep's own config and every job's, as a single run's config is checked
    (`config_problems`, with the same trust): what a run refuses, a sweep and `validate` refuse.
    The rest of a job's config (the schema, the rules across sections) is refused here where
    every job has the same problem, since no job could run; a problem of some jobs only fails
    those jobs when they run, and the sweep goes on. Returns the problems and the (config,
    directory) pairs checked: the sweep's first, then its jobs'."""
    from tfrecipe.config.checks import config_problems
    from tfrecipe.config.schema import environment_problems

    problems: list[Problem] = []
    composed = []
    jobs_problems = []
    for cfg, output_dir in hydra_configs(args, task_function):
        composed.append((cfg, output_dir))
        job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
        try:
            container = OmegaConf.to_container(job, resolve=True, throw_on_missing=False)
        except Exception:  # the job reports its own bad interpolation; check what is written
            container = OmegaConf.to_container(job, resolve=False)
        found = config_problems(container, cfg.hydra, trust=trust, output_dir=output_dir)
        found += environment_problems(container, os.environ)  # the store the jobs log to
        problems += [p for p in found if p not in problems]
        if len(composed) > 1:  # a job's config (the first is the sweep's own)
            jobs_problems.append(_schema_problems(job, trust))
        else:
            problems += _optuna_problems(cfg)
    shared = (
        [p for p in jobs_problems[0] if all(p in j for j in jobs_problems)] if jobs_problems else []
    )
    return problems + [p for p in shared if p not in problems], composed


def _optuna_problems(sweep: DictConfig) -> list[Problem]:
    """What Optuna itself would refuse of the optuna sweeper's settings (its pruner's)."""
    from tfrecipe.config.hydra_node import OPTUNA_SWEEPER

    if OmegaConf.select(sweep, "hydra.sweeper._target_", default=None) != OPTUNA_SWEEPER:
        return []
    from tfrecipe.tracking.optuna_trial import pruner_problems

    pruner = OmegaConf.select(sweep, "hydra.sweeper.pruner", default=None)
    return pruner_problems(OmegaConf.to_container(pruner, resolve=True) if pruner else None)


def _schema_problems(job: DictConfig, trust: Trust) -> list[Problem]:
    """What the schema and the rules across sections refuse in a job's config (its own run
    would refuse the same), as `schema.validate` finds it."""
    from tfrecipe.config.schema import validate

    try:
        validate(job, trust=trust)
    except ConfigError as error:
        return error.problems
    return []


def hydra_configs(args, task_function: Callable) -> Iterator[tuple[DictConfig, Path | None]]:
    """(config with Hydra's node, the directory its job writes to) of the sweep itself and of
    every job it would run, in order; for a single run (a user's config dir), that run's."""
    from hydra.types import RunMode

    with _hydra(args, task_function) as hydra:

        def compose(overrides: list[str], run_mode: RunMode) -> DictConfig:
            return hydra.compose_config(
                args.config_name or "config",
                list(overrides),
                run_mode=run_mode,
                with_log_configuration=False,
                validate_sweep_overrides=False,
            )

        sweep = compose(args.overrides, RunMode.MULTIRUN)
        if not (args.multirun or OmegaConf.select(sweep, "hydra.mode") == RunMode.MULTIRUN):
            run = compose(args.overrides, RunMode.RUN)
            yield run, _directory(run, "hydra.run.dir")
            return
        yield sweep, _directory(sweep, "hydra.sweep.dir")
        for number, overrides in enumerate(_jobs(sweep, args.overrides, hydra.config_loader)):
            job = compose(overrides, RunMode.RUN)
            OmegaConf.copy_cache(from_config=sweep, to_config=job)  # one ${now:...}, as Hydra's
            with flag_override(job, ["struct", "readonly"], [False, False]):
                job.hydra.job.num = number  # what Hydra's launchers set: the job's subdir
            yield job, _directory(job, "hydra.sweep.dir", "hydra.sweep.subdir")


def _jobs(sweep: DictConfig, command_line: list[str], config_loader) -> Iterator[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper makes them: the product of every discrete
    sweep's values, the command line's winning over `hydra.sweeper.params` (and optuna's older
    spelling, `hydra.sweeper.search_space`) for the same key. An `interval(...)` (optuna) picks
    numbers, which name no code: its key gets one it may pick; a numeric `search_space`
    distribution's keeps its value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from tfrecipe.cli.optuna_space import interval_problem

    sweeper = OmegaConf.to_container(sweep.hydra.sweeper, resolve=False)
    params = sweeper.get("params") or {}
    lines = [f"{key}={_param(key, value)}" for key, value in params.items()]
    axes = {
        key: axis
        for key, spec in (sweeper.get("search_space") or {}).items()
        if (axis := _search_space_axis(key, spec))
    }
    parser = OverridesParser.create(config_loader=config_loader)  # glob(...) lists options
    for override in parser.parse_overrides([*lines, *command_line]):
        key = override.get_key_element()
        if not override.is_sweep_override():
            axes[key] = [override.input_line]
        elif override.is_discrete_sweep():
            axes[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        elif override.is_interval_sweep():
            if problem := interval_problem(override):
                raise ConfigError(problem)
            axes[key] = [f"{key}={_inside(override.value())!r}"]  # a number it may pick
        else:
            axes.pop(key, None)
    for job in itertools.product(*axes.values()):
        yield list(job)


def _inside(interval) -> float | int:
    """A number an `interval(a,b)` may pick, of its type (its middle): what a job's key gets, so
    that a key the config lacks, or a number it refuses, is found before the sweep starts."""
    middle = (interval.start + interval.end) / 2
    return int(middle) if isinstance(interval.start, int) else middle


def fixed_overrides(overrides: list[str]) -> list[str]:
    """The overrides that sweep nothing (not `a,b`, `range(...)`, `interval(...)`, ...): what
    every job of a sweep typed on a command line shares."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [override.input_line for override in parsed if not override.is_sweep_override()]


def _param(key: str, value: object) -> str:
    """A `hydra.sweeper.params` entry: an override value, as basic and optuna sweepers take."""
    if not isinstance(value, str | int | float):
        raise ConfigError(
            Problem(
                f"hydra.sweeper.params.{key}",
                value,
                "expected an override value (e.g. 0.1,0.3 or choice(a,b) or interval(0,1)), "
                "as the basic and optuna sweepers take",
            )
        )
    return str(value)


# Optuna's `search_space` distributions: a categorical one names values, the others numbers.
_NUMERIC_DISTRIBUTIONS = ("int", "float")


def _search_space_axis(key: str, spec: object) -> list[str]:
    """The overrides a `hydra.sweeper.search_space` entry hands its jobs, as optuna writes them
    (`f"{key}={choice}"`, unquoted: a choice "[x]" reaches the job as a list); none for a
    numeric distribution, which picks numbers."""
    where = f"hydra.sweeper.search_space.{key}"
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind in _NUMERIC_DISTRIBUTIONS:
        bounds = [spec.get(k) for k in ("low", "high", "step") if spec.get(k) is not None]
        if all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds):
            return []
        raise ConfigError(Problem(where, bounds, "expected numbers for low, high and step"))
    choices = spec.get("choices") if kind == "categorical" else None
    primitive = str | int | float | bool | type(None)
    if not isinstance(choices, list) or not all(isinstance(c, primitive) for c in choices):
        raise ConfigError(
            Problem(
                where,
                spec,
                "expected {type: categorical, choices: [plain values]} or {type: int|float, "
                "low: N, high: N} (optuna's search_space); or use hydra.sweeper.params",
            )
        )
    return [f"{key}={choice}" for choice in choices]


def _directory(cfg: DictConfig, *keys: str) -> Path | None:
    """The job's directory (`hydra.runtime.output_dir` once it runs); None: it does not resolve."""
    with contextlib.suppress(Exception):
        parts = [str(OmegaConf.select(cfg, key, throw_on_missing=True)) for key in keys]
        return Path(*parts).absolute()
    return None


@contextlib.contextmanager
def _hydra(args, task_function: Callable):
    """Hydra, set up for `args` (its config dir and path) as `hydra.main` sets it up."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
    )
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    from tfrecipe.config.compose import config_dir

    search_path = create_automatic_config_search_path(
        *detect_calling_file_or_module_from_task_function(task_function),
        args.config_path or str(config_dir()),
    )
    if args.config_dir is not None:
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(args.config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    GlobalHydra.instance().clear()
    try:
        yield Hydra.create_main_hydra2(task_name="tfrecipe", config_search_path=search_path)
    finally:
        GlobalHydra.instance().clear()
