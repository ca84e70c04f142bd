"""The workers of an Optuna sweep beside the sweep's own process (cli.optuna_study): each one is
this invocation's own command line again, joins the same study and asks it for its next trial as
soon as its last one ended, so no worker waits for another's trial.

- On this machine (`hydra.sweeper.n_jobs=N`): N-1 more processes beside the sweep's own, which
  runs trials too.
- Under a submitit launcher (`hydra/launcher=submitit_slurm`): N array tasks of one SLURM job,
  submitted through the launcher's own settings (partition, cpus_per_task, timeout_min, ...);
  each worker runs its trials in its task (`runs_trials_itself`), and the sweep's process only
  waits for them, then reports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from tfrecipe.distribute.launcher import child_environment, tfrecipe_command

log = logging.getLogger("tfrecipe")

# Set on the workers a sweep starts (its number, 1..n_jobs): they run trials and leave the
# report to the sweep's own process.
WORKER_ENV = "TFRECIPE_SWEEP_WORKER"


def worker_number() -> int:
    """This process's number among the sweep's workers (0: the sweep's own process)."""
    return int(os.environ.get(WORKER_ENV) or 0)


def runs_trials_itself() -> bool:
    """Whether this worker is an array task (a submitit job, SUBMITIT_EXECUTOR): its trials run
    in it, through Hydra's basic launcher, not as jobs it would submit from a compute node."""
    return worker_number() > 0 and "SUBMITIT_EXECUTOR" in os.environ


def submitit_launcher(launcher: Any) -> bool:
    """Whether `launcher` is Hydra's submitit launcher (hydra/launcher=submitit_slurm|local)."""
    try:
        from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
    except ImportError:
        return False
    return isinstance(launcher, BaseSubmititLauncher)


@contextlib.contextmanager
def local_workers(count: int) -> Iterator[None]:
    """`count` more processes of this command line, each a worker of the same study; waited
    for (stopped, if this process is stopped)."""
    command = tfrecipe_command(sys.argv[1:])  # not a module of the current folder
    workers = [
        subprocess.Popen(command, env=child_environment({**os.environ, WORKER_ENV: str(number)}))
        for number in range(1, count + 1)
    ]
    try:
        yield
    except BaseException:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        raise
    finally:
        for number, worker in enumerate(workers, start=1):
            if worker.wait() != 0:
                log.warning("optuna: worker %d ended with exit code %d", number, worker.returncode)


def run_array(launcher: Any, count: int) -> None:
    """Submits `count` array tasks, each a worker of this command line, through the submitit
    launcher's executor, and waits for them all (cancels them if this process is stopped)."""
    executor = _executor(launcher)
    numbers = list(range(1, count + 1))
    jobs = executor.map_array(ArrayTask(), [tfrecipe_command(sys.argv[1:])] * count, numbers)
    log.info("optuna: %d array task(s) run the trials (job %s)", count, jobs[0].job_id)
    try:
        for number, job in zip(numbers, jobs, strict=True):
            try:
                job.result()
            except Exception as error:  # its trial is failed and retried (cli.optuna_lease)
                first = str(error).strip().splitlines()[:1]
                log.warning("optuna: array task %d (%s) failed: %s", number, job.job_id, *first)
    except BaseException:
        for job in jobs:
            job.cancel(check=False)
        raise


class ArrayTask:
    """One array task (in the SLURM job): the sweep's command line as worker `number`.

    Preempted or at its time limit, the task gets submitit's signal (SIGUSR2), whose default
    kills: the worker ignores it (an ignored signal stays ignored through exec), and submitit's
    handler here calls `checkpoint`, which stops the worker as SLURM would (SIGTERM: it saves
    its trial's backup, fails the trial and enqueues its retry) before submitit requeues the
    task; the requeued task goes on with the study, the retry first."""

    def __init__(self) -> None:
        self.worker: subprocess.Popen | None = None

    def __call__(self, command: list[str], number: int) -> None:
        env = child_environment({**os.environ, WORKER_ENV: str(number)})
        signum = _submitit_signal()
        handler = signal.signal(signum, signal.SIG_IGN)  # for the worker to inherit
        try:
            self.worker = subprocess.Popen(command, env=env)
        finally:
            signal.signal(signum, handler)  # submitit's own, for this process
        if self.worker.wait() != 0:
            raise RuntimeError(f"worker {number} exited with code {self.worker.returncode}")

    def checkpoint(self, command: list[str], number: int):
        """What submitit requeues: a fresh task, once this one's worker has saved and ended."""
        import submitit

        if self.worker is not None and self.worker.returncode is None:
            self.worker.send_signal(signal.SIGTERM)
            with contextlib.suppress(ChildProcessError):  # not Popen.wait: __call__, which
                os.waitpid(self.worker.pid, 0)  # this signal interrupted, holds its lock
        return submitit.helpers.DelayedSubmission(ArrayTask(), command, number)

    def __getstate__(self) -> dict:
        return {"worker": None}  # a process is no part of what submitit pickles


def _submitit_signal() -> signal.Signals:
    """The signal submitit sends a job before its time limit or a preemption."""
    return getattr(signal, f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}")


def _executor(launcher: Any):
    """submitit's executor with the launcher's settings, as its own `launch` builds it (the
    queue's keys as they are, the others prefixed with the cluster's name)."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    cluster = launcher._EXECUTOR
    params = dict(launcher.params)
    init = {"folder": params.pop("submitit_folder")}
    if "max_num_timeout" in params:
        init[f"{cluster}_max_num_timeout"] = params.pop("max_num_timeout")
    executor = submitit.AutoExecutor(cluster=cluster, **init)
    queue_keys = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(
        **{key if key in queue_keys else f"{cluster}_{key}": v for key, v in params.items()}
    )
    return executor
