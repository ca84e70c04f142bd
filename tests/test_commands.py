"""Subcommands (ls, cat, cp, validate, compare), recipes and sweeps, through the real command line."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import REPO, TINY
from helpers.no_tensorflow import SCRIPT as _NO_TF

from tfrecipe.cli.commands import VALIDATED

RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("args", [["ls"], ["cat", "digits_cnn_mirrored"], ["validate"]])
def test_subcommands_answer_without_importing_tensorflow(args, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _NO_TF, *args], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.stdout.strip().endswith("NO-TENSORFLOW 0"), result.stdout + result.stderr


def test_ls_lists_recipes_and_every_group_option(cli):
    result = cli("ls")
    assert result.returncode == 0, result.stderr
    for recipe in RECIPES:
        assert recipe in result.stdout
    for option in (REPO / "conf").glob("*/*.yaml"):
        assert f"{option.stem} " in result.stdout
    assert " *cnn" in result.stdout  # the default is marked


def test_cat_prints_the_composed_recipe(cli):
    result = cli("cat", "digits_cnn_mirrored", "seed=7")
    assert result.returncode == 0, result.stderr
    assert "name: mirrored" in result.stdout and "seed: 7" in result.stdout


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_validates(recipe, capsys):
    from tfrecipe.cli.commands import validate

    validate([recipe])  # raises ConfigError on any problem
    out = capsys.readouterr().out  # (`in` would pass on "invalid")
    assert out.startswith(f"valid: {recipe}\n  {VALIDATED}\nplan:\n  loop: ")


def test_validate_echoes_the_command_without_the_secrets_typed_on_it(capsys):
    """`tfrecipe validate` printed its arguments as typed: a tracking server's password (the
    one the run itself redacts everywhere) on the screen and in a CI log."""
    from tfrecipe.cli.commands import validate

    validate(["logger=[mlflow]", "logger.mlflow.tracking_uri=http://bob:hunter2xyz@127.0.0.1:5000"])
    out = capsys.readouterr().out
    assert out.startswith("valid: logger=[mlflow] logger.mlflow.tracking_uri=http://bob:***@")
    assert "hunter2xyz" not in out


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_starts_with_the_command_that_runs_it(recipe):
    first = (REPO / "recipes" / f"{recipe}.yaml").read_text().splitlines()[0]
    assert first.startswith("# python -m tfrecipe") and f"recipe={recipe}" in first


def _cluster(recipe: str) -> str:
    from tfrecipe.config.compose import compose

    return compose([f"recipe={recipe}"]).cluster.name


# Recipes that start their own cluster of processes (cluster=local) run through the command line.
CLUSTER_RECIPES = [r for r in RECIPES if _cluster(r) == "local"]
IN_PROCESS_RECIPES = [r for r in RECIPES if r not in CLUSTER_RECIPES]


# Recipes on ImageNet weights, which no offline machine has: smoke-run on random weights (the
# refusal to train without the file is tested in test_keras_app).
# Offline, the recipe's ImageNet weights are random ones: frozen on purpose for the smoke run.
OFFLINE_WEIGHTS = {"cifar10_mobilenet_finetune": ["model.weights=null", "model.freeze_random=true"]}


@pytest.mark.parametrize("recipe", IN_PROCESS_RECIPES)
def test_every_recipe_smoke_runs(recipe, train_run, compose_cfg):
    # TFDS recipes have no data offline: their real loading code runs on TFDS' mock data.
    uses_tfds = compose_cfg(f"recipe={recipe}").dataset._target_.startswith("tfrecipe.data.tfds")
    offline = OFFLINE_WEIGHTS.get(recipe, [])
    with _tfds_mock_data() if uses_tfds else contextlib.nullcontext():
        summary, _ = train_run(f"recipe={recipe}", *_emulate_if_not_native(recipe), *offline)
    assert summary["status"] == "completed"


def _emulate_if_not_native(recipe: str) -> list[str]:
    """A recipe whose precision this machine only emulates (bfloat16 on a CPU without
    AVX512_BF16/AMX, the common case on CI machines) still smoke-runs its code paths, emulated;
    the refusal itself is tested in test_cli."""
    from tfrecipe.config.compose import compose
    from tfrecipe.precision import native_support_problem

    policy = compose([f"recipe={recipe}"]).precision.policy
    return ["precision.require_native=false"] if native_support_problem(policy, {"CPU"}) else []


@pytest.mark.slow
@pytest.mark.parametrize("recipe", CLUSTER_RECIPES)
def test_every_cluster_recipe_smoke_runs(recipe, tmp_path):
    """The recipe's own strategy, cluster and callbacks for real (worker processes, gRPC). TFDS
    mock data cannot reach worker processes, so a TFDS recipe runs here on the bundled digits
    (its TFDS loading is what test_data.py covers)."""
    from helpers.launch import launching

    run_dir = tmp_path / "run"
    uses_tfds = "tfds" in str(_dataset_target(recipe))
    for launch in launching(tmp_path):
        run = launch(
            f"recipe={recipe}",
            *TINY,
            *(["dataset=digits"] if uses_tfds else []),
            f"hydra.run.dir={run_dir}",
        )
        assert run.finish() == 0, run.output[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["steps_completed"] == 2 * 3  # TINY: 2 epochs x 3 steps


def _dataset_target(recipe: str) -> str:
    from tfrecipe.config.compose import compose

    return compose([f"recipe={recipe}"]).dataset._target_


def _tfds_mock_data():
    import tensorflow_datasets as tfds

    return tfds.testing.mock_data(num_examples=64)


def test_validate_reports_every_problem_at_once(cli):
    result = cli(
        "validate",
        "batching.per_replica_batch_size=0",
        "+model.nope=1",
        "+callbacks.extra.lr._target_=keras.callbacks.LearningRateScheduler",
    )
    assert result.returncode == 2
    assert "3 problems" in result.stderr
    assert "batching.per_replica_batch_size" in result.stderr
    assert "unexpected argument 'nope'" in result.stderr
    assert "missing argument 'schedule'" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_finds_a_missing_target(cli):
    result = cli("validate", "model._target_=tfrecipe.models.nothere")
    assert result.returncode == 2
    assert "model._target_" in result.stderr and "nothere" in result.stderr


def test_cp_copies_a_recipe_and_never_overwrites(cli, tmp_path):
    result = cli("cp", "digits_cnn_mirrored", "mine.yaml")
    assert result.returncode == 0, result.stderr
    copy = tmp_path / "mine.yaml"
    shipped = (REPO / "recipes" / "digits_cnn_mirrored.yaml").read_text().splitlines()
    # the same recipe, its first line the command that runs the copy
    assert copy.read_text().splitlines() == ["# python -m tfrecipe recipe=mine.yaml", *shipped[1:]]
    copy.write_text("# edited\n")
    again = cli("cp", "digits_cnn_mirrored", "mine.yaml")
    assert again.returncode == 2 and "already exists" in again.stderr
    assert copy.read_text() == "# edited\n"
    assert cli("validate", str(copy)).returncode == 0


def test_cp_into_a_missing_directory_is_one_line(cli, tmp_path):
    result = cli("cp", "digits_cnn_mirrored", "missing/dir/x.yaml")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == (
        "tfrecipe: invalid configuration: cp: missing/dir is not a directory; create it first or "
        "choose another path (nothing copied)"
    )
    assert not (tmp_path / "missing").exists()


def test_unknown_recipe_is_a_clear_error(cli):
    result = cli("cat", "nope")
    assert result.returncode == 2
    assert "recipe=nope" in result.stderr and "digits_cnn_mirrored" in result.stderr


@pytest.mark.slow
def test_a_failing_sweep_job_does_not_stop_the_others(cli, tmp_path):
    sweep = tmp_path / "sweep"
    result = cli(
        "-m", *TINY, f"hydra.sweep.dir={sweep}", "model=mlp", "batching.per_replica_batch_size=0,16"
    )
    assert result.returncode == 1
    assert "1 sweep job(s) failed" in result.stderr
    failed = json.loads((sweep / "0" / "summary.json").read_text())
    assert failed["status"] == "failed" and "per_replica_batch_size" in failed["error"]
    assert json.loads((sweep / "1" / "summary.json").read_text())["status"] == "completed"
    report = json.loads((sweep / "sweep.json").read_text())  # the failed job is listed, never wins
    assert [job["status"] for job in report["jobs"]] == ["failed", "completed"]
    assert report["best"]["job"] == 1


def test_compare_without_runs_is_a_clear_error(cli, tmp_path):
    result = cli("compare", str(tmp_path))
    assert result.returncode == 2 and "no runs" in result.stderr


def test_objective_is_returned_for_optimizing_sweepers():
    from tfrecipe.cli.sweep_jobs import objective as _objective

    summary = {"metrics": {"val_loss": 0.5}, "test": {"accuracy": 0.9}, "examples_per_sec": 10.0}
    assert _objective(summary, "val_loss") == 0.5
    assert _objective(summary, "test_accuracy") == 0.9
    assert _objective(summary, "examples_per_sec") == 10.0


@pytest.mark.slow
def test_optuna_sweeper_optimizes_the_objective(cli, tmp_path):
    pytest.importorskip("optuna")
    sweep = tmp_path / "optuna"
    result = cli(
        "-m",
        *TINY,
        "model=mlp",
        f"hydra.sweep.dir={sweep}",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.direction=minimize",
        "optimizer.learning_rate=interval(0.0005,0.01)",
        "sweep.objective=val_loss",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    from omegaconf import OmegaConf

    best = OmegaConf.load(sweep / "optimization_results.yaml")
    val_losses = [
        json.loads((sweep / str(i) / "summary.json").read_text())["metrics"]["val_loss"]
        for i in range(2)
    ]
    assert best.best_value == pytest.approx(min(val_losses))  # main returned the objective
    report = json.loads((sweep / "sweep.json").read_text())  # the winner is Optuna's best trial
    assert (report["metric"], report["direction"]) == ("val_loss", "min")
    assert report["best"]["val_loss"] == pytest.approx(best.best_value)
    assert set(report["varied"]) == {"optimizer.learning_rate"}


@pytest.mark.slow
def test_joblib_launcher_runs_jobs_in_parallel_processes(cli, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "joblib"
    result = cli(
        "-m",
        *TINY,
        f"hydra.sweep.dir={sweep}",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "model=mlp,cnn",
        *(["logger=[csv,mlflow]"] if importlib.util.find_spec("mlflow") else []),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [json.loads((sweep / str(i) / "summary.json").read_text()) for i in range(2)]
    assert [s["model"] for s in summaries] == ["tfrecipe.models.mlp", "tfrecipe.models.cnn"]
    assert all(s["status"] == "completed" for s in summaries)
    # The jobs ran in other processes: the report reads them from the sweep dir.
    report = json.loads((sweep / "sweep.json").read_text())
    assert report["counts"] == {"completed": 2} and report["varied"] == ["model"]
    assert "best: job" in result.stdout and "rerun: python -m tfrecipe" in result.stdout
    if importlib.util.find_spec("mlflow"):  # two workers opened the sweep's one store at once
        assert "MLflow" not in result.stdout + result.stderr
        records = [json.loads((sweep / str(i) / "mlflow" / "run.json").read_text()) for i in (0, 1)]
        assert [r["local"] for r in records] == [False, False]
        assert records[0]["parent_run_id"] == records[1]["parent_run_id"] is not None


@pytest.mark.slow
def test_sigterm_to_a_joblib_sweep_saves_each_training_job_and_a_rerun_resumes_them(tmp_path):
    """SIGTERM reaches the sweep's process only (Kubernetes, `kill PID`): it passes it on to
    joblib's worker processes, so each job saves a backup at its next step and the sweep exits
    75; the same command again resumes both. (The jobs used to train on to their end, and the
    sweep exited 0.)"""
    import os
    import signal
    import time

    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    command = [
        *(sys.executable, "-m", "tfrecipe", "-m", "loop.epochs=2", "loop.steps_per_epoch=20"),
        *("loop.verbose=0", "batching.per_replica_batch_size=16", "logger.csv.every_n_steps=1"),
        *(f"hydra.sweep.dir={sweep}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"),
        *("model=mlp", "seed=1,2", "allowed_targets=[tests.helpers]"),
        # each job holds at step 7 until its signal comes (tests/helpers/slow_steps.py)
        "+callbacks.extra.hold._target_=tests.helpers.slow_steps.HoldForSignal",
        "+callbacks.extra.hold.steps=7",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    logs = [sweep / str(job) / "steps.csv" for job in (0, 1)]
    held = lambda: all(p.exists() and len(p.read_text().splitlines()) > 7 for p in logs)  # noqa: E731
    while not held() and driver.poll() is None:
        time.sleep(0.2)
    driver.send_signal(signal.SIGTERM)
    output = driver.communicate(timeout=300)[0]
    assert driver.returncode == 75, output[-3000:]
    assert "SIGTERM: stopping the sweep's 2 worker process(es)" in output
    assert "tfrecipe: sweep stopped (SIGTERM)" in output and "Traceback" not in output
    saved = [json.loads((sweep / str(job) / "summary.json").read_text()) for job in (0, 1)]
    assert [s["status"] for s in saved] == ["preempted", "preempted"], output[-3000:]
    steps = [s["steps_completed"] for s in saved]
    assert all(7 <= step < 40 for step in steps), steps

    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    done = [json.loads((sweep / str(job) / "summary.json").read_text()) for job in (0, 1)]
    assert [(s["status"], s["steps_completed"]) for s in done] == [("completed", 40)] * 2
    assert [s["resumed_from_step"] for s in done] == steps


@pytest.mark.slow
def test_a_failed_job_in_a_joblib_worker_fails_the_sweep(cli, tmp_path):
    """The job fails in another process: the sweep still counts it and exits 1."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "joblib"
    result = cli(
        "-m",
        *TINY,
        f"hydra.sweep.dir={sweep}",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "model=mlp",
        "batching.per_replica_batch_size=0,16",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"1 sweep job(s) failed: {sweep / '0'}" in result.stderr
    assert json.loads((sweep / "1" / "summary.json").read_text())["status"] == "completed"
