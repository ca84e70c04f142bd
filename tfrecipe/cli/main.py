"""The command line: `tfrecipe [overrides]` / `python -m tfrecipe [overrides]`.

A thin shim around Hydra. Before Hydra creates anything, a plain run composes and validates its
config (without TensorFlow) and checks the run directory, so a user's mistake ends with exit
code 2 and one line per problem, and leaves no half-written run directory behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

from tfrecipe.errors import ConfigError, DataError
from tfrecipe.outcome import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    EXIT_TRAINING,
    TrainingError,
    ensure_fresh_run_dir,
)

log = logging.getLogger("tfrecipe")

# A file each sweep job appends a line to (its run dir, overrides, status, main metrics): jobs may
# run in other processes (the joblib launcher's workers), where this process's memory cannot see
# them.
SWEEP_JOBS_ENV = "TFRECIPE_SWEEP_JOBS"


class _Invocation:
    """What the pre-check learned about this run, for cleaning up after a late config error."""

    run_dir: Path | None = None
    run_dir_existed: bool = True
    job_dir: Path | None = None  # the dir Hydra made for the job (also when nothing pre-checked)
    made_manifest: bool = False  # this invocation began the run dir's manifest (tfrecipe.files)
    cluster = None  # the validated `cluster` config of a single run (schema.Cluster)
    sweep = None  # a sweep's plan (sweep_report.SweepPlan): where it writes, what picks its best


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _precheck(argv: list[str]) -> list[str]:
    """Composes and validates a single run's config; pins its run dir. Returns Hydra's argv."""
    from hydra._internal.utils import get_args_parser
    from hydra.types import RunMode

    from tfrecipe.config.trust import Trust

    args = get_args_parser().parse_args(argv)
    _refuse_rerun(args)
    informational = args.help or args.hydra_help or args.info or args.cfg or args.shell_completion
    custom_config = args.config_path or args.config_dir or args.config_name
    if informational:
        return argv  # Hydra answers these
    trust = Trust.from_command_line(args.overrides)
    # This process's jobs (and a sweep's, in other processes) validate with it: nothing else
    # they read grants anything (tfrecipe/config/trust.py).
    os.environ.update(trust.environ())
    if args.multirun or custom_config:
        # each job validates itself again, with this trust
        return _pin_sweep_dir(args, argv, _check_hydra_configs(args, trust))

    from omegaconf import OmegaConf

    from tfrecipe.config.compose import compose
    from tfrecipe.config.schema import validate
    from tfrecipe.rundir import lock_run_dir

    cfg = compose(args.overrides, return_hydra_config=True)
    if OmegaConf.select(cfg, "hydra.mode") == RunMode.MULTIRUN:  # a config file asks for a sweep
        return _pin_sweep_dir(args, argv, _check_hydra_configs(args, trust))
    from tfrecipe.distribute.cluster import check_environment, is_chief_process

    run = validate(cfg, trust=trust)
    _Invocation.cluster = run.cluster
    check_environment(_Invocation.cluster)  # e.g. a bad TF_CONFIG, before any run dir exists
    configured = OmegaConf.select(cfg, "hydra.run.dir")
    if not str(configured).strip():  # Path("") is the current directory
        raise ConfigError(
            f"hydra.run.dir={configured!r}: empty, which would train into the current "
            "directory; name a run directory (hydra.run.dir=outputs/NAME, or . on purpose)"
        )
    run_dir = Path(configured).absolute()
    _check_writable(run_dir)
    _Invocation.run_dir, _Invocation.run_dir_existed = run_dir, run_dir.exists()
    if run.cluster.name in ("none", "local") or (
        run.cluster.name in ("tf_config", "k8s") and is_chief_process()
    ):  # the one process of the run (the launcher for local); a SLURM chief locks in train()
        lock_run_dir(run_dir)  # before judging it: the run there may end meanwhile
    # Only the chief judges the shared run dir: another worker may look after the chief has
    # begun writing it.
    ensure_fresh_run_dir(run_dir, resume=run.resume if is_chief_process() else "auto")
    if is_chief_process():
        from tfrecipe.config.changes import check_resume_unchanged
        from tfrecipe.rundir import public_config

        job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
        check_resume_unchanged(
            run_dir, public_config(job), resume=run.resume, allowed=run.resume_allow_changes
        )
    from tfrecipe.fault.preemption import stop_if_signalled

    stop_if_signalled()  # a signal while it started: recorded in the run dir now held
    _claim_hydra_files(run_dir)  # every check passed: Hydra writes there next
    # Pin the directory just checked (`${now:...}` would otherwise be evaluated again).
    return [*argv, f"hydra.run.dir={_quote(str(run_dir))}"]


def _claim_hydra_files(run_dir: Path) -> None:
    """Hydra writes `.hydra/` into the run dir next: one the user put there (no run's files
    beside it) is refused; otherwise it becomes the run's own (tfrecipe/files.py's manifest)."""
    from tfrecipe import files

    hydra_files = run_dir / ".hydra"
    ours = any((run_dir / marker).exists() for marker in files.RUN_MARKERS)
    if hydra_files.exists() and not ours:
        raise ConfigError(
            f"hydra.run.dir={run_dir}: holds .hydra/ but no summary.json, so it is not a tfrecipe "
            "run dir and Hydra would overwrite it; choose a new or empty hydra.run.dir"
        )
    if files.is_held(run_dir):
        _Invocation.made_manifest = not (run_dir / files.MANIFEST).exists()
        files.claim(run_dir, [".hydra"])


def _refuse_rerun(args) -> None:
    """Hydra's `--experimental-rerun FILE` unpickles FILE (a run dir's `.hydra/config.pickle`):
    whoever wrote that file would run code here."""
    if args.experimental_rerun is not None:
        raise ConfigError(
            f"--experimental-rerun={args.experimental_rerun}: not supported (Hydra would "
            "unpickle that file, which runs any code it holds); rerun a run with the overrides "
            "in its .hydra/overrides.yaml instead"
        )


def _pin_sweep_dir(args, argv: list[str], composed: list) -> list[str]:
    """A sweep's argv with its `hydra.sweep.dir` resolved once (`${now:...}` would otherwise be
    evaluated again by Hydra), and its plan kept for the report that ends it (sweep.json)."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from tfrecipe.cli.sweep_report import plan_from

    sweep_cfg, sweep_dir = composed[0]
    multirun = args.multirun or OmegaConf.select(sweep_cfg, "hydra.mode") == RunMode.MULTIRUN
    if not multirun or sweep_dir is None:
        return argv  # a single run from a user's config dir, or a dir only a job resolves
    command = ["python", "-m", "tfrecipe"]
    for flag, value in (("--config-path", args.config_path), ("--config-dir", args.config_dir),
                        ("--config-name", args.config_name)):  # fmt: skip
        command += [flag, value] if value else []
    first_job = composed[1][0] if len(composed) > 1 else sweep_cfg
    from tfrecipe.tracking.hparams import SWEEP_KEYS_ENV

    # What TensorBoard's HParams view shows of each job (jobs inherit the environment).
    os.environ[SWEEP_KEYS_ENV] = json.dumps(_swept_keys(args, sweep_cfg, composed[1:]))
    _Invocation.sweep = plan_from(first_job, sweep_dir, command=command,
                                  run_mode=not args.multirun)  # fmt: skip
    return [*argv, f"hydra.sweep.dir={_quote(str(sweep_dir))}"]


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


def _check_hydra_configs(args, trust) -> list:
    """Checks the sweep's own config and every job's (`sweeps.sweep_problems`) before Hydra
    configures logging, instantiates its sweeper, launcher or callbacks, or starts a job.
    Returns the (config, directory) pairs checked: the sweep's first, then its jobs'."""
    from tfrecipe.cli.sweeps import sweep_problems

    problems, composed = sweep_problems(args, trust, _task)
    if problems:
        raise ConfigError(problems)
    return composed


def _check_writable(run_dir: Path) -> None:
    existing = run_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"hydra.run.dir={run_dir}: cannot create the run directory ({existing} is not a "
            "writable directory); choose a writable hydra.run.dir"
        )


class _ConfigErrorInJob(BaseException):
    """A ConfigError raised inside the Hydra job, carried past Hydra's job runner (which catches
    Exception and prints its own "Error executing job" line) to `main`'s one-line report."""

    def __init__(self, error: ConfigError):
        super().__init__(str(error))
        self.error = error


def _task(cfg) -> dict:
    """The Hydra task: one training run in Hydra's output directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from tfrecipe.cli.console import discover_devices
    from tfrecipe.cli.display import metrics_line, print_config, shows_config
    from tfrecipe.config.secrets import redact_logs

    redact_logs()  # Hydra's console and log file, as configured for this job
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    _Invocation.job_dir = run_dir
    # A log file that cannot be written (a full disk) must not turn every log line into a
    # traceback on the console, which still shows each line.
    logging.raiseExceptions = False
    sweeping = HydraConfig.get().mode == RunMode.MULTIRUN
    from tfrecipe.distribute.cluster import is_chief_process

    shown = shows_config(
        cfg.get("print_config", "auto"),
        sweeping=sweeping,
        verbose=cfg.loop.get("verbose", "auto"),
        terminal=sys.stdout.isatty(),
    )
    if shown and is_chief_process():  # the other tasks of a cluster run the same config
        print_config(cfg)
    from tfrecipe.fault.preemption import Preempted, hand_over_to_submitit, stop_if_signalled

    try:
        stop_if_signalled()
        discover_devices()  # imports TensorFlow: seconds
        stop_if_signalled()
        from tfrecipe.config.trust import Trust
        from tfrecipe.train import train

        summary = train(cfg, run_dir=run_dir, trust=Trust.of_this_process())
    except Preempted as preempted:
        _mark_preempted(run_dir, preempted)  # when it came before train() could
        log.warning("%s\nrun dir: %s", preempted, run_dir)
        hand_over_to_submitit(preempted)  # a submitit job: requeued, and exits
        raise SystemExit(EXIT_PREEMPTED) from None
    except Exception as error:
        if isinstance(error, ConfigError) and not sweeping:
            raise _ConfigErrorInJob(error) from None
        _record_failure(run_dir, error)
        if not sweeping or cfg.sweep.fail_fast:
            code = EXIT_CONFIG if isinstance(error, ConfigError | DataError) else EXIT_TRAINING
            raise SystemExit(code) from None
        _note_job(run_dir, "failed", {})
        return float("nan")
    positive = summary.get("positive_class")  # binary: the class auc, precision, recall are of
    from tfrecipe.perf.report import perf_words

    log.info(
        "done: %s in %.1fs; test%s %s; %s%srun dir: %s",
        summary["status"],
        summary["wall_time_s"],
        f" (positive class {positive})" if positive is not None else "",
        metrics_line(summary["test"]),
        perf_words(summary.get("perf")),
        "; " if summary.get("perf") else "",
        run_dir,
    )
    if summary.get("baselines"):  # where the model stands against them: the last lines
        from tfrecipe.training.baselines import lines

        log.info("\n".join(lines(summary["baselines"], summary["test"])))
    if sweeping:
        _note_job(run_dir, summary["status"], _main_metrics(summary, cfg.sweep.objective))
    return _objective(summary, cfg.sweep.objective)


def _main_metrics(summary: dict, objective: str) -> dict[str, float | None]:
    """What the table at the end of a sweep shows of a job: the objective the sweep optimizes
    and the test split's first metric (test_accuracy, test_mae, ...)."""
    from tfrecipe.rundir import summary_value

    tested = [f"test_{name}" for name in summary.get("test") or {} if name != "loss"]
    return {name: summary_value(summary, name) for name in dict.fromkeys([objective, *tested[:1]])}


def _note_job(run_dir: Path, status: str, metrics: dict[str, float | None]) -> None:
    """Records a finished sweep job in SWEEP_JOBS_ENV's file."""
    import json

    from hydra.core.hydra_config import HydraConfig

    path = os.environ.get(SWEEP_JOBS_ENV)
    if not path:
        return
    job = HydraConfig.get()
    overrides = dict(o.split("=", 1) for o in job.overrides.task if "=" in o)
    record = {"job": job.job.num, "run_dir": str(run_dir), "overrides": overrides}
    line = json.dumps({**record, "status": status, "metrics": metrics})
    with open(path, "a") as jobs:  # one write per line, appended: jobs never interleave
        jobs.write(f"{line}\n")


@contextlib.contextmanager
def _sweep_jobs_file():
    """A fresh SWEEP_JOBS_ENV file for this invocation; yields a function reading its records."""
    import json
    import tempfile

    descriptor, path = tempfile.mkstemp(prefix="tfrecipe-sweep-jobs-", suffix=".jsonl")
    os.close(descriptor)
    os.environ[SWEEP_JOBS_ENV] = path
    try:
        yield lambda: [json.loads(line) for line in Path(path).read_text().splitlines()]
    finally:
        os.environ.pop(SWEEP_JOBS_ENV, None)
        Path(path).unlink(missing_ok=True)


def _objective(summary: dict, metric: str) -> float:
    """The value optimizing sweepers minimize/maximize (NaN when the run has no such metric)."""
    from tfrecipe.rundir import summary_value

    value = summary_value(summary, metric)
    return float("nan") if value is None else value


def _record_failure(run_dir: Path, error: Exception) -> None:
    """Says what failed: on the console, in traceback.txt and (for config errors, which stop
    before training writes one) in summary.json, so a sweep's failed job is visible."""
    from tfrecipe.config.secrets import redact_text
    from tfrecipe.distribute.cluster import is_chief_process
    from tfrecipe.rundir import SUMMARY, atomic_write, in_use_by_another, write_summary

    if not is_chief_process():  # the run dir is the chief's; a worker only says what failed
        log.error("%s failed: %s", os.environ.get("TF_CONFIG"), error)
        return
    if isinstance(error, DataError):  # a bad cell met while training: its one line
        log.error("tfrecipe: invalid data: %s\nrun dir: %s", error, run_dir)
        return
    if in_use_by_another(run_dir):  # a sweep job refused by the lock: that run's dir, log too
        print(error.report() if isinstance(error, ConfigError) else error, file=sys.stderr)
        return
    if isinstance(error, ConfigError):
        log.error("%s\nrun dir: %s", error.report(), run_dir)
        if not (run_dir / SUMMARY).exists():  # an unreadable one is not ours to replace
            with contextlib.suppress(OSError):
                write_summary(run_dir, {"status": "failed", "error": str(error)})
        return
    with contextlib.suppress(OSError):  # a full disk: summary.json says so, in its reserve
        atomic_write(run_dir / "traceback.txt", redact_text(traceback.format_exc()))
    from tfrecipe.fault.disk import error_text

    cause = error if isinstance(error, TrainingError) else error_text(error, run_dir)
    log.error(
        "training failed: %s\nrun dir: %s (summary.json and traceback.txt have the details)",
        cause,
        run_dir,
    )


def _hydra_errors() -> tuple[type[BaseException], ...]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return (HydraException, OmegaConfBaseException)


def _describe_hydra_error(error: BaseException) -> str:
    from hydra.errors import MissingConfigException

    if isinstance(error, MissingConfigException) and error.options is not None:
        group, _, option = (error.missing_cfg_file or "").rpartition("/")
        return (
            f"{group}={option}: unknown option for group '{group}'; available: "
            f"{', '.join(error.options)}"
        )
    # Hydra: "Could not override 'KEY'.\nTo append to your config use +KEY=VALUE"
    override = re.match(r"Could not override '([^']+)'.*use \+(\S+)", str(error), re.DOTALL)
    if override and "not in struct" in str(error.__cause__):
        from tfrecipe.config.schema import did_you_mean

        key, received = override.groups()
        suggestion = did_you_mean(key, getattr(error.__cause__, "parent_node", None) or [])
        to_add = f"to add a new key use +{key}=..."
        fix = f"{suggestion} (or {to_add})" if suggestion else to_add
        return f"{key}: unknown key (received {received}); {fix}"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # Hydra explains in several lines; keep the ones that say what is wrong.
    skip = ("full_key", "object_type", "Config search")
    useful = [line for line in lines if not line.startswith(skip)]
    return " ".join(useful[:3])


def main(argv: list[str] | None = None) -> None:
    """Entry point of `tfrecipe` and `python -m tfrecipe`; with no `argv` (the command line)
    it ends the process itself once everything is written (`_exit_fast`)."""
    if argv is None:
        try:
            _main(sys.argv[1:])
        except SystemExit as stop:
            _exit_fast(stop.code)
        _exit_fast(0)
    _main(argv)


def _exit_fast(code) -> None:
    """Ends a process that imported TensorFlow without its teardown (≈3 s of destructors on a
    small CPU, the same work the OS does at once), after what a normal exit keeps, in the
    interpreter's order: threading's exit hooks (they stop thread pools' idle workers:
    concurrent.futures, joblib's loky), other threads finished, atexit handlers (logging,
    W&B) run, output flushed."""
    if "tensorflow" not in sys.modules:
        raise SystemExit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    import atexit
    import threading

    # What Py_FinalizeEx calls first; joining the threads without it waits forever on an
    # executor nobody shut down (Python 3.11-3.13; tests/test_compat.py checks the name).
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def _main(argv: list[str]) -> None:
    argv = list(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter
    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors reach us: we report them, exit code 2

    if "--version" in argv:  # tfrecipe's, not Hydra's (which answers it otherwise)
        print(_version())
        return
    from tfrecipe.cli.commands import COMMANDS
    from tfrecipe.config.secrets import redact_text

    if argv[:1] == ["help"]:
        argv = ["--help", *argv[1:]]
    elif argv[:1] == ["lr-find"]:  # a run that is the learning-rate sweep only
        argv = [*argv[1:], "loop.lr_find.enabled=true", "loop.lr_find.only=true"]
    elif argv and "=" not in argv[0] and argv[0].endswith((".yaml", ".yml")):  # a recipe file
        argv = [f"recipe={argv[0]}", *argv[1:]]
    try:
        if argv and argv[0] in COMMANDS:
            from tfrecipe.fault.preemption import restore_default_stops

            restore_default_stops()  # only a training run records how it stopped
            COMMANDS[argv[0]](argv[1:])
        else:
            _run_hydra(argv)
    except (ConfigError, _ConfigErrorInJob) as error:
        _discard_new_run_dir()
        report = error.error.report() if isinstance(error, _ConfigErrorInJob) else error.report()
        print(redact_text(report), file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    except _hydra_errors() as error:
        _discard_new_run_dir()
        described = redact_text(_describe_hydra_error(error))
        print(f"tfrecipe: invalid configuration: {described}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    except KeyboardInterrupt:  # a second Ctrl-C
        print("tfrecipe: interrupted (Ctrl-C): stopped without a backup", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    except _preempted() as stopped:  # SIGTERM/Ctrl-C before training watched for them
        _record_stopped_start(stopped)
        raise SystemExit(EXIT_PREEMPTED) from None
    except BrokenPipeError:  # `tfrecipe ls | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None
    except OSError as error:
        _stop_on_a_full_disk(error)  # else not ours to explain
        raise


def _stop_on_a_full_disk(error: OSError) -> None:
    """A disk full before the run could start (Hydra writes `.hydra/` before tfrecipe's code
    runs): one line and summary.json status "failed" instead of Hydra's traceback, exit code 1.
    Returns (the caller re-raises) for any other OSError, or where no run dir was pinned."""
    from tfrecipe.fault.disk import is_disk_full, record_failed_start

    run_dir = _Invocation.job_dir or _Invocation.run_dir
    if run_dir is None or not is_disk_full(error) or not run_dir.is_dir():
        return
    try:
        line = record_failed_start(run_dir, error)
    except OSError:  # not even summary.json fits: the line alone
        line = f"tfrecipe: training failed: disk full: no space left in {run_dir}"
    print(line, file=sys.stderr)
    raise SystemExit(EXIT_TRAINING) from None


def _version() -> str:
    """`tfrecipe 0.1.0 (Hydra 1.3.2)`, from the installed packages' metadata (no imports)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        own = version("tfrecipe")
    except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        own = "unknown (not installed)"
    return f"tfrecipe {own} (Hydra {version('hydra-core')})"


def _preempted() -> type[Exception]:
    from tfrecipe.fault.preemption import Preempted

    return Preempted


def _record_stopped_start(stopped: Exception) -> None:
    """A run stopped by a signal before train() took over: summary.json says "preempted" when
    its run dir is known and held by this process (else there is no run yet to record)."""
    run_dir = _Invocation.job_dir or _Invocation.run_dir
    if run_dir is not None:
        _mark_preempted(run_dir, stopped)
    where = f"\nrun dir: {run_dir}" if run_dir is not None else ""
    print(f"tfrecipe: {stopped}{where}", file=sys.stderr)


def _mark_preempted(run_dir: Path, stopped: Exception) -> None:
    """summary.json says "preempted", unless it already tells how this run ended or the dir is
    not held by this process (a sweep job's before train() locks it)."""
    from tfrecipe.rundir import SUMMARY, holds_run_dir, read_summary, write_summary

    summary = read_summary(run_dir)
    if summary is None and (run_dir / SUMMARY).exists():
        return  # unreadable: not ours to replace (ensure_fresh_run_dir refuses such a dir)
    summary = summary or {}
    if holds_run_dir(run_dir) and summary.get("status") in (None, "running", "failed"):
        summary.update(status="preempted", error=f"Preempted: {stopped}")
        write_summary(run_dir, summary)


def _run_hydra(argv: list[str]) -> None:
    import hydra

    from tfrecipe.config.compose import config_dir, register_recipes

    register_recipes()
    if _answered_help(argv):
        return
    hydra_main = hydra.main(
        config_path=str(config_dir()), config_name="config", version_base="1.3"
    )(_task)
    from tfrecipe.config.trust import TRUST_ENV

    inherited = os.environ.pop(TRUST_ENV, None)  # this process's own command line decides
    try:
        _run_hydra_job(argv, hydra_main)
    finally:  # in-process callers (tests, notebooks) keep their environment as it was
        os.environ.pop(TRUST_ENV, None)
        if inherited is not None:
            os.environ[TRUST_ENV] = inherited


def _run_hydra_job(argv: list[str], hydra_main) -> None:
    from tfrecipe.config.compose import recipe_file_overrides

    sys.argv = [sys.argv[0], *_precheck(recipe_file_overrides(argv))]
    if _Invocation.cluster is not None and _Invocation.cluster.name == "local":
        from tfrecipe.distribute.launcher import run_local_cluster

        # The tasks get the user's own overrides (each registers a `recipe=PATH.yaml` itself) and
        # the pinned run dir.
        raise SystemExit(run_local_cluster([*argv, sys.argv[-1]], _Invocation.cluster))
    started = time.time()
    with _sweep_jobs_file() as sweep_jobs, _logging_config_errors():
        hydra_main()
        jobs = sweep_jobs()
    if _Invocation.sweep is not None and _Invocation.sweep.sweep_dir.is_dir():
        _report_sweep(_Invocation.sweep, argv, started)
    from tfrecipe.tracking.hparams import SWEEP_KEYS_ENV

    os.environ.pop(SWEEP_KEYS_ENV, None)  # this sweep's, set by _pin_sweep_dir
    failed = [job["run_dir"] for job in jobs if job["status"] == "failed"]
    if failed:
        print(f"tfrecipe: {len(failed)} sweep job(s) failed: {', '.join(failed)}", file=sys.stderr)
        raise SystemExit(EXIT_TRAINING)


def _report_sweep(plan, argv: list[str], started: float) -> None:
    """sweep.json, sweep.png and the table naming the best job (tfrecipe.cli.sweep_report),
    then the sweep's MLflow parent run closed with the winner, where jobs opened one."""
    from tfrecipe.cli.sweep_report import console_text, invocation, write_report

    report = write_report(plan, invocation=invocation(argv, started))
    print(console_text(report))
    from tfrecipe.tracking.mlflow_store import PARENT_FILE, RECORD_DIR, close_sweep

    if plan.mlflow_uri and (plan.sweep_dir / RECORD_DIR / PARENT_FILE).is_file():
        close_sweep(plan.sweep_dir, report, plan.mlflow_uri)


def _answered_help(argv: list[str]) -> bool:
    """Prints `--help` (tfrecipe fills Hydra's help template faster than Hydra; see
    commands.help_text). False where Hydra answers: a custom config dir, or a template that lists
    Hydra's own groups."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    if not args.help or args.config_path or args.config_dir or args.config_name:
        return False
    from tfrecipe.cli.commands import help_text

    text = help_text(args.overrides, resolve=args.resolve)
    if text is not None:
        print(text)
    return text is not None


@contextlib.contextmanager
def _logging_config_errors():
    """Hydra's logging config (`hydra.job_logging`, `hydra.hydra_logging`) is applied by
    `logging.config.dictConfig` inside Hydra: its ValueError becomes a config error."""
    try:
        yield
    except ValueError as error:
        frames = traceback.extract_tb(error.__traceback__)
        if not frames or not frames[-1].filename.endswith(os.path.join("logging", "config.py")):
            raise
        key = "job_logging" if any(f.name == "run_job" for f in frames) else "hydra_logging"
        cause = f" ({type(error.__cause__).__name__}: {error.__cause__})" if error.__cause__ else ""
        raise ConfigError(
            f"hydra.{key}: {error}{cause}; fix or remove that override (Hydra's logging config: "
            "https://hydra.cc/docs/configure_hydra/logging/)"
        ) from None


def _discard_new_run_dir() -> None:
    """A run that stopped on a config error leaves nothing behind, unless the dir was there."""
    run_dir = _Invocation.run_dir
    if run_dir is not None and not _Invocation.run_dir_existed and run_dir.exists():
        shutil.rmtree(run_dir, ignore_errors=True)
    elif _Invocation.job_dir is not None:
        _discard_hydra_files(_Invocation.job_dir)


def _discard_hydra_files(job_dir: Path) -> None:
    """The dir was there before, or nothing pre-checked it (--config-dir, --config-name): remove
    only what Hydra wrote for the job (and the manifest this invocation began), and the dir when
    that leaves it empty."""
    from tfrecipe import files

    shutil.rmtree(job_dir / ".hydra", ignore_errors=True)
    if _Invocation.made_manifest:
        (job_dir / files.MANIFEST).unlink(missing_ok=True)
    for log_file in job_dir.glob("*.log"):
        if log_file.stat().st_size == 0:
            log_file.unlink()
    with contextlib.suppress(OSError):
        job_dir.rmdir()
