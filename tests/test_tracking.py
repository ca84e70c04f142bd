"""W&B tracking for real, offline: the run files W&B writes are read back and checked."""

from __future__ import annotations

import csv

import pytest
from helpers import wandb_records
from helpers.failing_callback import fail_after_first_epoch

from tfrecipe.config.trust import Trust
from tfrecipe.train import TrainingError

WANDB = ["logger=[wandb]", "logger.wandb.mode=offline", "logger.wandb.log_every_n_steps=1"]


@pytest.fixture(autouse=True)
def _wandb_offline_env(monkeypatch, tmp_path):
    wandb_records.keep_local(monkeypatch, tmp_path)


def test_offline_run_logs_resolved_config_and_summary(train_run):
    summary, run_dir = train_run(*WANDB, "model=mlp", "batching.per_replica_batch_size=24")

    config = wandb_records.config(run_dir)
    assert config["strategy"]["name"] == "default"
    assert config["model"]["_target_"] == "tfrecipe.models.mlp"
    assert config["batching"]["per_replica_batch_size"] == 24
    logged = wandb_records.summary(run_dir)
    assert logged["status"] == "completed"
    assert logged["metrics"]["val_loss"] == pytest.approx(summary["metrics"]["val_loss"])
    assert logged["steps_completed"] == summary["steps_completed"] == 6
    assert "epoch/loss" in logged  # per-epoch metrics from WandbMetricsLogger
    # where the time went and where it ran, as in summary.json
    assert logged["perf"]["mfu"] == pytest.approx(summary["perf"]["mfu"])
    assert logged["provenance"]["cpu"] == summary["provenance"]["cpu"]
    assert wandb_records.exit_code(run_dir) == 0


def test_step_metrics_reach_wandb_every_n_steps_with_several_steps_per_call(train_run):
    """4-step epochs, W&B every 2 steps: 2 steps per call (auto), and the steps logged are the
    optimizer's 2, 4, 6, 8, with steps.csv's learning rates under a warm-up schedule (W&B's own
    batch logging saw batch indices 1, 3 and never logged)."""
    summary, run_dir = train_run(
        *WANDB,
        "logger=[csv,wandb]",
        "logger.csv.every_n_steps=2",
        "logger.wandb.log_every_n_steps=2",
        "loop.steps_per_epoch=4",
        "optimizer.schedule=warmup_cosine",
        "optimizer.warmup_steps=8",
    )
    assert summary["steps_per_execution"] == 2
    history = wandb_records.history(run_dir)
    steps = [row for row in history if "batch/step" in row]
    assert [row["batch/step"] for row in steps] == [2, 4, 6, 8]
    assert [row["batch/epoch"] for row in steps] == [1, 1, 2, 2]
    assert all({"batch/loss", "batch/accuracy", "batch/learning_rate"} <= set(row) for row in steps)
    with open(run_dir / "steps.csv", newline="") as file:
        rates = {int(row["step"]): float(row["learning_rate"]) for row in csv.DictReader(file)}
    assert [row["batch/learning_rate"] for row in steps] == pytest.approx(list(rates.values()))
    epochs = [row for row in history if "epoch/epoch" in row]
    assert [row["epoch/epoch"] for row in epochs] == [0, 1]
    assert "epoch/val_loss" in epochs[-1] and "epoch/accuracy" in epochs[-1]
    # the rate of the step after each epoch's last (4 and 8), rising in the warm-up
    assert [row["epoch/learning_rate"] for row in epochs] == pytest.approx([rates[4], rates[8]])
    assert rates[4] < rates[8]


def test_wandb_mode_from_the_environment_is_followed(train_run, monkeypatch):
    """WANDB_MODE=offline (hydra.job.env_set allows it) with logger.wandb.mode left alone: an
    offline run. The config's default, passed to wandb.init, overrode it: the run went online
    (without an API key: "No API key configured", the training failed)."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.teardown()  # W&B reads the environment once per process: as a new process would
    summary, run_dir = train_run("logger=[wandb]")
    assert summary["status"] == "completed"
    assert list((run_dir / "wandb").glob("offline-run-*"))


def test_failed_training_still_finishes_the_wandb_run(train_run, tmp_path):
    with pytest.raises(TrainingError, match="deliberate failure"):
        train_run(
            *WANDB,
            "+callbacks.extra.boom._target_=helpers.failing_callback.FailAfterFirstEpoch",
            "allowed_targets=[helpers]",
        )
    run_dir = tmp_path / "run0"  # train_run's first run
    assert wandb_records.summary(run_dir)["status"] == "failed"
    assert wandb_records.exit_code(run_dir) == 1


def test_secrets_never_reach_saved_configs_logs_or_wandb(train_run, monkeypatch):
    secret = "s3cr3t-token-value-42"
    monkeypatch.setenv("TFRECIPE_TEST_TOKEN", secret)
    _, run_dir = train_run(
        *WANDB,
        "+callbacks.extra.quiet._target_=helpers.failing_callback.Quiet",
        "+callbacks.extra.quiet.api_key=${oc.env:TFRECIPE_TEST_TOKEN}",
        "allowed_targets=[helpers]",
    )
    assert "api_key: '***'" in (run_dir / "config.yaml").read_text()
    leaks = [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaks == []


@pytest.mark.slow
def test_two_workers_make_exactly_one_wandb_run(tmp_path):
    from conftest import TINY
    from helpers.launch import launching

    run_dir = tmp_path / "run"
    for launch in launching(tmp_path):
        run = launch(
            "strategy=multi_worker_mirrored",
            "cluster=local",
            "cluster.num_workers=2",
            *TINY,
            *WANDB,
            f"hydra.run.dir={run_dir}",
            env={"WANDB_SILENT": "false"},  # each W&B run then says where its files are
        )
        assert run.finish() == 0, run.output[-4000:]
    announced = [line for line in run.output.splitlines() if "wandb sync" in line]
    assert len(announced) == 1 and announced[0].startswith("[worker 0]"), announced
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 1
    assert wandb_records.summary(run_dir)["num_replicas"] == 2
    # The other worker trained into a scratch dir it deleted, and started no W&B run anywhere.
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "wandb").exists()


@pytest.mark.heavy
def test_a_resumed_run_continues_its_wandb_run(compose_cfg, tmp_path):
    """A run that failed after a backup, started again in its run dir, logs into the same W&B
    run (offline: a second folder with the same run id, which `wandb sync --append` joins)."""
    from tfrecipe.train import train

    run_dir = tmp_path / "run"
    overrides = [
        *WANDB,
        "loop.epochs=2",
        "loop.steps_per_epoch=5",
        "callbacks.backup.enabled=true",
        "callbacks.backup.every_n_steps=3",
    ]
    fail_after_first_epoch(compose_cfg, run_dir, overrides)
    run_id = (run_dir / "wandb" / "run_id").read_text()

    summary = train(
        compose_cfg(*overrides), run_dir=run_dir, trust=Trust.from_command_line(overrides)
    )

    assert summary["resumed_from_step"] == 3
    starts = sorted(run_dir.glob("wandb/offline-run-*"))
    assert len(starts) == 2 and all(p.name.endswith(f"-{run_id}") for p in starts)
    assert (run_dir / "wandb" / "run_id").read_text() == run_id
