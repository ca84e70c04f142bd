"""MLflow stores, apart from a training run (no Keras here): the records tfrecipe keeps of its
MLflow runs, closing a sweep's parent run with its winner, uploading a local record kept while a
tracking server was away (`tfrecipe mlflow-sync`). tfrecipe.tracking.mlflow_run logs the runs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from tfrecipe import files, reading
from tfrecipe.config.secrets import redact_text
from tfrecipe.errors import ConfigError

log = logging.getLogger("tfrecipe")

RECORD_DIR = "mlflow"  # in the run dir and the sweep dir
RUN_FILE = "run.json"  # RUN_DIR/mlflow/run.json: the MLflow run this training run logs to
PARENT_FILE = "parent.json"  # SWEEP_DIR/mlflow/parent.json: the sweep's parent run
LOCAL_STORE = "local.db"  # RUN_DIR/mlflow/local.db: the record kept while a server is away
DEFAULT_STORE = "mlflow.db"  # in the sweep or run dir when no tracking URI is given

# MLflow's own defaults wait 120 s per request and retry 7 times with backoff (minutes) before
# a server counts as away; a run that cannot log should go on within seconds.
_RETRIES = "2"
# run.json and parent.json hold a few ids; a local record holds one run's params and metrics.
MAX_RECORD_BYTES = 1 * reading.MiB
MAX_LOCAL_STORE_BYTES = 4 * reading.GiB


def shown(uri: str) -> str:
    """A tracking URI as a message or record may show it: no user or password, no secret value."""
    parts = urlsplit(uri)
    if parts.password or parts.username:
        host = parts.hostname or ""
        uri = urlunsplit(parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host))
    return redact_text(uri)


def close_sweep(sweep_dir: Path, report: Mapping[str, Any], uri: str) -> None:
    """Ends the sweep's parent run (where its jobs opened one) with the winner: tags naming the
    best job, its metric and its MLflow run, sweep.json and sweep.png as artifacts.

    Args:
      uri: the store the sweep's config names (never one read from the sweep dir's files: they
        are data); a parent record of another store is left alone.
    """
    best = report.get("best") or {}
    try:
        parent = read_record(sweep_dir / RECORD_DIR / PARENT_FILE)
        if parent.get("tracking_uri") != shown(uri) or not parent.get("run_id"):
            return
        quiet_logs()
        from mlflow.entities import RunTag
        from mlflow.tracking import MlflowClient

        with short_timeouts(10):
            client = MlflowClient(tracking_uri=uri)
            tags = {key: report.get(key) for key in ("metric", "direction")}
            tags["jobs"] = len(report.get("jobs") or [])
            if best:
                child = read_record(Path(best["run_dir"]) / RECORD_DIR / RUN_FILE)
                tags |= {
                    "best_job": best.get("job"),
                    "best_value": best.get(report["metric"]),
                    "best_command": best.get("command"),
                    "best_run_id": child.get("run_id"),
                }
            client.log_batch(
                parent["run_id"], tags=[RunTag(k, str(v)) for k, v in tags.items() if v is not None]
            )
            for name in ("sweep.json", "sweep.png"):
                if (sweep_dir / name).is_file():
                    client.log_artifact(parent["run_id"], str(sweep_dir / name))
            client.set_terminated(parent["run_id"], status="FINISHED")
    except Exception as error:  # the sweep's results are on disk whatever MLflow does
        log.warning("MLflow: the sweep's parent run was not closed (%s): %s", shown(uri), error)


def sync_local_record(run_dir: Path, uri: str) -> str:
    """Uploads the local record a run kept while its server was away (RUN_DIR/mlflow/local.db)
    to the store at `uri`: a new run there with the same name, tags, params, every metric's
    history, artifacts and end status. RUN_DIR/mlflow/run.json then names that run (a resumed
    training run continues it). Returns the new run's id.

    Raises:
      ValueError: the run dir holds no local record (nothing to upload).
    """
    quiet_logs()
    from mlflow.tracking import MlflowClient

    record = read_record(run_dir / RECORD_DIR / RUN_FILE)
    local_db = run_dir / RECORD_DIR / LOCAL_STORE
    if not record.get("local") or not os.path.lexists(local_db):
        raise ValueError(
            f"{run_dir}: no local MLflow record to upload ({RECORD_DIR}/{RUN_FILE} "
            "names a run already in its store)"
        )
    check_local_store(local_db)
    local = MlflowClient(tracking_uri=f"sqlite:///{local_db.resolve()}")
    run = local.get_run(str(record["run_id"]))
    confine_artifacts(run.info.artifact_uri, local_db, what=f"{local_db}'s run")
    experiment = local.get_experiment(run.info.experiment_id).name
    with short_timeouts(10):
        target = MlflowClient(tracking_uri=uri)
        experiment_id = experiment_of(target, experiment, uri)
        new = _copy_run(local, run, target, experiment_id)
    record.update(
        run_id=new,
        experiment_id=experiment_id,
        tracking_uri=shown(uri),
        local=False,
        synced_from_local_run=run.info.run_id,
    )
    files.write_atomic(run_dir / RECORD_DIR / RUN_FILE, json.dumps(record, indent=2))
    return new


def _copy_run(local, run, target, experiment_id: str) -> str:
    """A new run in `target`'s experiment with `run`'s name, tags, params, metric histories,
    artifacts and end status; returns its id."""
    import tempfile

    from mlflow.entities import Metric, Param, RunTag

    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
    new = target.create_run(
        experiment_id, start_time=run.info.start_time, run_name=run.info.run_name, tags=tags
    ).info.run_id
    metrics = [
        Metric(m.key, m.value, m.timestamp, m.step)
        for key in run.data.metrics
        for m in local.get_metric_history(run.info.run_id, key)
    ]
    params = [Param(k, v) for k, v in run.data.params.items()]
    target.log_batch(
        new, metrics=metrics, params=params, tags=[RunTag("synced_from_local_run", run.info.run_id)]
    )
    with tempfile.TemporaryDirectory(prefix="tfrecipe-mlflow-sync-") as scratch:
        if local.list_artifacts(run.info.run_id):
            local.download_artifacts(run.info.run_id, "", scratch)
            target.log_artifacts(new, scratch)
    if run.info.status != "RUNNING":
        target.set_terminated(new, status=run.info.status, end_time=run.info.end_time)
    return new


def experiment_of(client, name: str, uri: str) -> str:
    """The experiment's id, created when missing; a sqlite store keeps its artifacts beside
    the database file (MLflow's default is ./mlruns in whatever directory the run started)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another job created it meanwhile
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def read_record(path: Path) -> dict[str, Any]:
    """An MLflow record of a run or sweep dir (run.json, parent.json) through the one reader;
    {} where there is none.

    Raises:
      reading.UnreadableFile: not a regular file of a record's size (a link to /dev/zero, a
        FIFO), or not JSON.
    """
    try:
        value = reading.read_json(path, limit=MAX_RECORD_BYTES, what="an MLflow record")
    except FileNotFoundError:
        return {}
    return value if isinstance(value, dict) else {}


def check_local_store(path: Path) -> None:
    """A run dir's MLflow database is a regular file of a record's size before sqlite opens it
    (sqlite would read a FIFO or a device as the database).

    Raises:
      reading.UnreadableFile: as `reading.check_file`.
    """
    reading.check_file(path, limit=MAX_LOCAL_STORE_BYTES, what="an MLflow local record")


def store_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///FILE` tracking URI, else None."""
    return Path(unquote(uri.removeprefix("sqlite:///"))) if uri.startswith("sqlite:///") else None


def confine_artifacts(artifact_uri: str, store: Path, *, what: str) -> None:
    """A store kept in a run or sweep dir (a local record, the default `mlflow.db`) keeps its
    artifacts beside it: its run's artifact location must be a folder inside the store's own
    folder. A received record naming another (`~/.ssh`, a project folder, a bucket) would have
    tfrecipe upload that folder or overwrite files in it.

    Raises:
      ConfigError: the location is elsewhere, or not a local folder.
    """
    home = store.resolve().parent
    parts = urlsplit(artifact_uri)
    local = parts.scheme in ("", "file") and not parts.netloc
    if local and Path(unquote(parts.path)).resolve().is_relative_to(home):
        return
    raise ConfigError(
        f"{what}: MLflow artifact location {artifact_uri!r} is outside {home} (a store kept in "
        "a run or sweep dir keeps its artifacts beside it); the record was not written by "
        "tfrecipe here: remove its mlflow/ folder or log to another store"
    )


@contextlib.contextmanager
def short_timeouts(seconds: float) -> Iterator[None]:
    """MLflow reads its HTTP timeout and retries from the environment on each request: a few
    seconds and 2 retries while tfrecipe logs (a user's own settings win)."""
    wanted = {
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, round(seconds))),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": _RETRIES,
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    }
    added = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def quiet_logs() -> None:
    """MLflow's and alembic's INFO lines (creating the database tables, ...) in every job's log
    say nothing a user acts on; their warnings still show. (After the import: importing mlflow
    configures its logger.)"""
    import mlflow  # noqa: F401

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
