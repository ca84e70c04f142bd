"""The training command, `tfrecipe [overrides]`: a thin shim around Hydra.

The pre-check (`cli.precheck`) composes and validates the config and pins the run dir; Hydra
then runs the job (`cli.job.task`): one run, a sweep's jobs, or a local cluster's launcher.
What stops the command before the job could say so itself is cleaned up here: a late config
error's new run dir, a signal's or a full disk's summary.json. `cli.main` turns what is raised
into the exit code.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from tfrecipe.cli import optuna_workers, sweep_jobs
from tfrecipe.cli.job import JobConfigError, mark_preempted, task
from tfrecipe.cli.precheck import Invocation, precheck
from tfrecipe.errors import ConfigError
from tfrecipe.outcome import EXIT_PREEMPTED, EXIT_TRAINING


def run(argv: list[str]) -> None:
    """Trains as the overrides in `argv` say (or prints `--help`).

    Raises:
      ConfigError: the config or the run dir is refused (nothing new is left behind).
      SystemExit: the run failed, a sweep job failed, or it was stopped (the exit code).
    """
    import hydra

    from tfrecipe.config.compose import config_dir, register_recipes
    from tfrecipe.config.trust import TRUST_ENV

    register_recipes()
    if _answered_help(argv):
        return
    hydra_main = hydra.main(
        config_path=str(config_dir()), config_name="config", version_base="1.3"
    )(task)
    inherited = os.environ.pop(TRUST_ENV, None)  # this process's own command line decides
    invocation = Invocation()
    try:
        with _cleaned_up(invocation), _secrets_redacted_from_cfg(argv):
            _run_hydra_job(argv, hydra_main, invocation)
    finally:  # in-process callers (tests, notebooks) keep their environment as it was
        os.environ.pop(TRUST_ENV, None)
        if inherited is not None:
            os.environ[TRUST_ENV] = inherited


def _run_hydra_job(argv: list[str], hydra_main, invocation: Invocation) -> None:
    from tfrecipe import printed
    from tfrecipe.config.compose import recipe_file_overrides
    from tfrecipe.config.secrets import typed_by_reference
    from tfrecipe.tracking.hparams import SWEEP_KEYS_ENV

    printed.redact_log_records(printed.typed_secrets(argv))  # Hydra logs each job's overrides
    # What Hydra, the launchers and a local cluster's tasks record holds no typed secret.
    typed = typed_by_reference(argv, os.environ)
    sys.argv = [sys.argv[0], *precheck(recipe_file_overrides(typed), invocation)]
    if invocation.cluster is not None and invocation.cluster.name == "local":
        from tfrecipe.distribute.launcher import run_local_cluster

        # The tasks get the user's own overrides (each registers a `recipe=PATH.yaml` itself) and
        # the pinned run dir.
        raise SystemExit(run_local_cluster([*typed, sys.argv[-1]], invocation.cluster))
    started = time.time()
    with sweep_jobs.jobs_file() as sweep_jobs_done, _logging_config_errors():
        if invocation.sweep is None:
            hydra_main()
        else:
            _sweep(hydra_main)
        jobs = sweep_jobs_done()
    if any(job["status"] == "preempted" for job in jobs):  # in joblib's workers (cli.job)
        from tfrecipe.fault.preemption import stop_requested

        _sweep_stopped(stop_requested() or "SIGTERM")
    # An Optuna sweep's extra worker (cli.optuna_workers) leaves the report to the sweep's process.
    worker = os.environ.get(optuna_workers.WORKER_ENV)
    if invocation.sweep is not None and invocation.sweep.sweep_dir.is_dir() and not worker:
        _report_sweep(invocation.sweep, argv, started)
    os.environ.pop(SWEEP_KEYS_ENV, None)  # this sweep's, set by the pre-check
    failed = [job["run_dir"] for job in jobs if job["status"] == "failed"]
    if failed:
        print(f"tfrecipe: {len(failed)} sweep job(s) failed: {', '.join(failed)}", file=sys.stderr)
        raise SystemExit(EXIT_TRAINING)


def _sweep(hydra_main) -> None:
    """Hydra's sweep, whose worker processes (joblib's) get this process's stop signal: each job
    that trains saves a backup and ends preempted, as an in-process job does (`_run_hydra_job`
    then exits 75). A worker the signal found before its first job ends without one (it had
    nothing to save): the sweep stops all the same, in one line, not joblib's traceback of a
    terminated worker."""
    from tfrecipe.fault.preemption import forwarded_to_workers, stop_requested

    with forwarded_to_workers():
        try:
            hydra_main()
        except Exception as error:
            if type(error).__name__ != "TerminatedWorkerError" or stop_requested() is None:
                raise
            _sweep_stopped(stop_requested())


def _sweep_stopped(signal_name: str) -> NoReturn:
    print(
        f"tfrecipe: sweep stopped ({signal_name}): its jobs saved their backups where they had "
        "begun training; rerun the same command to resume it",
        file=sys.stderr,
    )
    raise SystemExit(EXIT_PREEMPTED)


@contextlib.contextmanager
def _cleaned_up(invocation: Invocation):
    """What a command stopped before its job could record it leaves: a config error, no new run
    dir (and no Hydra files in an old one); a signal or a full disk, its line and summary.json."""
    from tfrecipe.cli.hydra_errors import hydra_errors
    from tfrecipe.fault.preemption import Preempted

    try:
        yield
    except JobConfigError as carried:
        _discard_new_run_dir(invocation, job_dir=carried.job_dir)
        raise carried.error from None
    except (ConfigError, *hydra_errors()):
        _discard_new_run_dir(invocation, job_dir=None)
        raise
    except Preempted as stopped:  # SIGTERM/Ctrl-C before training watched for them
        _record_stopped_start(stopped, invocation.run_dir)
        raise SystemExit(EXIT_PREEMPTED) from None
    except OSError as error:
        _stop_on_a_full_disk(error, invocation.run_dir)  # else not ours to explain
        raise


def _report_sweep(plan, argv: list[str], started: float) -> None:
    """sweep.json, sweep.png and the table naming the best job (tfrecipe.cli.sweep_report),
    then the sweep's MLflow parent run closed with the winner, where jobs opened one."""
    import dataclasses

    from tfrecipe.cli.sweep_report import console_text, invocation, recipe_paths, write_report
    from tfrecipe.tracking.mlflow_store import PARENT_FILE, RECORD_DIR, close_sweep

    plan = dataclasses.replace(plan, recipes=recipe_paths(argv))  # the rerun names the file
    report = write_report(plan, invocation=invocation(argv, started))
    print(console_text(report))
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
def _secrets_redacted_from_cfg(argv: list[str]):
    """`--cfg` has Hydra print the composed config, resolved with `--resolve` or `-p KEY`: a
    recipe's `${oc.env:HF_TOKEN}` would show the token. What Hydra prints is redacted as
    everything else tfrecipe prints (config.secrets.redact_text)."""
    from hydra._internal.utils import get_args_parser

    if not get_args_parser().parse_args(argv).cfg:
        yield
        return
    from tfrecipe.config.secrets import redact_text

    shown = io.StringIO()
    try:
        with contextlib.redirect_stdout(shown):
            yield
    finally:
        print(redact_text(shown.getvalue()), end="")


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


def _record_stopped_start(stopped: Exception, run_dir: Path | None) -> None:
    """A run stopped by a signal before train() took over: summary.json says "preempted" when
    its run dir is known and held by this process (else there is no run yet to record)."""
    if run_dir is not None:
        mark_preempted(run_dir, stopped)
    where = f"\nrun dir: {run_dir}" if run_dir is not None else ""
    print(f"tfrecipe: {stopped}{where}", file=sys.stderr)


def _stop_on_a_full_disk(error: OSError, run_dir: Path | None) -> None:
    """A disk full before the run could start (Hydra writes `.hydra/` before tfrecipe's code
    runs): one line and summary.json status "failed" instead of Hydra's traceback, exit code 1.
    Returns (the caller re-raises) for any other OSError, or where no run dir was pinned."""
    from tfrecipe.fault.disk import is_disk_full, record_failed_start

    if run_dir is None or not is_disk_full(error) or not run_dir.is_dir():
        return
    try:
        line = record_failed_start(run_dir, error)
    except OSError:  # not even summary.json fits: the line alone
        line = f"tfrecipe: training failed: disk full: no space left in {run_dir}"
    print(line, file=sys.stderr)
    raise SystemExit(EXIT_TRAINING) from None


def _discard_new_run_dir(invocation: Invocation, *, job_dir: Path | None) -> None:
    """A run that stopped on a config error leaves nothing behind, unless the dir was there."""
    run_dir = invocation.run_dir
    if run_dir is not None and not invocation.run_dir_existed and run_dir.exists():
        shutil.rmtree(run_dir, ignore_errors=True)
    elif job_dir is not None:
        _discard_hydra_files(job_dir, made_manifest=invocation.made_manifest)


def _discard_hydra_files(job_dir: Path, *, made_manifest: bool) -> None:
    """The dir was there before, or nothing pre-checked it (--config-dir, --config-name): remove
    only what Hydra wrote for the job (and the manifest this invocation began), and the dir when
    that leaves it empty."""
    from tfrecipe import files

    shutil.rmtree(job_dir / ".hydra", ignore_errors=True)
    if made_manifest:
        (job_dir / files.MANIFEST).unlink(missing_ok=True)
    for log_file in job_dir.glob("*.log"):
        if log_file.stat().st_size == 0:
            log_file.unlink()
    with contextlib.suppress(OSError):
        job_dir.rmdir()
