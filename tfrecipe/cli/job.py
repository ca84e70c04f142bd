"""The Hydra job: one training run in the directory Hydra made for it, and what a failed or
stopped job leaves behind (its one line on the console, traceback.txt, summary.json's status).

Hydra calls `task` in this process (a single run, the basic launcher's sweep) or in another (the
joblib and submitit launchers pickle it by name).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from tfrecipe import rundir
from tfrecipe.cli import sweep_jobs

# the resolver of `hydra.output_subdir`, which Hydra resolves in the process that runs `task`
from tfrecipe.config import changes  # noqa: F401
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
    # A log file that cannot be written (a full disk) must not turn every log line into a
    # traceback on the console, which still shows each line.
    logging.raiseExceptions = False
    job = _Job(
        cfg,
        Path(HydraConfig.get().runtime.output_dir),
        sweeping=HydraConfig.get().mode == RunMode.MULTIRUN,
    )
    return job.run()


@dataclasses.dataclass(frozen=True)
class _Job:
    """One Hydra job: its composed config, the directory Hydra made for it, and whether it is
    one of a sweep's."""

    cfg: Any
    run_dir: Path
    sweeping: bool

    def run(self) -> float:
        """Trains (or skips a sweep's finished job); a failure is recorded, and ends the job
        unless it is a sweep's that goes on."""
        cfg, run_dir, sweeping = self.cfg, self.run_dir, self.sweeping
        self._show_config()
        try:
            summary = (self._finished_before() if sweeping else None) or self._train()
        except ConfigError as error:
            if sweeping:
                return self._failed(error)
            raise JobConfigError(error, run_dir) from None
        except Exception as error:
            if not sweeping:
                self._record_failure(error)
                raise SystemExit(_exit_code(error)) from None
            return self._failed(error)
        if summary.get("status") == "preempted":  # in a sweep's worker process (`_train`)
            sweep_jobs.note_job(run_dir, "preempted", {})
            return float("nan")
        self._log_result(summary)
        if sweeping:
            metrics = sweep_jobs.main_metrics(summary, cfg.sweep.objective)
            sweep_jobs.note_job(run_dir, summary["status"], metrics)
        return sweep_jobs.objective(summary, cfg.sweep.objective)

    def _finished_before(self) -> dict | None:
        """The summary of a sweep job that already finished in its run dir (a sweep rerun into
        its own sweep dir): skipped, if it ran this same config (else refused, as a resume is).
        None: a new, preempted or failed job, which trains (and resumes from its backup)."""
        from tfrecipe.config.changes import Resuming, check_resume_unchanged
        from tfrecipe.outcome import FINISHED
        from tfrecipe.rundir import RunFiles, public_config

        run_dir = self.run_dir
        summary = RunFiles(run_dir).summary()
        if not summary or summary.get("status") not in FINISHED:
            return None
        check_resume_unchanged(
            run_dir,
            public_config(self.cfg),
            Resuming("auto"),
            remedy="A finished sweep job is never trained over: run other values into a new "
            "hydra.sweep.dir (or add them after this sweep's: new jobs get new dirs)",
        )
        status = summary["status"]
        log.info("sweep job %s: already %s, skipped (run dir: %s)", run_dir.name, status, run_dir)
        return summary

    @property
    def chief(self) -> bool:
        """Whether this process is its cluster's chief (a single run's is), which alone shows
        the config and writes the run dir: SLURM's other tasks and TF_CONFIG's other workers
        run the same job beside it."""
        from omegaconf import OmegaConf

        from tfrecipe.distribute.cluster import is_chief_task

        return is_chief_task(OmegaConf.select(self.cfg, "cluster.name", default="none"))

    def _show_config(self) -> None:
        from tfrecipe.cli.display import print_changes, shows_config

        shown = shows_config(
            self.cfg.get("print_config", "auto"),
            sweeping=self.sweeping,
            verbose=self.cfg.loop.get("verbose", "auto"),
            terminal=sys.stdout.isatty(),
        )
        if shown and self.chief:  # the other tasks of a cluster run the same config
            print_changes(self.cfg, self.run_dir)  # the whole tree: config.yaml, --cfg job

    def _train(self) -> dict:
        """train()'s summary; a signal before or during it ends the job as preempted (exit
        code). In a sweep's worker process (joblib's) a preempted job returns its summary
        instead: an exception would make joblib kill the other workers, which may be saving
        their own backups; the sweep's process ends with exit code 75 once they all have."""
        from tfrecipe.cli.console import discover_devices
        from tfrecipe.fault import preemption
        from tfrecipe.fault.preemption import Preempted, hand_over_to_submitit, stop_if_signalled

        worker = preemption.in_worker_process()
        if worker:  # between jobs, a stop signal is noted for the next job, not fatal
            preemption.defer_stops()
        try:
            stop_if_signalled()
            self._use_compile_cache()  # before TensorFlow lists its devices (it reads it then)
            discover_devices()  # imports TensorFlow: seconds
            stop_if_signalled()
            from tfrecipe.config.trust import Trust
            from tfrecipe.train import train

            return train(self.cfg, run_dir=self.run_dir, trust=Trust.of_this_process())
        except Preempted as preempted:
            mark_preempted(self.run_dir, preempted)  # when it came before train() could
            log.warning("%s\nrun dir: %s", preempted, self.run_dir)
            hand_over_to_submitit(preempted)  # a submitit job: requeued, and exits
            if not worker:
                raise SystemExit(EXIT_PREEMPTED) from None
            preemption.note_stop(preempted.signal_name)
            return {"status": "preempted"}

    def _use_compile_cache(self) -> None:
        """XLA's persistent cache (`batching.compile_cache`), decided from the devices read
        without TensorFlow (the pre-check validated the config, the folder included)."""
        from tfrecipe.perf import xla_cache

        batching = self.cfg.batching
        xla_cache.use(
            batching.compile_cache,
            jit_compile=batching.jit_compile,
            devices=xla_cache.devices(self.cfg.strategy.name, os.environ),
        )

    def _failed(self, error: Exception) -> float:
        """A sweep job's failure: recorded, and the sweep goes on unless `sweep.fail_fast`."""
        self._record_failure(error)
        if self.cfg.sweep.fail_fast:
            raise SystemExit(_exit_code(error)) from None
        sweep_jobs.note_job(self.run_dir, "failed", {})
        return float("nan")

    def _log_result(self, summary: dict) -> None:
        """The run's last lines: how it ended, its test metrics, where it stands to the
        baselines."""
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
            self.run_dir,
        )
        if summary.get("baselines"):  # where the model stands against them: the last lines
            from tfrecipe.training.baselines import lines

            log.info("\n".join(lines(summary["baselines"], summary["test"])))

    def _record_failure(self, error: Exception) -> None:
        """Says what failed: on the console, in traceback.txt and (for config errors, which
        stop before training writes one) in summary.json, so a sweep's failed job is visible."""
        from tfrecipe.rundir import RunFiles

        run_dir = self.run_dir
        if not self.chief:  # the run dir is the chief's; another task only says what failed
            log.error("this task (not the chief, which writes %s) failed: %s", run_dir, error)
            return
        if isinstance(error, DataError):  # a bad cell met while training: its one line
            log.error("tfrecipe: invalid data: %s\nrun dir: %s", error, run_dir)
            return
        # a sweep job refused by the lock: that run's dir, log too
        if RunFiles(run_dir).in_use_by_another():
            print(error.report() if isinstance(error, ConfigError) else error, file=sys.stderr)
            return
        if isinstance(error, ConfigError):
            self._record_config_error(error)
        else:
            self._record_crash(error)

    def _record_config_error(self, error: ConfigError) -> None:
        from tfrecipe.rundir import SUMMARY, RunFiles

        log.error("%s\nrun dir: %s", error.report(), self.run_dir)
        if not (self.run_dir / SUMMARY).exists():  # an unreadable one is not ours to replace
            with contextlib.suppress(OSError):
                RunFiles(self.run_dir).record_status("failed", str(error), fields={})

    def _record_crash(self, error: Exception) -> None:
        from tfrecipe.config.secrets import redact_text
        from tfrecipe.fault.disk import error_text
        from tfrecipe.files import write_atomic

        run_dir = self.run_dir
        with contextlib.suppress(OSError):  # a full disk: summary.json says so, in its reserve
            write_atomic(run_dir / rundir.TRACEBACK, redact_text(traceback.format_exc()))
        cause = error if isinstance(error, TrainingError) else error_text(error, run_dir)
        log.error(
            "training failed: %s\nrun dir: %s (summary.json and traceback.txt have the details)",
            cause,
            run_dir,
        )


def _exit_code(error: Exception) -> int:
    if port_taken(error):  # the local launcher tries again on new ports
        return EXIT_PORT_TAKEN
    return EXIT_CONFIG if isinstance(error, ConfigError | DataError) else EXIT_TRAINING


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
