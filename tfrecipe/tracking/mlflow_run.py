"""MLflow tracking: one MLflow run per training run, opened by the chief only, with tfrecipe's
own callback (autolog opens a run in every worker, mlflow#11782, and its model logging turned a
3.4 s fit into ~20 s).

- params: the resolved config, flattened (`model.hidden_units`), secrets redacted
  (`rundir.public_config`); tags: status, strategy, replicas, the git commit, `logger.mlflow.tags`;
- metrics: each epoch's row of history.csv as it is written (same names, step = epoch), then the
  test split's (`test_*`), throughput and summary.json's `perf` numbers;
- artifacts (`logger.mlflow.log_artifacts`): model.keras, the exports, summary.json, history.csv,
  config.yaml, curves.png;
- a resumed run continues its MLflow run: RUN_DIR/mlflow/run.json keeps its id;
- a sweep is one parent run (SWEEP_DIR/mlflow/parent.json, opened by whichever job comes first)
  with a child run per job; the launching process closes it with the winner (`close_sweep`);
- a tracking server that cannot be reached never fails training: one warning, and the run is
  recorded in a local MLflow store, RUN_DIR/mlflow/local.db, that `tfrecipe mlflow-sync RUN_DIR`
  uploads later.

The default store is a sqlite file in the sweep dir (a multirun: parent and children in one
store) or the run dir; `logger.mlflow.tracking_uri`, else MLFLOW_TRACKING_URI, names another.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import keras

from tfrecipe import files, reading, rundir
from tfrecipe.config import schema
from tfrecipe.config.run_sections import tag_text
from tfrecipe.config.secrets import redact_text
from tfrecipe.errors import ConfigError
from tfrecipe.tracking.mlflow_store import (
    DEFAULT_STORE,
    LOCAL_STORE,
    PARENT_FILE,
    RECORD_DIR,
    RUN_FILE,
    check_local_store,
    confine_artifacts,
    experiment_of,
    quiet_logs,
    read_record,
    short_timeouts,
    shown,
    store_file,
)

log = logging.getLogger("tfrecipe")

# What the chief's run dir holds that the tracker uploads (rundir.LAYOUT's names).
_ARTIFACTS = tuple(
    rundir.LAYOUT[name][0]
    for name in ("model", "onnx", "litert", "saved_model", "summary", "history", "config", "curves")
)
# A pruned trial (an Optuna sweep's) ended cleanly: FINISHED, its `status` tag says pruned.
_STATUS = {"completed": "FINISHED", "pruned": "FINISHED", "failed": "FAILED", "preempted": "KILLED"}


def tracking_uri(spec: schema.MlflowLogger, *, home: Path) -> str:
    """The store this run logs to: the config's, else MLFLOW_TRACKING_URI, else a sqlite file in
    `home` (the sweep dir in a multirun, else the run dir)."""
    return (
        spec.tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{(home / DEFAULT_STORE).resolve()}"
    )


class MlflowTracker:
    """Args:
    spec: the `logger.mlflow` config.
    config: the public (redacted, resolved) config: the run's params.
    run_dir: the run directory.
    history: the run's history rows so far (`EpochHistory.rows`: history.csv's).
    sweep_dir: the sweep's directory when this run is a sweep job (a child of its parent run).
    resume: the training run continues an earlier start: continue its MLflow run too.
    """

    def __init__(
        self,
        spec: schema.MlflowLogger,
        *,
        config: Mapping[str, Any],
        run_dir: Path,
        history: Callable[[], list[dict[str, float]]],
        sweep_dir: Path | None = None,
        resume: bool = False,
    ):
        quiet_logs()
        self.spec, self.run_dir, self.sweep_dir = spec, run_dir, sweep_dir
        self.history = history
        self.params = flatten(config)
        public = (config.get("logger") or {}).get("mlflow") or {}
        self.tags = {str(k): str(tag_text(v)) for k, v in (public.get("tags") or {}).items()}
        self.run_name = public.get("run_name") or _default_name(run_dir, sweep_dir)
        self.experiment = public.get("experiment", spec.experiment)
        self.uri = tracking_uri(spec, home=sweep_dir or run_dir)
        self.local = False  # logging to RUN_DIR/mlflow/local.db after the server was away
        self.logged: list[Callable[[], None]] = []  # replayed into the local record
        self._client = None
        self.run_id: str | None = None
        self.disabled = False  # neither the store nor the local record could be written
        previous = _record(run_dir / RECORD_DIR / RUN_FILE) if resume else {}
        self._call(lambda: self._open(previous))

    # --- the run --------------------------------------------------------------------------------
    def _open(self, previous: Mapping[str, Any]) -> None:
        from mlflow.entities import RunStatus

        if previous.get("local"):
            self._switch_to_local()  # the earlier start logged locally: continue that record
        # A sweep's jobs may start at once (joblib workers, SLURM jobs): one of them at a time
        # creates the store (two racing through MLflow's table migrations fail), the experiment
        # and the parent run.
        with self._sweep_lock():
            client = self.client()
            experiment_id = experiment_of(client, self.experiment, self.uri)
            parent = self._parent(client, experiment_id) if not self.local else None
        tags = {
            **self.tags,
            "strategy": str(self.params.get("strategy.name")),
            **_git_commit(),
            "status": "running",
        }
        if parent:
            tags["mlflow.parentRunId"] = parent
        run_id = previous.get("run_id")
        if run_id and _same_store(previous, self.uri):
            client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            self._log_params(client, run_id, resumed=True)
        else:
            run_id = client.create_run(experiment_id, run_name=self.run_name, tags=tags).info.run_id
            self._log_params(client, run_id, resumed=False)
        self._confine(client, run_id)
        client.set_tag(run_id, "status", "running")
        self.run_id, self.experiment_id = run_id, experiment_id
        record = {
            "run_id": run_id,
            "experiment_id": experiment_id,
            "tracking_uri": shown(self.uri),
            "local": self.local,
            "parent_run_id": parent,
        }
        files.library_dir(self.run_dir / RECORD_DIR)
        files.write_atomic(self.run_dir / RECORD_DIR / RUN_FILE, json.dumps(record, indent=2))

    def _confine(self, client, run_id: str) -> None:
        """A store kept in this run's or sweep's dir (received with it: a local record, the
        default mlflow.db) is data: its run's artifacts must stay beside it
        (`mlflow_store.confine_artifacts`), else nothing is logged there."""
        store = store_file(self.uri)
        homes = [home.resolve() for home in (self.run_dir, self.sweep_dir) if home is not None]
        if store is None or not any(store.resolve().is_relative_to(h) for h in homes):
            return
        _check_store(store)
        location = client.get_run(run_id).info.artifact_uri
        confine_artifacts(location, store, what=f"logger.mlflow: the run {run_id} in {store}")

    def _log_params(self, client, run_id: str, *, resumed: bool) -> None:
        """The config as params; a resumed run logs the ones it did not have (MLflow refuses to
        change a param: a value a resume may change, e.g. loop.epochs, goes into a tag)."""
        from mlflow.entities import Param, RunTag

        had = client.get_run(run_id).data.params if resumed else {}
        params = [Param(k, v) for k, v in self.params.items() if k not in had]
        changed = [RunTag(f"resumed.{k}", v) for k, v in self.params.items() if had.get(k, v) != v]
        client.log_batch(run_id, params=params, tags=changed)

    def _sweep_lock(self) -> contextlib.AbstractContextManager:
        """SWEEP_DIR/mlflow/parent.lock held (a sweep job's), else nothing to hold."""
        if self.sweep_dir is None or self.local:
            return contextlib.nullcontext()
        files.library_dir(self.sweep_dir / RECORD_DIR)
        return _locked(self.sweep_dir / RECORD_DIR / "parent.lock")

    def _parent(self, client, experiment_id: str) -> str | None:
        """The sweep's parent run, opened by the first job (under `_sweep_lock`), in
        SWEEP_DIR/mlflow/parent.json."""
        if self.sweep_dir is None:
            return None
        record_dir = self.sweep_dir / RECORD_DIR
        parent = _record(record_dir / PARENT_FILE)
        if parent.get("run_id") and parent.get("tracking_uri") == shown(self.uri):
            return parent["run_id"]
        name = "/".join(self.sweep_dir.parts[-2:])
        run_id = client.create_run(
            experiment_id, run_name=name, tags={"sweep_dir": str(self.sweep_dir)}
        ).info.run_id
        record = {"run_id": run_id, "experiment_id": experiment_id, "tracking_uri": shown(self.uri)}
        files.write_atomic(record_dir / PARENT_FILE, json.dumps(record, indent=2))
        return run_id

    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            with short_timeouts(self.spec.timeout_s):
                self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    # --- logging, whatever the server does ------------------------------------------------------
    def _call(self, log_it: Callable[[], None], *, replay: bool = False) -> None:
        """Runs one logging step; when the store cannot be reached, warns once, moves to the local
        record and logs there everything this run logged so far, then this step."""
        if self.disabled:
            return
        if replay:
            self.logged.append(log_it)
        try:
            with short_timeouts(self.spec.timeout_s):
                log_it()
            return
        except ConfigError:  # a received record refused: no fallback logs beside it
            raise
        except Exception as error:
            if self.local:
                log.warning(
                    "MLflow: the local record %s failed: %s; no more MLflow logging for this run",
                    self._local_uri(),
                    error,
                )
                self.disabled = True
                return
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            log.warning(
                "MLflow: %s cannot be reached or written (%s); training goes on, logging to the local "
                "record %s (upload it later: tfrecipe mlflow-sync %s)",
                shown(self.uri),
                redact_text(reason),
                self.run_dir / RECORD_DIR / LOCAL_STORE,
                self.run_dir,
            )
        self._switch_to_local()
        try:
            self._open({})
            for step in self.logged:
                step()
            if not replay:
                log_it()
        except Exception as error:  # a full disk: the run goes on without MLflow
            log.warning(
                "MLflow: the local record failed too: %s; no more MLflow logging for this run",
                error,
            )
            self.disabled = True

    def _local_uri(self) -> str:
        return f"sqlite:///{(self.run_dir / RECORD_DIR / LOCAL_STORE).resolve()}"

    def _switch_to_local(self) -> None:
        files.library_dir(self.run_dir / RECORD_DIR)
        local = self.run_dir / RECORD_DIR / LOCAL_STORE
        if os.path.lexists(local):  # a resumed run's, or one received with the run dir
            _check_store(local)
        self.intended_uri = self.uri
        self.uri, self.local, self._client = self._local_uri(), True, None

    def log_epoch(self, row: Mapping[str, float]) -> None:
        """One row of history.csv: its columns as metrics at step = the epoch."""
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(row["epoch"])
        metrics = [Metric(k, float(v), now, step) for k, v in row.items() if k != "epoch"]
        self._call(lambda: self.client().log_batch(self.run_id, metrics=metrics), replay=True)

    def callbacks(self) -> list[keras.callbacks.Callback]:
        return [MlflowEpochLogger(self, self.history)]

    def finish(self, summary: dict[str, Any]) -> None:
        """The test metrics, throughput and perf numbers, the tags of how it ran, the artifacts
        (a completed run's), and the run's end status."""
        self._call(lambda: self._finish(summary))

    def _finish(self, summary: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag

        client, now = self.client(), int(time.time() * 1000)
        step = int(summary.get("epochs_completed") or 0)
        numbers = {f"test_{k}": v for k, v in (summary.get("test") or {}).items()}
        numbers |= {k: summary.get(k) for k in ("examples_per_sec", "wall_time_s")}
        numbers |= {f"perf.{k}": v for k, v in flatten(summary.get("perf") or {}).items()}
        metrics = [
            Metric(k, float(v), now, step)
            for k, v in numbers.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        ]
        status = str(summary.get("status", "failed"))
        tags = {
            "status": status,
            "strategy": str(summary.get("strategy")),
            "replicas": str(summary.get("num_replicas")),
        }
        client.log_batch(self.run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])
        if self.spec.log_artifacts and status == "completed":
            for name in _ARTIFACTS:
                path = self.run_dir / name
                if path.is_dir():
                    client.log_artifacts(self.run_id, str(path), artifact_path=name)
                elif path.is_file():
                    client.log_artifact(self.run_id, str(path))
        client.set_terminated(self.run_id, status=_STATUS.get(status, "FAILED"))


class MlflowEpochLogger(keras.callbacks.Callback):
    """Logs each epoch's history row (history.csv's, so both hold the same numbers): it runs
    after `EpochHistory` in the callback list."""

    reads_logs_only = True  # may watch a group of epochs in one call (loops.epoch_groups)

    def __init__(self, tracker: MlflowTracker, rows: Callable[[], list[dict[str, float]]]):
        super().__init__()
        self.tracker, self.rows = tracker, rows

    def on_epoch_end(self, epoch, logs=None):
        rows = self.rows()
        if rows:
            self.tracker.log_epoch(rows[-1])


def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: `a.b.c` -> the value as text (lists as YAML shows them),
    cut to MLflow's 6000 characters."""
    flat: dict[str, str] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat |= flatten(value, f"{name}.")
        else:
            text = json.dumps(value) if isinstance(value, list | dict | bool | None) else str(value)
            flat[name] = text[:6000]
    return flat


def _record(path: Path) -> dict[str, Any]:
    """`read_record`, a record that cannot be read refused as a config error (one line)."""
    try:
        return read_record(path)
    except reading.UnreadableFile as error:
        raise ConfigError(f"logger.mlflow: {error}") from None


def _check_store(path: Path) -> None:
    try:
        check_local_store(path)
    except reading.UnreadableFile as error:
        raise ConfigError(f"logger.mlflow: {error}") from None


def _same_store(previous: Mapping[str, Any], uri: str) -> bool:
    return previous.get("tracking_uri") == shown(uri)


def _default_name(run_dir: Path, sweep_dir: Path | None) -> str:
    if sweep_dir is not None and run_dir.resolve().is_relative_to(sweep_dir.resolve()):
        return f"job {run_dir.resolve().relative_to(sweep_dir.resolve())}"
    return "/".join(run_dir.parts[-2:])


def _git_commit() -> dict[str, str]:
    """The git commit of the directory the run started in (a user's project), when it is a
    checkout: `git_sha` and MLflow's own source tag. Read from git's files: no `git` runs in a
    folder tfrecipe did not make (provenance.git)."""
    from tfrecipe.perf.provenance import git

    sha = (git(Path.cwd()) or {}).get("sha")
    return {"git_sha": sha, "mlflow.source.git.commit": sha} if sha else {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
