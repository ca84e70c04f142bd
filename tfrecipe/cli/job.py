"""The Hydra job: one training run in the directory Hydra made for it, and what a failed or
stopped job leaves behind (its one line on the console, traceback.txt, summary.json's status).

Hydra calls `task` in this process (a single run, the basic launcher's sweep) or in another (the
joblib and submitit launchers pickle it by name).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from pathlib import Path

from tfrecipe import rundir
from tfrecipe.cli import sweep_jobs
from tfrecipe.errors import ConfigError, DataError
from tfrecipe.outcome import (
    EXIT_CONFIG,
    EXIT_PORT_TAKEN,
    EXIT_PREEMPTED,
    EXIT_TRAINING,
    TrainingError,
    port_taken,
)

log = logging.getLogger("tfrecipe")


class JobConfigError(BaseException):
    """A ConfigError raised inside a single run's job, carried past Hydra's job runner (which
    catches Exception and prints its own "Error executing job" line) to the one-line report,
    with the directory Hydra made for the job (the training command cleans it up)."""

    def __init__(self, error: ConfigError, job_dir: Path):
        super().__init__(str(error))
        self.error, self.job_dir = error, job_dir


def task(cfg) -> float:
    """The Hydra task: one training run in Hydra's output directory. Returns the value an
    optimizing sweeper optimizes (`sweep.objective`; NaN for a failed sweep job)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from tfrecipe.config.secrets import redact_logs

    redact_logs()  # Hydra's console and log file, as configured for this job
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # A log file that cannot be written (a full disk) must not turn every log line into a
    # traceback on the console, which still shows each line.
    logging.raiseExceptions = False
    sweeping = HydraConfig.get().mode == RunMode.MULTIRUN
    _show_config(cfg, run_dir, sweeping=sweeping)
    try:
        summary = (_finished_before(cfg, run_dir) if sweeping else None) or _train(cfg, run_dir)
    except ConfigError as error:
        if sweeping:
            return _failed(cfg, run_dir, error)
        raise JobConfigError(error, run_dir) from None
    except Exception as error:
        if not sweeping:
            _record_failure(run_dir, error)
            raise SystemExit(_exit_code(error)) from None
        return _failed(cfg, run_dir, error)
    _log_result(summary, run_dir)
    if sweeping:
        metrics = sweep_jobs.main_metrics(summary, cfg.sweep.objective)
        sweep_jobs.note_job(run_dir, summary["status"], metrics)
    return sweep_jobs.objective(summary, cfg.sweep.objective)


def _finished_before(cfg, run_dir: Path) -> dict | None:
    """The summary of a sweep job that already finished in `run_dir` (a sweep rerun into its
    own sweep dir): skipped, if it ran this same config (else refused, as a resume is). None: a
    new, preempted or failed job, which trains (and resumes from its backup)."""
    from tfrecipe.config.changes import Resuming, check_resume_unchanged
    from tfrecipe.outcome import FINISHED
    from tfrecipe.rundir import RunFiles, public_config

    summary = RunFiles(run_dir).summary()
    if not summary or summary.get("status") not in FINISHED:
        return None
    check_resume_unchanged(run_dir, public_config(cfg), Resuming("auto"))
    status = summary["status"]
    log.info("sweep job %s: already %s, skipped (run dir: %s)", run_dir.name, status, run_dir)
    return summary


def _show_config(cfg, run_dir: Path, *, sweeping: bool) -> None:
    from tfrecipe.cli.display import print_changes, shows_config
    from tfrecipe.distribute.cluster import is_chief_process

    shown = shows_config(
        cfg.get("print_config", "auto"),
        sweeping=sweeping,
        verbose=cfg.loop.get("verbose", "auto"),
        terminal=sys.stdout.isatty(),
    )
    if shown and is_chief_process():  # the other tasks of a cluster run the same config
        print_changes(cfg, run_dir)  # the whole tree: config.yaml, --cfg job


def _train(cfg, run_dir: Path) -> dict:
    """train()'s summary; a signal before or during it ends the job as preempted (exit code)."""
    from tfrecipe.cli.console import discover_devices
    from tfrecipe.fault.preemption import Preempted, hand_over_to_submitit, stop_if_signalled

    try:
        stop_if_signalled()
        discover_devices()  # imports TensorFlow: seconds
        stop_if_signalled()
        from tfrecipe.config.trust import Trust
        from tfrecipe.train import train

        return train(cfg, run_dir=run_dir, trust=Trust.of_this_process())
    except Preempted as preempted:
        mark_preempted(run_dir, preempted)  # when it came before train() could
        log.warning("%s\nrun dir: %s", preempted, run_dir)
        hand_over_to_submitit(preempted)  # a submitit job: requeued, and exits
        raise SystemExit(EXIT_PREEMPTED) from None


def _failed(cfg, run_dir: Path, error: Exception) -> float:
    """A sweep job's failure: recorded, and the sweep goes on unless `sweep.fail_fast`."""
    _record_failure(run_dir, error)
    if cfg.sweep.fail_fast:
        raise SystemExit(_exit_code(error)) from None
    sweep_jobs.note_job(run_dir, "failed", {})
    return float("nan")


def _exit_code(error: Exception) -> int:
    if port_taken(error):  # the local launcher tries again on new ports
        return EXIT_PORT_TAKEN
    return EXIT_CONFIG if isinstance(error, ConfigError | DataError) else EXIT_TRAINING


def _log_result(summary: dict, run_dir: Path) -> None:
    """The run's last lines: how it ended, its test metrics, where it stands to the baselines."""
    from tfrecipe.cli.display import metrics_line
    from tfrecipe.perf.report import perf_words

    positive = summary.get("positive_class")  # binary: the class auc, precision, recall are of
    log.info(
        "done: %s in %.1fs; test%s %s; %s%srun dir: %s",
        summary["status"],
        summary["wall_time_s"],
        f" (positive class {positive})" if positive is not None else "",
        metrics_line(summary["test"]),
        perf_words(summary.get("perf")),
        "; " if perf_words(summary.get("perf")) else "",
        run_dir,
    )
    if summary.get("baselines"):  # where the model stands against them: the last lines
        from tfrecipe.training.baselines import lines

        log.info("\n".join(lines(summary["baselines"], summary["test"])))


def _record_failure(run_dir: Path, error: Exception) -> None:
    """Says what failed: on the console, in traceback.txt and (for config errors, which stop
    before training writes one) in summary.json, so a sweep's failed job is visible."""
    from tfrecipe.distribute.cluster import is_chief_process
    from tfrecipe.rundir import RunFiles

    if not is_chief_process():  # the run dir is the chief's; a worker only says what failed
        log.error("%s failed: %s", os.environ.get("TF_CONFIG"), error)
        return
    if isinstance(error, DataError):  # a bad cell met while training: its one line
        log.error("tfrecipe: invalid data: %s\nrun dir: %s", error, run_dir)
        return
    if RunFiles(
        run_dir
    ).in_use_by_another():  # a sweep job refused by the lock: that run's dir, log too
        print(error.report() if isinstance(error, ConfigError) else error, file=sys.stderr)
        return
    if isinstance(error, ConfigError):
        _record_config_error(run_dir, error)
    else:
        _record_crash(run_dir, error)


def _record_config_error(run_dir: Path, error: ConfigError) -> None:
    from tfrecipe.rundir import SUMMARY, RunFiles

    log.error("%s\nrun dir: %s", error.report(), run_dir)
    if not (run_dir / SUMMARY).exists():  # an unreadable one is not ours to replace
        with contextlib.suppress(OSError):
            RunFiles(run_dir).record_status("failed", str(error), fields={})


def _record_crash(run_dir: Path, error: Exception) -> None:
    from tfrecipe.config.secrets import redact_text
    from tfrecipe.fault.disk import error_text
    from tfrecipe.files import write_atomic

    with contextlib.suppress(OSError):  # a full disk: summary.json says so, in its reserve
        write_atomic(run_dir / rundir.TRACEBACK, redact_text(traceback.format_exc()))
    cause = error if isinstance(error, TrainingError) else error_text(error, run_dir)
    log.error(
        "training failed: %s\nrun dir: %s (summary.json and traceback.txt have the details)",
        cause,
        run_dir,
    )


def mark_preempted(run_dir: Path, stopped: Exception) -> None:
    """summary.json says "preempted", unless it already tells how this run ended or the dir is
    not held by this process (a sweep job's before train() locks it)."""
    from tfrecipe.rundir import SUMMARY, RunFiles

    home = RunFiles(run_dir)
    summary = home.summary()
    if summary is None and (run_dir / SUMMARY).exists():
        return  # unreadable: not ours to replace (ensure_fresh_run_dir refuses such a dir)
    summary = summary or {}
    if home.held() and summary.get("status") in (None, "running", "failed"):
        home.record_status("preempted", f"Preempted: {stopped}", fields=summary)
