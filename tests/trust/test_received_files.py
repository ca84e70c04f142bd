"""A received run or sweep dir is data: its files are read through the one reader (a link to
/dev/zero or a FIFO is refused with one line, never read), and the paths they name stay inside
the dir they came with. Built by hand, no training."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tfrecipe import reading, rundir
from tfrecipe.cli import compare
from tfrecipe.cli.sweep_report import SweepSetup, write_report
from tfrecipe.errors import ConfigError


def _job(sweep: Path, number: int, model: str, accuracy: float) -> Path:
    run_dir = sweep / str(number)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(f"- model={model}\n")
    summary = {"status": "completed", "metrics": {"val_accuracy": accuracy}, "wall_time_s": 1.0}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "history.csv").write_text(f"epoch,val_accuracy\n0,{accuracy}\n")
    return run_dir


def _plan(sweep: Path) -> SweepSetup:
    return SweepSetup(sweep, "val_accuracy", "max", "task=classification's main metric")


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _zero_link(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize("make", [_zero_link, _fifo], ids=["link-to-dev-zero", "fifo"])
def test_compare_refuses_a_sweep_json_that_is_no_regular_file(tmp_path, make):
    sweep = tmp_path / "sweep"
    _job(sweep, 0, "mlp", 0.9)
    make(sweep / "sweep.json")
    with pytest.raises(ConfigError) as refused:
        compare.main([str(sweep)])
    (line,) = refused.value.report().splitlines()
    assert "sweep.json" in line and "must be a regular file" in line


@pytest.mark.parametrize("make", [_zero_link, _fifo], ids=["link-to-dev-zero", "fifo"])
def test_a_sweeps_end_reads_no_device_or_fifo_left_as_sweep_json(tmp_path, make):
    """The report at a sweep's end reads the earlier sweep.json through the one reader: a link
    to /dev/zero or a FIFO there is no earlier report (it returns, it neither grows nor hangs)."""
    from tfrecipe.cli.sweep_report import _read

    sweep = tmp_path / "sweep"
    _job(sweep, 0, "mlp", 0.9)
    assert _read(make(sweep / "sweep.json")) == {}


@pytest.mark.parametrize("make", [_zero_link, _fifo], ids=["link-to-dev-zero", "fifo"])
def test_an_mlflow_record_that_is_no_regular_file_is_refused(tmp_path, make):
    from tfrecipe.tracking.mlflow_store import read_record

    (tmp_path / "mlflow").mkdir()
    with pytest.raises(reading.UnreadableFile, match="must be a regular file"):
        read_record(make(tmp_path / "mlflow" / "run.json"))


def test_compare_reads_a_sweep_that_logged_to_mlflow(tmp_path, capsys):
    """MLflow's artifact store in the sweep dir holds copies of the jobs' summary.json: they are
    no runs, and their folder names beside job numbers sort without a TypeError."""
    sweep = tmp_path / "sweep"
    for number, (model, accuracy) in enumerate([("mlp", 0.8), ("cnn", 0.9)]):
        run_dir = _job(sweep, number, model, accuracy)
        copy = sweep / "mlartifacts" / "1" / f"run{number}" / "artifacts"
        copy.mkdir(parents=True)
        (copy / "summary.json").write_text((run_dir / "summary.json").read_text())
    (sweep / "mlflow").mkdir()
    (sweep / "mlflow" / "parent.json").write_text('{"run_id": "abc"}')
    write_report(_plan(sweep), invocation={})

    compare.main([str(sweep)])
    out = capsys.readouterr().out
    assert "2 runs, sorted by val_accuracy" in out
    assert "mlartifacts" not in out


def _local_record(run_dir: Path, artifacts: Path) -> str:
    """RUN_DIR/mlflow/local.db whose experiment keeps its artifacts in `artifacts`, and a
    run.json naming its run as a local record."""
    from mlflow.tracking import MlflowClient

    (run_dir / "mlflow").mkdir(parents=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow' / 'local.db'}")
    experiment = client.create_experiment("tfrecipe", artifact_location=artifacts.as_uri())
    run_id = client.create_run(experiment, run_name="received").info.run_id
    record = {"run_id": run_id, "experiment_id": experiment, "local": True}
    (run_dir / "mlflow" / "run.json").write_text(json.dumps(record))
    return run_id


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A folder of the user's, outside every run dir (a stand-in for ~/.ssh or a project)."""
    folder = tmp_path_factory.mktemp("home") / ".ssh"
    folder.mkdir(parents=True)
    (folder / "id_ed25519").write_text("PRIVATE KEY")
    (folder / "config.yaml").write_text("mine: true\n")
    (folder / "history.csv").write_text("mine\n")
    return folder


@pytest.fixture(scope="module")
def forged(tmp_path_factory, outside) -> Path:
    """A received run dir whose local MLflow record keeps its artifacts in `outside` (made once:
    MLflow's table migrations take seconds)."""
    pytest.importorskip("mlflow")
    run_dir = tmp_path_factory.mktemp("forged") / "received"
    _local_record(run_dir, outside)
    (run_dir / "config.yaml").write_text("model: {name: mlp}\n")
    return run_dir


@pytest.fixture
def received(tmp_path, forged) -> Path:
    import shutil

    return Path(shutil.copytree(forged, tmp_path / "received"))


def test_mlflow_sync_refuses_a_record_whose_artifacts_lie_outside_its_run_dir(
    tmp_path, outside, received
):
    from tfrecipe.cli.commands import mlflow_sync

    run_dir = received
    target = f"sqlite:///{tmp_path / 'target.db'}"

    with pytest.raises(ConfigError) as refused:
        mlflow_sync([str(run_dir), "--tracking-uri", target])
    (line,) = refused.value.report().splitlines()
    assert str(outside) in line and "outside" in line
    assert not (tmp_path / "target.db").exists()  # nothing uploaded: the store never opened
    assert json.loads((run_dir / "mlflow" / "run.json").read_text())["local"] is True


def test_resuming_a_received_run_never_writes_into_its_records_outside_folder(outside, received):
    from tfrecipe.config.run_sections import MlflowLogger
    from tfrecipe.tracking.mlflow_run import MlflowTracker

    run_dir = received
    before = {p.name: p.read_text() for p in outside.iterdir()}

    with pytest.raises(ConfigError, match="outside") as refused:
        MlflowTracker(
            MlflowLogger(),
            config={"model": {"name": "mlp"}},
            run_dir=run_dir,
            history=lambda: [],
            resume=True,
        )
    assert len(refused.value.report().splitlines()) == 1
    assert {p.name: p.read_text() for p in outside.iterdir()} == before


def test_resuming_with_a_run_json_that_is_a_link_to_dev_zero_is_one_line(tmp_path):
    pytest.importorskip("mlflow")
    from tfrecipe.config.run_sections import MlflowLogger
    from tfrecipe.tracking.mlflow_run import MlflowTracker

    run_dir = tmp_path / "received"
    (run_dir / "mlflow").mkdir(parents=True)
    _zero_link(run_dir / "mlflow" / "run.json")
    with pytest.raises(ConfigError, match="must be a regular file"):
        MlflowTracker(MlflowLogger(), config={}, run_dir=run_dir, history=lambda: [], resume=True)


def test_a_sparse_4_gb_manifest_is_refused_without_reading_it(tmp_path):
    from tfrecipe import files

    run_dir = tmp_path / "received"
    run_dir.mkdir()
    with (run_dir / files.MANIFEST).open("wb") as manifest:
        manifest.truncate(4 << 30)  # sparse: no disk, 4 GB to a reader
    with pytest.raises(files.NotOurs, match=r"more than a run's manifest can be"):
        files.Manifest.of(run_dir).owned()


def test_a_stall_record_the_run_did_not_write_is_not_the_runs_stall(tmp_path):
    from tfrecipe import files
    from tfrecipe.fault.watchdog import _HEADER, recorded_stalls

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = {"worker": "worker-7", "step": 3, "idle_s": 900.0, "timeout_s": 300.0}
    record |= {"attempt": 0, "time": "2026-11-28T00:00:00+00:00"}
    for name in ("stall-worker-7.txt", "stall-worker-1.txt"):
        text = _HEADER + json.dumps({**record, "stack_file": name}) + "\n"
        (run_dir / name).write_text(text)
    # the watchdog's own record: the run wrote it
    files.Manifest.of(run_dir).claim(["stall-worker-1.txt"])

    stalls = recorded_stalls(rundir.RunFiles(run_dir))
    assert [stall["stack_file"] for stall in stalls] == ["stall-worker-1.txt"]


def test_lr_find_refuses_a_run_dir_that_holds_another_run(tmp_path, compose_cfg):
    """`tfrecipe lr-find` into a preempted run's dir would end it `completed`: it could never
    resume. Refused before anything is written."""
    from tfrecipe.config.trust import Trust
    from tfrecipe.train import train

    run_dir = tmp_path / "preempted"
    run_dir.mkdir()
    summary = json.dumps({"status": "preempted", "epochs_completed": 3})
    (run_dir / "summary.json").write_text(summary)
    overrides = ["loop.lr_find.enabled=true", "loop.lr_find.only=true"]

    with pytest.raises(ConfigError) as refused:
        train(compose_cfg(*overrides), run_dir=run_dir, trust=Trust.from_command_line(overrides))
    (line,) = refused.value.report().splitlines()
    assert "holds another run" in line and "status=preempted" in line
    assert (run_dir / "summary.json").read_text() == summary
    assert sorted(p.name for p in run_dir.iterdir()) == ["summary.json"]


def test_a_sweep_into_a_locked_run_dir_writes_nothing_there(tmp_path, cli):
    import subprocess
    import sys

    run_dir = tmp_path / "training"
    run_dir.mkdir()
    hold = (
        "import fcntl, os, sys; d = os.open(sys.argv[1], os.O_RDONLY); "
        "fcntl.flock(d, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        result = cli("-m", "model=mlp,cnn", f"hydra.sweep.dir={run_dir}", "loop.epochs=1")
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert "hydra.sweep.dir=" in line and "locked" in line
    assert list(run_dir.iterdir()) == []


@pytest.mark.parametrize("make", [_zero_link, _fifo], ids=["link-to-dev-zero", "fifo"])
def test_a_resumed_history_csv_that_is_no_regular_file_is_refused(tmp_path, make):
    from tfrecipe import rundir

    make(tmp_path / "history.csv")
    with pytest.raises(reading.UnreadableFile, match=r"must be a regular file") as refused:
        rundir.RunFiles(tmp_path).history()
    assert len(str(refused.value).splitlines()) == 1
    assert rundir.RunFiles(tmp_path / "nowhere").history() == []
