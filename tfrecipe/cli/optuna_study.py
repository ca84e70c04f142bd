"""tfrecipe's Optuna sweeper: a study that resumes, prunes hopeless trials and keeps several
workers busy (`hydra/sweeper=optuna`; the Hydra plugin in hydra_plugins/tfrecipe_optuna_sweeper
is a shim over `OptunaStudy`).

- The study lives in `storage` (`sqlite:///FILE`, `journal:///FILE`, a database server's URL
  from your command line or `STORAGE_ENV`; default `SWEEP_DIR/study.db`) under `study_name`
  (default "tfrecipe"): rerunning the command continues it until it has `n_trials` finished
  (complete or pruned) trials, and another process on the same storage joins it.
- A worker asks the study for a trial, runs it as a Hydra job in `SWEEP_DIR/<trial number>`
  and tells the study how it ended, then asks for the next: `n_jobs` workers (this process and
  `n_jobs - 1` more of the same command line; under a submitit launcher, `n_jobs` SLURM array
  tasks: cli.optuna_workers) never wait for each other's trials.
- A trial whose process died (SIGKILL, a lost node: its lease beside a file storage is free,
  cli.optuna_lease; Optuna's heartbeat on a database server) or that was stopped (SIGTERM,
  Ctrl-C) is failed and retried once with the same parameters, into the same run dir, where it
  resumes from its backup.
- The job reports `sweep.objective` after every validation (tfrecipe.tracking.optuna_trial); a
  job the pruner stops marks its trial, which is told PRUNED here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import socket
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tfrecipe.cli import optuna_lease, optuna_workers
from tfrecipe.cli.optuna_space import SearchSpace, search_space
from tfrecipe.errors import ConfigError, Problem
from tfrecipe.tracking.optuna_trial import PRUNED_ATTR, TRIAL_ENV, TrialHandle, make_pruner

log = logging.getLogger("tfrecipe")

# A database server's URL from your environment (used where hydra.sweeper.storage is null).
STORAGE_ENV = "TFRECIPE_SWEEP_STORAGE"
DEFAULT_STUDY = "tfrecipe"
STUDY_FILE = "study.db"
# A trial's user attribute: the worker running it (host:pid), to fail it once that process died.
WORKER_ATTR = "tfrecipe_worker"
# A trial's user attribute: asked past n_trials by a worker racing another (a database server,
# where no lock orders the asking), and failed unrun.
SURPLUS_ATTR = "tfrecipe_surplus"
# A trial backs up its training state (every epoch's end), so that its retry resumes where a
# killed one stopped; your `callbacks.backup.enabled=false` wins.
TRIAL_BACKUPS = "callbacks.backup.enabled=true"
HEARTBEAT_S = 10  # RDB storage: a trial without a heartbeat for 3x this is failed and retried
RETRIES = 1


@dataclasses.dataclass(frozen=True)
class Budget:
    """How far the sweep goes: `n_trials` finished trials, `n_jobs` at a time here, and the
    failed trials (of this process) tolerated before it stops."""

    n_trials: int
    n_jobs: int
    max_failures: int


def storage_url(configured: str | None, sweep_dir: Path) -> str:
    """The study's storage: the config's, else STORAGE_ENV's, else SWEEP_DIR/study.db."""
    if configured:
        return str(configured)
    if os.environ.get(STORAGE_ENV):
        return os.environ[STORAGE_ENV]
    sweep_dir.mkdir(parents=True, exist_ok=True)  # Hydra makes it with the first job: too late
    return f"sqlite:///{(sweep_dir / STUDY_FILE).absolute()}"


def open_storage(url: str):
    """The storage of `url`; RDB storage with a heartbeat that fails and retries dead trials."""
    import optuna

    from tfrecipe.tracking.optuna_trial import open_storage as open_plain

    if url.startswith("journal:///"):
        return open_plain(url)
    with warnings.catch_warnings():  # the heartbeat is experimental since Optuna 2.9, and used
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _rdb_storage(url)


def _rdb_storage(url: str):
    import optuna

    return optuna.storages.RDBStorage(
        url,
        engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite:") else None,
        heartbeat_interval=HEARTBEAT_S,
        grace_period=3 * HEARTBEAT_S,
        heartbeat_stale_trial_callback=_retry_callback(),
    )


class OptunaStudy:
    """One process's share of a sweep: its workers (started here) and its own trial loop."""

    def __init__(self, settings: Mapping[str, Any], *, launcher, config) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        self.launcher, self.config = launcher, config
        self.url = storage_url(settings.get("storage"), sweep_dir)
        self.leases = optuna_lease.lease_dir(self.url)
        self.name = settings.get("study_name") or DEFAULT_STUDY
        self.sampler = settings["sampler"]
        self.pruner = dict(settings.get("pruner") or {"name": "none"})
        self.direction = _direction(settings.get("direction"))
        self.params = settings.get("params") or {}
        self.legacy_space = settings.get("search_space")
        self.extend = _custom_space(settings.get("custom_search_space"))
        n_trials = int(settings.get("n_trials", 20))
        self.budget = Budget(
            n_trials=n_trials,
            n_jobs=max(1, int(settings.get("n_jobs", 1))),
            max_failures=int(float(settings.get("max_failure_rate", 0.0)) * n_trials),
        )

    @classmethod
    def create(cls, settings: Mapping[str, Any], *, hydra_context, task_function, config):
        from hydra.core.plugins import Plugins

        if optuna_workers.runs_trials_itself():  # an array task: its trials run here
            from hydra._internal.core_plugins.basic_launcher import BasicLauncher

            launcher = BasicLauncher()
            launcher.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        else:
            launcher = Plugins.instance().instantiate_launcher(
                config=config, hydra_context=hydra_context, task_function=task_function
            )
        return cls(settings, launcher=launcher, config=config)

    def sweep(self, arguments: list[str]) -> None:
        """Runs trials until the study has `n_trials` finished ones, with `n_jobs - 1` more
        workers of this command line beside this process (not in a worker itself)."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        lines = [f"{key}={value}" for key, value in self.params.items()]
        space = search_space([TRIAL_BACKUPS, *lines, *arguments], self.legacy_space)
        study = self._study(space)
        log.info(
            "optuna: study %r in %s, %d trial(s) finished of %d",
            study.study_name,
            _shown(self.url),
            _finished(study),
            self.budget.n_trials,
        )
        if self.worker_number:
            _TrialLoop(study, space, self).run()
        elif optuna_workers.submitit_launcher(self.launcher):  # the trials run in array tasks
            optuna_workers.run_array(self.launcher, self.budget.n_jobs)
        else:
            with optuna_workers.local_workers(self.budget.n_jobs - 1):
                _TrialLoop(study, space, self).run()
        if not self.worker_number:
            _write_results(study, Path(str(self.config.hydra.sweep.dir)))

    def _study(self, space: SearchSpace):
        import functools

        import optuna

        sampler = self.sampler
        n_trials = self.budget.n_trials
        if isinstance(sampler, functools.partial):  # grid: its values are the search space's
            grid = space.grid()
            sampler = sampler(grid)
            n_trials = min(n_trials, math.prod(len(v) for v in grid.values()))
        self.budget = dataclasses.replace(self.budget, n_trials=n_trials)
        study = optuna.create_study(
            storage=self._storage(),
            study_name=self.name,
            sampler=sampler,
            pruner=make_pruner(self.pruner),
            direction=self.direction,
            load_if_exists=True,
        )
        # Another worker, or a rerun continuing the study, must not draw the trials drawn from
        # the same seed before (a seeded sampler starts from its seed in every process).
        continued = self.worker_number or study.get_trials(deepcopy=False)
        if continued and getattr(sampler, "_rng", None) is not None:
            sampler.reseed_rng()
        return study

    def _storage(self):
        """The study's storage; its file's folder made, as Hydra makes hydra.sweep.dir.

        Raises:
          ConfigError: the storage cannot be opened (an unknown scheme, a server refusing).
        """
        if self.leases is not None:  # beside the study's file
            self.leases.parent.mkdir(parents=True, exist_ok=True)
        try:
            return open_storage(self.url)
        except Exception as error:  # SQLAlchemy's and Optuna's own, by scheme
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ConfigError(
                Problem("hydra.sweeper.storage", _shown(self.url), f"cannot open it: {first}")
            ) from None

    @property
    def worker_number(self) -> int:
        return optuna_workers.worker_number()

    def trial_handle(self, trial) -> TrialHandle:
        return TrialHandle(self.url, self.name, trial._trial_id, self.pruner)


class _TrialLoop:
    """Ask, run, tell, until the study has its trials (or too many of this process failed)."""

    def __init__(self, study, space: SearchSpace, owner: OptunaStudy):
        self.study, self.space, self.owner = study, space, owner
        self.failures = 0

    def run(self) -> None:
        while True:
            with contextlib.ExitStack() as lease:  # held until the trial is told
                trial = self._next(lease)
                if trial is None:
                    return
                self._run_one(trial)

    def _next(self, lease: contextlib.ExitStack):
        """The next trial, its lease taken into `lease` (None: the study has its trials, or too
        many of this process failed). One worker at a time counts and asks (optuna_lease.asking)
        where the study is a file; on a database server a trial asked past the budget is
        dropped unrun."""
        import optuna

        budget = self.owner.budget
        with optuna_lease.asking(self.owner.leases):
            _fail_dead_trials(self.study, self.owner.leases)
            if _counted(self.study) >= budget.n_trials:
                return None
            if self.failures > budget.max_failures:
                log.error(
                    "optuna: %d trial(s) failed (max_failure_rate allows %d): stopping",
                    self.failures,
                    budget.max_failures,
                )
                return None
            with warnings.catch_warnings():  # the heartbeat is ours (_heartbeat), not optimize's
                warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)
                trial = self.study.ask(self.space.distributions)
            trial.set_user_attr(WORKER_ATTR, f"{socket.gethostname()}:{os.getpid()}")
            lease.enter_context(optuna_lease.held(self.owner.leases, trial._trial_id))
        if _ahead(self.study, trial) >= budget.n_trials:  # another worker asked at once
            trial.set_user_attr(SURPLUS_ATTR, True)
            _told(self.study, trial, state=optuna.trial.TrialState.FAIL)
            return None
        return trial

    def _run_one(self, trial) -> None:
        if self.owner.extend is not None:
            self.owner.extend(self.owner.config, trial)
        # A retry (RetryFailedTrialCallback) runs in the run dir of the trial it retries.
        number = self.study._storage.get_trial(trial._trial_id).system_attrs.get(
            "failed_trial", trial.number
        )
        overrides = self.space.overrides(trial.params)
        try:
            with _heartbeat(self.study, trial), _trial_env(self.owner.trial_handle(trial)):
                [result] = self.owner.launcher.launch([overrides], initial_job_idx=number)
        except BaseException:  # stopped (SIGTERM, Ctrl-C): failed, to be resumed by a retry
            _fail_and_retry(self.study, trial._trial_id)
            raise
        self._tell(trial, result)

    def _tell(self, trial, result) -> None:
        import optuna

        state = optuna.trial.TrialState
        try:
            value = float(result.return_value)
        except Exception as error:  # the job raised past tfrecipe's own handling
            log.error("optuna: trial %d failed: %s", trial.number, error)
            value = math.nan
        marked = self.study._storage.get_trial(trial._trial_id).user_attrs
        if PRUNED_ATTR in marked:
            _told(self.study, trial, state=state.PRUNED)
        elif math.isfinite(value):
            _told(self.study, trial, values=value)
        else:
            self.failures += 1
            _told(self.study, trial, state=state.FAIL)


def _told(study, trial, **outcome: Any) -> None:
    """study.tell; the grid sampler's `study.stop()` once its grid is done (meant for
    `optimize`, it raises here after the trial was recorded) is not an error."""
    try:
        study.tell(trial, **outcome)
    except RuntimeError as error:
        if "Study.stop" not in str(error):
            raise


def _write_results(study, sweep_dir: Path) -> None:
    """SWEEP_DIR/optimization_results.yaml, as the stock sweeper wrote it: the best complete
    trial's parameters and value (nothing where no trial completed)."""
    from omegaconf import OmegaConf

    from tfrecipe.files import write_atomic

    try:
        best = study.best_trial
    except ValueError:
        return
    results = {"name": "optuna", "best_params": best.params, "best_value": best.value}
    write_atomic(sweep_dir / "optimization_results.yaml", OmegaConf.to_yaml(results))


def _finished(study) -> int:
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def _ahead(study, trial) -> int:
    """How many trials asked before `trial` count toward the budget (finished or running)."""
    return sum(t.number < trial.number for t in _counting(study))


def _counted(study) -> int:
    """The trials that count toward the budget (finished or running), in one read: a trial that
    finished between a read of the finished ones and a read of the running ones was in neither
    (a worker then asked for one trial too many)."""
    return len(_counting(study))


def _counting(study) -> list:
    import optuna

    state = optuna.trial.TrialState
    return study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED, state.RUNNING))


def _fail_dead_trials(study, leases: Path | None) -> None:
    """Fails (and retries once) the running trials whose worker died: at once where the study is
    a file (the trial's lease can be taken: cli.optuna_lease, on any machine that shares the
    file) or the worker was a process of this machine, else by Optuna's heartbeat (RDB)."""
    import optuna

    if isinstance(study._storage, optuna.storages.RDBStorage):
        optuna.storages.fail_stale_trials(study)
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = str(trial.user_attrs.get(WORKER_ATTR, ""))
        gone = optuna_lease.worker_gone(leases, trial._trial_id)
        if gone is None:  # no lease to tell: a database server, a file system without locks
            gone = _gone_from_this_machine(worker)
        if gone:
            log.warning("optuna: trial %d's worker (%s) is gone: retrying it", trial.number, worker)
            _fail_and_retry(study, trial._trial_id)


def _gone_from_this_machine(worker: str) -> bool:
    """Whether `worker` (host:pid) was a process of this machine that no longer runs."""
    host, _, pid = worker.rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not _alive(int(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fail_and_retry(study, trial_id: int) -> None:
    """Fails a running trial and enqueues its retry (same parameters; RETRIES at most)."""
    import optuna

    storage = study._storage
    with contextlib.suppress(RuntimeError), warnings.catch_warnings():  # RuntimeError: another
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # failed it first
        if not storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL):
            return
        _retry_callback()(study, storage.get_trial(trial_id))


def _retry_callback():
    """Optuna's callback that enqueues a failed trial again (RETRIES times at most), by its
    name since Optuna 4.9 (RetryFailedTrialCallback before)."""
    import optuna

    storages = optuna.storages
    callback = getattr(storages, "RetryHeartbeatStaleTrialCallback", None)
    return (callback or storages.RetryFailedTrialCallback)(max_retry=RETRIES)


@contextlib.contextmanager
def _heartbeat(study, trial) -> Iterator[None]:
    """Records the trial's heartbeat while its job runs (RDB storage)."""
    storage = study._storage
    if getattr(storage, "get_heartbeat_interval", lambda: None)() is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # a busy database: the next beat
                storage.record_heartbeat(trial._trial_id)
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="optuna-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def _trial_env(handle: TrialHandle) -> Iterator[None]:
    """The job's trial, in its environment (a job in another process inherits it)."""
    os.environ.update(handle.environ())
    try:
        yield
    finally:
        os.environ.pop(TRIAL_ENV, None)


def _direction(direction: Any) -> str:
    text = str(direction or "minimize").lower()
    if text in ("minimize", "maximize", "min", "max"):
        return "maximize" if text.startswith("max") else "minimize"
    raise ConfigError(
        Problem(
            "hydra.sweeper.direction",
            direction,
            "expected minimize or maximize (one objective: sweep.objective)",
        )
    )


def _custom_space(target: str | None):
    """`custom_search_space`: your function (checked under allowed_targets by the pre-check)."""
    if not target:
        return None
    from hydra.utils import instantiate

    return instantiate({"_target_": target, "_partial_": True})


def _shown(url: str) -> str:
    from tfrecipe.config.secrets import redact_text

    return redact_text(url)
