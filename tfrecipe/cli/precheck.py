"""Before Hydra creates anything: a single run's config composed and validated (without
TensorFlow), its table's columns checked against the files' headers, its run directory checked,
locked and pinned; a sweep's config and every job's checked, and its directory pinned.

A user's mistake so ends with exit code 2 and one line per problem, and leaves no half-written
run directory behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from tfrecipe.errors import ConfigError, Problem


@dataclasses.dataclass
class Invocation:
    """What the pre-check learned about one invocation of the training command: where its run
    writes (to clean up after a late config error), its cluster, a sweep's plan.

    Attributes:
      run_dir: a single run's pinned run dir (None: a sweep, or a user's config dir).
      run_dir_existed: whether it was there before this invocation.
      made_manifest: this invocation began the run dir's manifest (tfrecipe.files).
      cluster: a single run's validated `cluster` config (schema.Cluster).
      sweep: a sweep's plan (sweep_report.SweepSetup): where it writes, what picks its best.
    """

    run_dir: Path | None = None
    run_dir_existed: bool = True
    made_manifest: bool = False
    cluster: Any = None
    sweep: Any = None


def precheck(argv: list[str], invocation: Invocation) -> list[str]:
    """Composes and validates the config; pins a single run's run dir or a sweep's dir (filling
    `invocation` as it learns). Returns Hydra's argv."""
    from hydra._internal.utils import get_args_parser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from tfrecipe.config.compose import compose
    from tfrecipe.config.trust import Trust

    args = get_args_parser().parse_args(argv)
    _refuse_rerun(args)
    if args.help or args.hydra_help or args.info or args.cfg or args.shell_completion:
        return argv  # Hydra answers these
    trust = Trust.from_command_line(args.overrides)
    # This process's jobs (and a sweep's, in other processes) validate with it: nothing else
    # they read grants anything (tfrecipe/config/trust.py).
    os.environ.update(trust.environ())
    if not (args.multirun or args.config_path or args.config_dir or args.config_name):
        cfg = compose(args.overrides, return_hydra_config=True)
        if OmegaConf.select(cfg, "hydra.mode") != RunMode.MULTIRUN:  # a config file's sweep
            return [*argv, *_check_single_run(cfg, trust, invocation)]
    # each job validates itself again, with this trust
    return _pin_sweep_dir(args, argv, _check_hydra_configs(args, trust), invocation)


def _check_single_run(cfg, trust, invocation: Invocation) -> list[str]:
    """Validates a single run's config and holds its run dir. Returns the overrides that pin
    it: the dir just checked (`${now:...}` would otherwise be evaluated again), and for a task
    of a cluster other than its chief, no `.hydra/` of its own (the chief's Hydra saves the
    run's: tasks that start first would otherwise make the shared dir look like another's)."""
    from omegaconf import OmegaConf

    from tfrecipe.config.schema import validate
    from tfrecipe.distribute.cluster import check_environment, is_chief_task

    run = validate(cfg, trust=trust, environment=True)
    if not OmegaConf.select(cfg, "hydra.job.chdir", default=False):  # else paths are the job's
        _check_table_columns(run.dataset)  # reads the headers: still no TensorFlow
    invocation.cluster = run.cluster
    check_environment(run.cluster)  # e.g. a bad TF_CONFIG, before any run dir exists
    run_dir = _configured_run_dir(cfg)
    invocation.run_dir, invocation.run_dir_existed = run_dir, run_dir.exists()
    chief = is_chief_task(run.cluster.name)
    invocation.made_manifest = _hold_run_dir(run_dir, cfg, run, chief=chief)
    pins = [f"hydra.run.dir={_quote(str(run_dir))}"]
    return pins if chief else [*pins, "hydra.output_subdir=null"]


def _check_table_columns(dataset) -> None:
    """A table's (dataset=csv, dataset=parquet) columns, named in the config, are in its files:
    the line training would give, read from the headers before TensorFlow is imported."""
    from tfrecipe.data.table_layout import check_table

    try:
        check_table(dataset.target, dataset.model_dump(by_alias=True))
    except ValueError as error:
        raise ConfigError(Problem("dataset", hint=str(error))) from None


def _configured_run_dir(cfg) -> Path:
    from omegaconf import OmegaConf

    configured = OmegaConf.select(cfg, "hydra.run.dir")
    if not str(configured).strip():  # Path("") is the current directory
        raise ConfigError(
            f"hydra.run.dir={configured!r}: empty, which would train into the current "
            "directory; name a run directory (hydra.run.dir=outputs/NAME, or . on purpose)"
        )
    run_dir = Path(configured).absolute()
    _check_writable(run_dir)
    return run_dir


def _hold_run_dir(run_dir: Path, cfg, run, *, chief: bool) -> bool:
    """Locks the run dir, checks it is fresh (or resumable, unchanged) and claims Hydra's files
    there. `chief`: this process writes the run dir (not another task of its cluster). Returns
    whether this invocation began the dir's manifest."""
    from omegaconf import OmegaConf

    from tfrecipe.fault.preemption import stop_if_signalled
    from tfrecipe.outcome import ensure_fresh_run_dir
    from tfrecipe.rundir import RunFiles

    if run.cluster.name in ("none", "local") or (
        run.cluster.name in ("tf_config", "k8s") and chief
    ):  # the one process of the run (the launcher for local); a SLURM chief locks in train()
        RunFiles(run_dir).lock()  # before judging it: the run there may end meanwhile
    # Only the chief judges the shared run dir: another worker may look after the chief has
    # begun writing it.
    ensure_fresh_run_dir(run_dir, resume=run.resume if chief else "auto")
    if not chief:
        stop_if_signalled()
        return False  # writes nothing there before train(), not even `.hydra/`
    from tfrecipe.config.changes import Resuming, check_resume_unchanged
    from tfrecipe.rundir import public_config

    job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    check_resume_unchanged(run_dir, public_config(job), Resuming.of(run))
    stop_if_signalled()  # a signal while it started: recorded in the run dir now held
    return _claim_hydra_files(run_dir)  # every check passed: Hydra writes there next


def _claim_hydra_files(run_dir: Path) -> bool:
    """Hydra writes `.hydra/` into the run dir next: one the user put there (no run's files
    beside it) is refused; otherwise it becomes the run's own (tfrecipe/files.py's manifest).
    Returns whether this began the run dir's manifest."""
    from tfrecipe import files

    hydra_files = run_dir / ".hydra"
    ours = any((run_dir / marker).exists() for marker in files.RUN_MARKERS)
    if hydra_files.exists() and not ours:
        raise ConfigError(
            f"hydra.run.dir={run_dir}: holds .hydra/ but no summary.json, so it is not a tfrecipe "
            "run dir and Hydra would overwrite it; choose a new or empty hydra.run.dir"
        )
    if not files.Manifest.of(run_dir).held():
        return False
    began = not (run_dir / files.MANIFEST).exists()
    files.Manifest.of(run_dir).claim([".hydra"])
    return began


def _refuse_rerun(args) -> None:
    """Hydra's `--experimental-rerun FILE` unpickles FILE (a run dir's `.hydra/config.pickle`):
    whoever wrote that file would run code here."""
    if args.experimental_rerun is not None:
        raise ConfigError(
            f"--experimental-rerun={args.experimental_rerun}: not supported (Hydra would "
            "unpickle that file, which runs any code it holds); rerun a run with the overrides "
            "in its .hydra/overrides.yaml instead"
        )


def _check_writable(run_dir: Path) -> None:
    existing = run_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"hydra.run.dir={run_dir}: cannot create the run directory ({existing} is not a "
            "writable directory); choose a writable hydra.run.dir"
        )


def _check_hydra_configs(args, trust) -> list:
    """Checks the sweep's own config and every job's (`sweeps.sweep_problems`) before Hydra
    configures logging, instantiates its sweeper, launcher or callbacks, or starts a job.
    Returns the (config, directory) pairs checked: the sweep's first, then its jobs'."""
    from tfrecipe.cli.job import task
    from tfrecipe.cli.sweeps import sweep_problems

    problems, composed = sweep_problems(args, trust, task)
    if problems:
        raise ConfigError(problems)
    return composed


def _pin_sweep_dir(args, argv: list[str], composed: list, invocation: Invocation) -> list[str]:
    """A sweep's argv with its `hydra.sweep.dir` resolved once (`${now:...}` would otherwise be
    evaluated again by Hydra), and its plan kept for the report that ends it (sweep.json)."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from tfrecipe.cli.sweep_report import plan_from
    from tfrecipe.tracking.hparams import SWEEP_KEYS_ENV

    sweep_cfg, sweep_dir = composed[0]
    multirun = args.multirun or OmegaConf.select(sweep_cfg, "hydra.mode") == RunMode.MULTIRUN
    if not multirun or sweep_dir is None:
        return argv  # a single run from a user's config dir, or a dir only a job resolves
    _refuse_locked_sweep_dir(sweep_dir)
    claim_sweep_dir(sweep_dir)
    command = ["python", "-m", "tfrecipe"]
    for flag, value in (
        ("--config-path", args.config_path),
        ("--config-dir", args.config_dir),
        ("--config-name", args.config_name),
    ):
        command += [flag, value] if value else []
    first_job = composed[1][0] if len(composed) > 1 else sweep_cfg
    # What TensorBoard's HParams view shows of each job (jobs inherit the environment).
    os.environ[SWEEP_KEYS_ENV] = json.dumps(_swept_keys(args, sweep_cfg, composed[1:]))
    invocation.sweep = plan_from(first_job, sweep_dir, command=command, run_mode=not args.multirun)
    return [*argv, f"hydra.sweep.dir={_quote(str(sweep_dir))}"]


def _refuse_locked_sweep_dir(sweep_dir: Path) -> None:
    """A run training into `sweep_dir` holds its lock: Hydra's multirun.yaml and tfrecipe's
    sweep.json would land among that run's files. Refused before Hydra writes anything."""
    from tfrecipe.rundir import RunFiles

    if RunFiles(sweep_dir).in_use_by_another():
        raise ConfigError(
            f"hydra.sweep.dir={sweep_dir}: a run trains into it (its run dir is locked); a "
            "sweep writes multirun.yaml and sweep.json there. Choose another hydra.sweep.dir"
        )


def claim_sweep_dir(sweep_dir: Path) -> None:
    """Makes `sweep_dir` the sweep's: its records (`SWEEP_RECORDS`) listed on its manifest
    (files.MANIFEST) before Hydra writes multirun.yaml, so that a rerun resumes there. A file of
    those names that no tfrecipe sweep wrote (in a folder of the user's that a recipe's
    `hydra.sweep.dir` names) is refused, as a run dir's are, before anything is written."""
    from tfrecipe import files
    from tfrecipe.cli.sweep_report import SWEEP_FILE, SWEEP_RECORDS

    manifest = files.Manifest.of(sweep_dir)
    if not (sweep_dir / SWEEP_FILE).is_file():  # else a sweep's (an earlier one kept no manifest)
        owned = manifest.owned()
        theirs = [n for n in SWEEP_RECORDS if os.path.lexists(sweep_dir / n) and n not in owned]
        if theirs:
            raise ConfigError(
                f"hydra.sweep.dir={sweep_dir}: holds {', '.join(theirs)}, not written by a "
                f"tfrecipe sweep (not in its {files.MANIFEST}); tfrecipe never replaces a file it "
                "did not create: move them, or choose another hydra.sweep.dir"
            )
    sweep_dir.mkdir(parents=True, exist_ok=True)
    manifest.claim(SWEEP_RECORDS)


def _swept_keys(args, sweep_cfg, jobs: list) -> list[str]:
    """The keys a sweep varies: those whose value differs between the jobs composed before it
    starts, and those an optimizing sweeper samples (`interval(...)`, `hydra.sweeper.params`)."""
    from omegaconf import OmegaConf

    overrides = [OmegaConf.select(cfg, "hydra.overrides.task", default=[]) for cfg, _ in jobs]
    pairs = [dict(str(o).split("=", 1) for o in job if "=" in str(o)) for job in overrides]
    keys = dict.fromkeys(key for job in pairs for key in job)
    varied = [key for key in keys if len({job.get(key) for job in pairs}) > 1]
    params = OmegaConf.select(sweep_cfg, "hydra.sweeper.params", default=None) or {}
    sampled = [o.split("=", 1)[0] for o in args.overrides if "interval(" in o.split("=", 1)[-1]]
    return list(dict.fromkeys([*varied, *map(str, params), *sampled]))


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
