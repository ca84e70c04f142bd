"""MLflow for real: a sqlite store, and one `mlflow server` on 127.0.0.1 this module starts. What
MLflow holds is read back with its own client and compared with the run dir's files; TensorBoard's
HParams records are read back from the event files."""

from __future__ import annotations

import csv
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import TINY
from helpers.failing_callback import fail_after_first_epoch
from test_cli import assert_refused

from tfrecipe.config.trust import Trust

pytest.importorskip("mlflow", reason='logger=mlflow needs pip install "tfrecipe[tracking]"')

MLFLOW = ["logger=[csv,mlflow,tensorboard]"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real tracking server (sqlite behind it, artifacts proxied into a temp dir)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    log_file = (root / "server.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'server.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=root,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=1) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        assert server.poll() is None, (root / "server.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "mlflow server did not start"
        time.sleep(0.2)
    yield uri
    server.terminate()
    server.wait(timeout=30)
    log_file.close()


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _history(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "history.csv").open(newline="") as rows:
        return list(csv.DictReader(rows))


def _epochs_in_mlflow(client, run_id: str, names) -> dict[str, list[tuple[int, float]]]:
    """Each metric's last value per step (a resumed run logs the epoch it trains again)."""
    logged = {}
    for name in names:
        last = {m.step: m.value for m in client.get_metric_history(run_id, name)}
        logged[name] = sorted(last.items())
    return logged


def _matches_history(client, run_id: str, run_dir: Path) -> None:
    rows = _history(run_dir)
    names = [name for name in rows[0] if name != "epoch"]
    expected = {n: [(int(r["epoch"]), float(r[n])) for r in rows if r[n]] for n in names}
    logged = _epochs_in_mlflow(client, run_id, names)
    assert logged.keys() == expected.keys()
    for name in names:
        assert logged[name] == expected[name], name  # the same floats, to the bit


def _hparams(run_dir: Path) -> dict:
    """The HParams session a run wrote into RUN_DIR/tensorboard, and its hparams/* scalars."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    (start,) = [
        metadata.parse_session_start_info_plugin_data(c)
        for t, c in content.items()
        if t == metadata.SESSION_START_INFO_TAG
    ]
    values = {k: v.ListFields()[0][1] for k, v in start.hparams.items()}
    scalars = {t: events.Tensors(t)[-1] for t in events.Tags()["tensors"] if "hparams/" in t}
    return {"hparams": values, "metrics": scalars}


def test_a_run_logs_its_config_epochs_test_metrics_tags_and_artifacts(train_run, monkeypatch):
    """The default store (RUN_DIR/mlflow.db): params are the redacted config, each epoch's
    metrics are history.csv's row, the test metrics and throughput follow; the secret is nowhere
    in the run dir, MLflow's database included. logger=tensorboard adds the HParams view."""
    secret = "s3cr3t-token-value-42"
    monkeypatch.setenv("TFRECIPE_TEST_TOKEN", secret)
    summary, run_dir = train_run(
        *MLFLOW,
        "model=mlp",
        "+logger.mlflow.tags.team=vision",
        "+callbacks.extra.quiet._target_=helpers.failing_callback.Quiet",
        "+callbacks.extra.quiet.api_key=${oc.env:TFRECIPE_TEST_TOKEN}",
        "allowed_targets=[helpers]",
    )
    record = json.loads((run_dir / "mlflow" / "run.json").read_text())
    client = _client(f"sqlite:///{run_dir / 'mlflow.db'}")
    run = client.get_run(record["run_id"])

    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["model._target_"] == "tfrecipe.models.mlp"
    assert params["loop.epochs"] == "2" and params["model.hidden_units"] == "[256, 256]"
    assert params["callbacks.extra.quiet.api_key"] == "***"
    _matches_history(client, run.info.run_id, run_dir)
    metrics = run.data.metrics
    assert metrics["test_accuracy"] == pytest.approx(summary["test"]["accuracy"])
    assert metrics["examples_per_sec"] == pytest.approx(summary["examples_per_sec"])
    tags = run.data.tags
    assert {k: tags[k] for k in ("status", "strategy", "replicas", "team")} == {
        "status": "completed",
        "strategy": "default",
        "replicas": "1",
        "team": "vision",
    }
    assert len(tags["git_sha"]) == 40  # the tests run in a checkout
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model.keras", "summary.json", "history.csv", "config.yaml"} <= artifacts
    leaks = [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaks == []

    view = _hparams(run_dir)  # a single run: every leaf of the config
    assert view["hparams"]["optimizer.learning_rate"] == float(params["optimizer.learning_rate"])
    assert view["hparams"]["model._target_"] == "tfrecipe.models.mlp"
    assert "hparams/val_accuracy" in view["metrics"] and "hparams/test_accuracy" in view["metrics"]


def test_a_number_or_boolean_typed_as_a_tag_is_logged_as_the_text_typed(
    train_run, monkeypatch, tmp_path
):
    """`+logger.mlflow.tags.team=42` and `logger.wandb.tags=[42,true]`: MLflow and W&B tags are
    text, and a value typed unquoted is taken as typed (the config check refused it, "input
    should be a valid string", though nothing said to quote it)."""
    from helpers import wandb_records

    wandb_records.keep_local(monkeypatch, tmp_path)
    _, run_dir = train_run(
        "logger=[mlflow,wandb]",
        "logger.wandb.mode=offline",
        "model=mlp",
        "loop.epochs=1",
        "+logger.mlflow.tags.team=42",
        "+logger.mlflow.tags.nightly=true",
        "logger.wandb.tags=[42,true,vision]",
    )
    record = json.loads((run_dir / "mlflow" / "run.json").read_text())
    tags = _client(f"sqlite:///{run_dir / 'mlflow.db'}").get_run(record["run_id"]).data.tags
    assert (tags["team"], tags["nightly"]) == ("42", "true")
    assert wandb_records.tags(run_dir) == ["42", "true", "vision"]


@pytest.mark.heavy
def test_a_resumed_run_continues_its_mlflow_run(compose_cfg, tmp_path):
    """A run that failed after a backup, started again in its run dir, logs into the same MLflow
    run: one run in the store, its epochs history.csv's, finished."""
    from tfrecipe.train import train

    run_dir = tmp_path / "run"
    overrides = [
        "logger=[csv,mlflow]",
        "logger.mlflow.log_artifacts=false",
        "loop.epochs=2",
        "loop.steps_per_epoch=5",
        "callbacks.backup.enabled=true",
        "callbacks.backup.every_n_steps=3",
    ]
    fail_after_first_epoch(compose_cfg, run_dir, overrides)
    first = json.loads((run_dir / "mlflow" / "run.json").read_text())["run_id"]
    client = _client(f"sqlite:///{run_dir / 'mlflow.db'}")
    assert client.get_run(first).info.status == "FAILED"

    summary = train(
        compose_cfg(*overrides), run_dir=run_dir, trust=Trust.from_command_line(overrides)
    )

    assert summary["resumed_from_step"] == 3
    assert json.loads((run_dir / "mlflow" / "run.json").read_text())["run_id"] == first
    (run,) = client.search_runs([client.get_run(first).info.experiment_id])
    assert run.info.run_id == first and run.info.status == "FINISHED"
    assert run.data.tags["status"] == "completed"
    _matches_history(client, first, run_dir)


def test_an_unreachable_server_warns_once_and_keeps_a_local_record_to_sync(
    train_run, mlflow_server, caplog, cli
):
    """Nothing listens at the tracking URI: training completes, one warning says where the
    record went, and `tfrecipe mlflow-sync` uploads it to a server later."""
    away = f"http://127.0.0.1:{_free_port()}"
    with caplog.at_level(logging.WARNING, logger="tfrecipe"):
        summary, run_dir = train_run(
            *MLFLOW, "model=mlp", f"logger.mlflow.tracking_uri={away}", "logger.mlflow.timeout_s=1"
        )
    assert summary["status"] == "completed"
    warnings = [r.getMessage() for r in caplog.records if "MLflow" in r.getMessage()]
    assert len(warnings) == 1 and "cannot be reached" in warnings[0], warnings
    assert "tfrecipe mlflow-sync" in warnings[0]
    record = json.loads((run_dir / "mlflow" / "run.json").read_text())
    assert record["local"] is True
    local = _client(f"sqlite:///{run_dir / 'mlflow' / 'local.db'}")
    _matches_history(local, record["run_id"], run_dir)

    synced = cli("mlflow-sync", str(run_dir), "--tracking-uri", mlflow_server)

    assert synced.returncode == 0, synced.stderr[-3000:]
    record = json.loads((run_dir / "mlflow" / "run.json").read_text())
    assert record["local"] is False
    server = _client(mlflow_server)
    run = server.get_run(record["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test_accuracy"] == pytest.approx(summary["test"]["accuracy"])
    _matches_history(server, record["run_id"], run_dir)
    assert "model.keras" in {a.path for a in server.list_artifacts(record["run_id"])}


def test_a_sweep_is_a_parent_run_with_a_child_per_job_and_hparams_per_job(
    cli, tmp_path, mlflow_server
):
    """A 6-job sweep against a real server: one parent run, six children, the parent names the
    winner sweep.json names; each job's TensorBoard holds its swept values."""
    sweep = tmp_path / "sweep"
    result = cli(
        "-m",
        *TINY,
        "loop.epochs=1",
        "loop.steps_per_epoch=2",
        "model=mlp",
        *MLFLOW,
        "logger.mlflow.experiment=sweeps",
        f"logger.mlflow.tracking_uri={mlflow_server}",
        "optimizer.learning_rate=0.001,0.01,0.1",
        "seed=1,2",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((sweep / "sweep.json").read_text())
    assert report["counts"] == {"completed": 6}

    client = _client(mlflow_server)
    experiment = client.get_experiment_by_name("sweeps").experiment_id
    runs = client.search_runs([experiment])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    (parent,) = parents
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 6 and len(runs) == 7
    assert sorted(r.info.run_name for r in children) == [f"job {n}" for n in range(6)]
    assert parent.info.status == "FINISHED"
    best = report["best"]
    assert parent.data.tags["best_job"] == str(best["job"])
    best_child = json.loads((Path(best["run_dir"]) / "mlflow" / "run.json").read_text())
    assert parent.data.tags["best_run_id"] == best_child["run_id"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {
        "sweep.json",
        "sweep.png",
    }
    assert "model.keras" in {a.path for a in client.list_artifacts(best_child["run_id"])}

    for job in report["jobs"]:
        view = _hparams(Path(job["run_dir"]))
        assert set(view["hparams"]) == {"optimizer.learning_rate", "seed"}
        assert view["hparams"]["optimizer.learning_rate"] == pytest.approx(
            float(job["overrides"]["optimizer.learning_rate"])
        )
        assert view["hparams"]["seed"] == float(job["overrides"]["seed"])


def test_the_file_store_is_refused_unless_mlflow_allows_it(compose_cfg, monkeypatch):
    from tests.helpers.configs import validate as validate_granting
    from tfrecipe.errors import ConfigError

    def validate(cfg):  # the URIs below are the command line's, as a user would type them
        uri = cfg.logger.mlflow.tracking_uri
        return validate_granting(cfg, granting=[f"logger.mlflow.tracking_uri={uri}"])

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    cfg = compose_cfg("logger=[mlflow]", "logger.mlflow.tracking_uri=file:///tmp/mlruns")
    with pytest.raises(ConfigError) as refused:
        validate(cfg)
    assert "logger.mlflow.tracking_uri" in str(refused.value)
    assert "MLFLOW_ALLOW_FILE_STORE=true" in str(refused.value)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert validate(cfg).logger.mlflow.tracking_uri == "file:///tmp/mlruns"
    unknown = compose_cfg("logger=[mlflow]", "logger.mlflow.tracking_uri=ftp://host/x")
    with pytest.raises(ConfigError, match="sqlite:///PATH"):
        validate(unknown)


@pytest.mark.parametrize("uri", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_a_sqlite_store_in_memory_is_refused(compose_cfg, uri):
    """SQLAlchemy opens these in memory: the run logged there was gone when it ended, and its
    run.json named a store nothing could read, without a word."""
    from tests.helpers.configs import validate
    from tfrecipe.errors import ConfigError

    cfg = compose_cfg("logger=[mlflow]", f"logger.mlflow.tracking_uri={uri}")
    with pytest.raises(ConfigError, match="in memory") as refused:
        validate(cfg, granting=[f"logger.mlflow.tracking_uri={uri}"])
    assert str(refused.value).startswith(f"logger.mlflow.tracking_uri={uri}: ")


def test_an_unusable_store_in_mlflow_tracking_uri_is_refused_before_training(cli, tmp_path):
    """MLFLOW_TRACKING_URI=sqlite:/// (a database in memory) was taken as the run's store: the
    run logged there, gone when it ended, where the same URI in the config is refused. The
    environment's is now checked as the config's: one line naming it, its password hidden, exit
    2, no run dir; also by a sweep and by `tfrecipe validate`."""
    run_dir = tmp_path / "run"
    memory = {"MLFLOW_TRACKING_URI": "sqlite:///"}
    args = ["logger=[mlflow]", *TINY, f"hydra.run.dir={run_dir}"]
    assert_refused(cli(*args, env=memory), run_dir, "MLFLOW_TRACKING_URI=sqlite:///: ", "in memory")
    sweep_dir = tmp_path / "sweep"
    sweep = cli(
        "-m", "logger=[mlflow]", *TINY, "seed=1,2", f"hydra.sweep.dir={sweep_dir}", env=memory
    )
    assert_refused(sweep, sweep_dir, "MLFLOW_TRACKING_URI=sqlite:///: ")
    password = {"MLFLOW_TRACKING_URI": "ftp://bob:hunter2xyz@127.0.0.1/x"}
    refused = cli("validate", "logger=[mlflow]", env=password)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "MLFLOW_TRACKING_URI='ftp://bob:***@127.0.0.1/x': expected a tracking URI" in (
        refused.stderr
    )
    assert "hunter2xyz" not in refused.stderr + refused.stdout
    # a store named in the config is the run's: the environment's is not used, nor checked
    named = cli(
        "validate", "logger=[mlflow]", "logger.mlflow.tracking_uri=sqlite:///x.db", env=memory
    )
    assert named.returncode == 0, named.stderr


def test_a_server_with_a_password_typed_on_the_command_line_is_the_command_lines(monkeypatch):
    """`logger.mlflow.tracking_uri=http://bob:PASSWORD@host` typed by the user: the run takes
    it (it was refused as a config file's, "pass logger.mlflow.tracking_uri=... yourself", since
    the command line hands a typed secret on as `${oc.env:TFRECIPE_TYPED_SECRET_N}`)."""
    from tfrecipe.config import schema
    from tfrecipe.config.compose import compose
    from tfrecipe.config.secrets import typed_by_reference

    uri = "http://bob:hunter2xyz@127.0.0.1:5000"
    environ: dict[str, str] = {}
    typed = typed_by_reference(["logger=[mlflow]", f"logger.mlflow.tracking_uri={uri}"], environ)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert uri not in " ".join(typed)
    run = schema.validate(compose(typed), trust=Trust.from_command_line(typed))
    assert run.logger.mlflow.tracking_uri == uri


def test_the_tracking_extra_leaves_pyarrow_as_tables_need_it():
    """mlflow-skinny, not the full mlflow (which pins pyarrow<26): installing the extra keeps
    the pyarrow tfrecipe requires."""
    import tomllib
    from importlib.metadata import requires, version

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert any(r.startswith("mlflow-skinny") for r in extras["tracking"])
    assert not any(
        r.split("<")[0].split(">")[0].strip() == "mlflow" for e in extras.values() for r in e
    )
    needed = [r for r in requires("mlflow-skinny") or [] if "extra ==" not in r]
    assert not any("pyarrow" in r for r in needed), needed
    assert int(version("pyarrow").split(".")[0]) >= 26
