"""tfrecipe's Optuna sweeper (`hydra/sweeper=optuna`, hydra_plugins/tfrecipe_optuna_sweeper) with
the real Optuna and real processes: a study that resumes, prunes and shares its trials."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TINY

from tests.helpers.optuna_recipes import validate_storage_recipe

optuna = pytest.importorskip("optuna")

# Each trial: the MLP, 2 epochs of 3 steps.
TRIAL = [*TINY, "model=mlp"]


def _trials(storage: str, name: str = "tfrecipe") -> list:
    from tfrecipe.tracking.optuna_trial import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(storage)).get_trials()


def _states(storage: str, name: str = "tfrecipe") -> list[str]:
    return [trial.state.name for trial in _trials(storage, name)]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# --- the search space and the storage rule (no training) ---------------------------------------
def test_the_stock_override_syntax_makes_optunas_distributions():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from tfrecipe.cli.optuna_space import search_space

    space = search_space(
        [
            "optimizer.learning_rate=tag(log,interval(1e-5,1.0))",
            "loop.dropout=interval(0,1)",
            "model=choice(mlp,cnn)",
            "batching.per_replica_batch_size=range(16,65,16)",
            "seed=3",
        ]
    )
    d = space.distributions
    assert d["optimizer.learning_rate"] == FloatDistribution(1e-5, 1.0, log=True)
    assert d["loop.dropout"] == FloatDistribution(0.0, 1.0)  # Hydra's interval: floats
    assert d["model"] == CategoricalDistribution(["mlp", "cnn"])
    # range(...) runs what the basic sweeper would: 16, 32, 48, 64
    assert d["batching.per_replica_batch_size"] == IntDistribution(16, 64, step=16)
    assert space.overrides({"model": "cnn"}) == ["model=cnn", "seed=3"]


@pytest.mark.parametrize(
    ("storage", "valid"),
    [
        ("'journal:///${hydra.sweep.dir}/j.log'", True),  # elsewhere: command line only
        ("'postgresql://u@203.0.113.1/db'", False),  # a password: ${oc.env:VAR} (secrets)
    ],
)
def test_a_recipe_may_keep_a_study_in_a_file_not_send_it_to_a_server(tmp_path, storage, valid):
    from tfrecipe.cli.commands import validate

    refused = None if valid else r"hydra\.sweeper\.storage=.*command line"
    validate_storage_recipe(tmp_path, storage, refused=refused)
    # the same URL typed on the command line is the user's own choice
    validate(["hydra/sweeper=optuna", f"hydra.sweeper.storage={storage}"])


def test_pruners_take_optunas_parameters_as_keys():
    from tfrecipe.config.compose import compose
    from tfrecipe.tracking.optuna_trial import make_pruner

    cfg = compose(
        [
            "hydra/sweeper=optuna",
            "hydra/sweeper/pruner=median",
            "hydra.sweeper.pruner.n_startup_trials=3",
            "hydra.sweeper.pruner.n_warmup_steps=2",
        ],
        return_hydra_config=True,
    )
    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(cfg.hydra.sweeper.pruner)
    pruner = make_pruner(spec)
    assert isinstance(pruner, optuna.pruners.MedianPruner)
    assert (pruner._n_startup_trials, pruner._n_warmup_steps) == (3, 2)


# --- real sweeps --------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_issues_command_leaves_two_complete_trials_in_its_study(cli, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    command = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.study_name=s1",
        "optimizer.learning_rate=interval(0.001,0.01)",
        *TRIAL,
        "loop.epochs=1",
        f"hydra.sweep.dir={tmp_path / 'sw'}",
    ]
    result = cli(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _states(storage, "s1") == ["COMPLETE", "COMPLETE"]
    assert [_summary(tmp_path / "sw" / str(n))["status"] for n in (0, 1)] == ["completed"] * 2
    report = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert report["best"]["status"] == "completed"
    # the same command again: the study has its 2 trials, nothing more runs
    again = cli(*command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(_trials(storage, "s1")) == 2


def test_a_resumed_seeded_study_does_not_draw_its_first_trials_again(cli, tmp_path):
    """A seeded sampler starts from its seed in every process: a rerun that continues the study
    would sample trial 0's parameters again, and train them again, unless it is reseeded."""
    sweep = tmp_path / "sw"
    command = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.sampler.seed=0",
        "optimizer.learning_rate=interval(0.001,0.01)",
        *TRIAL,
        "loop.epochs=1",
        f"hydra.sweep.dir={sweep}",
    ]
    for n_trials in (1, 2):  # a study of one trial, continued to two
        result = cli(*command, f"hydra.sweeper.n_trials={n_trials}")
        assert result.returncode == 0, result.stderr[-3000:]
    first, second = _trials(f"sqlite:///{sweep / 'study.db'}")
    assert first.params != second.params


@pytest.mark.slow
def test_pruned_trials_stop_cleanly_and_never_win(cli, tmp_path):
    sweep = tmp_path / "sw"
    result = cli(
        "-m",
        "hydra/sweeper=optuna",
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        "hydra/sweeper/pruner=median",
        "hydra.sweeper.pruner.n_startup_trials=1",
        "hydra.sweeper.n_trials=4",
        "optimizer.learning_rate=tag(log,interval(1e-6,0.03))",
        *TRIAL,
        "loop.epochs=3",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    storage = f"sqlite:///{sweep / 'study.db'}"
    trials = _trials(storage)
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    assert len(trials) == 4 and pruned, [t.state.name for t in trials]
    for trial in pruned:
        run_dir = sweep / str(trial.number)
        summary = _summary(run_dir)
        epochs = summary["pruned_at_epoch"]
        assert summary["status"] == "pruned" and epochs < 3
        assert summary["epochs_completed"] == epochs  # stopped at that epoch's end, cleanly
        assert (run_dir / "model.keras").is_file()
        assert len((run_dir / "history.csv").read_text().splitlines()) == epochs + 1
    report = json.loads((sweep / "sweep.json").read_text())
    assert report["counts"]["pruned"] == len(pruned)
    assert report["best"]["status"] == "completed"
    assert "pruned" in result.stdout  # the sweep table shows them as such


def test_a_pruned_run_shows_as_pruned_in_mlflow_wandb_and_compare(
    train_run, cli, tmp_path, monkeypatch
):
    """A trial that its pruner stops after epoch 1 of 2 (a finished trial was better at every
    step): summary.json, Optuna, MLflow, W&B and `tfrecipe compare` all say pruned."""
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    from mlflow.tracking import MlflowClient

    from tests.helpers import wandb_records
    from tfrecipe.tracking.optuna_trial import PRUNED_ATTR, TrialHandle, open_storage

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    best = optuna.trial.create_trial(value=0.0, intermediate_values={1: 0.0, 2: 0.0})
    study.add_trial(best)
    pruner = {"name": "median", "n_startup_trials": 1}
    handle = TrialHandle(url, "s", study.ask()._trial_id, pruner)
    for name, value in {**handle.environ(), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name))
    summary, run_dir = train_run(
        "model=mlp", "logger=[csv,mlflow,wandb]", "logger.wandb.mode=offline"
    )
    assert (summary["status"], summary["pruned_at_epoch"]) == ("pruned", 1)
    assert _trials(url, "s")[1].user_attrs[PRUNED_ATTR] == 1  # the sweeper tells Optuna PRUNED
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert (run.info.status, run.data.tags["status"]) == ("FINISHED", "pruned")
    assert wandb_records.summary(run_dir)["status"] == "pruned"
    assert "pruned" in wandb_records.tags(run_dir)
    assert wandb_records.exit_code(run_dir) == 0  # stopped cleanly, not failed
    compared = cli("compare", str(run_dir), "--out", str(tmp_path / "cmp"))
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert "pruned" in compared.stdout


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tfrecipe", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _wait_for(path: Path, process: subprocess.Popen) -> None:
    _wait_until(path.exists, process)


def _wait_until(predicate, process: subprocess.Popen, timeout: float = 600) -> None:
    """Until `predicate()` holds; fails as soon as the sweep ended without it (the bound only
    keeps a hung sweep from holding the test run for ever)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            pytest.fail(f"the sweep ended before {predicate}:\n{process.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{predicate} still false after {timeout}s"
        time.sleep(0.1)


def _held_at_epoch_2(signals: Path) -> list[str]:
    """3 epochs, each job held after its 2nd until `signals/release` exists (`signals/reached`
    says it got there)."""
    return [
        "loop.epochs=3",
        "+callbacks.extra.hold._target_=tests.helpers.hold_epoch.HoldAtEpoch",
        "+callbacks.extra.hold.epoch=2",
        f"+callbacks.extra.hold.signal_dir={signals}",
        "allowed_targets=[tests.helpers]",
    ]


def _preempt_at_epoch_2(command: list[str], cwd: Path, signals: Path) -> None:
    """Starts `command`, and SIGTERMs it once its first job trained 2 of its 3 epochs; it saves
    and exits 75 (preempted)."""
    first = _start(command, cwd)
    _wait_for(signals / "reached", first)
    os.killpg(first.pid, signal.SIGTERM)  # noted now, acted on at the next training step
    (signals / "release").write_text("")
    assert first.wait(timeout=120) == 75, first.stdout.read()[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_killed_sweep_resumes_its_trial_in_the_same_run_dir(cli, tmp_path, storage):
    signals = tmp_path / "signals"
    signals.mkdir()
    sweep = tmp_path / "sw"
    url = {"sqlite": f"sqlite:///{tmp_path / 's.db'}", "journal": f"journal:///{tmp_path / 'j'}"}
    command = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        f"hydra.sweeper.storage={url[storage]}",
        "optimizer.learning_rate=interval(0.001,0.01)",
        *TRIAL,
        *_held_at_epoch_2(signals),
        f"hydra.sweep.dir={sweep}",
    ]
    first = _start(command, tmp_path)
    _wait_for(signals / "reached", first)  # trial 0 trained 2 of its 3 epochs
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    learning_rate = _trials(url[storage])[0].params
    (signals / "release").write_text("")
    result = cli(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = _trials(url[storage])
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert trials[1].params == learning_rate  # the retry of trial 0, with its parameters
    resumed = _summary(sweep / "0")
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] > 0
    assert resumed["epochs_completed"] == 3
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "2"]


# A worker of another machine: it takes a trial of the journal and its lease, then waits.
_REMOTE_WORKER = """
import sys, time, optuna
from pathlib import Path
from tfrecipe.cli import optuna_lease
from tfrecipe.tracking.optuna_trial import open_storage
url = sys.argv[1]
study = optuna.load_study(study_name="s", storage=open_storage(url))
trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
trial.set_user_attr("tfrecipe_worker", "another-machine:1")  # no PID of this one tells
with optuna_lease.held(optuna_lease.lease_dir(url), trial._trial_id):
    print("running", flush=True)
    time.sleep(600)
"""


@pytest.mark.heavy  # starts a process
def test_a_journal_trial_whose_worker_machine_was_lost_is_failed_and_retried(tmp_path):
    """The journal storage has no heartbeat: the trial's lease tells that its worker is gone."""
    from tfrecipe.cli import optuna_lease
    from tfrecipe.cli.optuna_study import _fail_dead_trials
    from tfrecipe.tracking.optuna_trial import open_storage

    url = f"journal:///{tmp_path / 'study.log'}"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    worker = subprocess.Popen(
        [sys.executable, "-c", _REMOTE_WORKER, url],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout.readline() == "running\n"
        _fail_dead_trials(study, optuna_lease.lease_dir(url))
        assert _states(url, "s") == ["RUNNING"]  # its worker holds the lease: alive
    finally:
        worker.kill()  # SIGKILL: nothing of it runs on
        worker.wait()
    _fail_dead_trials(study, optuna_lease.lease_dir(url))
    failed, retry = _trials(url, "s")
    assert (failed.state.name, retry.state.name) == ("FAIL", "WAITING")
    assert retry.params == failed.params  # the same parameters
    assert retry.system_attrs["failed_trial"] == failed.number  # into its run dir
    _fail_dead_trials(study, optuna_lease.lease_dir(url))  # another worker: retried once only
    assert len(_trials(url, "s")) == 2


@pytest.mark.slow
def test_two_workers_on_one_journal_file_share_one_study(tmp_path):
    journal = f"journal:///{tmp_path / 'study.log'}"
    command = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=3",
        f"hydra.sweeper.storage={journal}",
        "optimizer.learning_rate=interval(0.001,0.01)",
        *TRIAL,
        f"hydra.sweep.dir={tmp_path / 'sw'}",
    ]
    workers = [_start(command, tmp_path) for _ in range(2)]
    outputs = [worker.communicate(timeout=600)[0] for worker in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert _states(journal) == ["COMPLETE"] * 3  # 3 in all, not 3 each
    run_dirs = sorted(p.name for p in (tmp_path / "sw").iterdir() if p.name.isdigit())
    assert run_dirs == ["0", "1", "2"]
    assert all(_summary(tmp_path / "sw" / n)["status"] == "completed" for n in run_dirs)


@pytest.mark.slow
def test_a_basic_sweep_rerun_resumes_its_preempted_job_and_skips_completed_ones(cli, tmp_path):
    signals = tmp_path / "signals"
    signals.mkdir()
    sweep = tmp_path / "sw"
    command = [
        "-m",
        "optimizer.learning_rate=0.001,0.01",
        *TRIAL,
        *_held_at_epoch_2(signals),
        f"hydra.sweep.dir={sweep}",
    ]
    _preempt_at_epoch_2(command, tmp_path, signals)
    assert _summary(sweep / "0")["status"] == "preempted"
    resumed = cli(*command)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    job0, job1 = _summary(sweep / "0"), _summary(sweep / "1")
    assert job0["status"] == "completed" and job0["resumed_from_step"] > 0
    assert job1["status"] == "completed"
    again = cli(*command)  # every job done: nothing trains, nothing is refused
    assert again.returncode == 0, again.stderr[-3000:]
    assert [_summary(sweep / n) for n in ("0", "1")] == [job0, job1]
    assert "sweep: 2 jobs (2 completed)" in again.stdout


@pytest.mark.slow
def test_a_preempted_trial_is_retried_into_its_run_dir_and_resumes(cli, tmp_path):
    signals = tmp_path / "signals"
    signals.mkdir()
    sweep = tmp_path / "sw"
    command = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=1",
        "optimizer.learning_rate=interval(0.001,0.01)",
        *TRIAL,
        *_held_at_epoch_2(signals),
        f"hydra.sweep.dir={sweep}",
    ]
    _preempt_at_epoch_2(command, tmp_path, signals)
    storage = f"sqlite:///{sweep / 'study.db'}"
    assert _states(storage) == ["FAIL", "WAITING"]  # its retry is queued at once
    result = cli(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _states(storage) == ["FAIL", "COMPLETE"]
    summary = _summary(sweep / "0")
    assert summary["status"] == "completed" and summary["resumed_from_step"] > 0


@pytest.mark.slow
def test_n_jobs_workers_never_wait_for_each_others_trials(tmp_path):
    """n_jobs=2, n_trials=3, the first trial held mid-training: the other worker runs the other
    two meanwhile (a batch launch of 2 would wait for the held one before its next trial)."""
    signals = tmp_path / "signals"
    signals.mkdir()
    sweep = tmp_path / "sw"
    command = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=2",
        "optimizer.learning_rate=interval(0.001,0.01)",
        *TRIAL,
        *_held_at_epoch_2(signals),
        "+callbacks.extra.hold.first_only=true",
        f"hydra.sweep.dir={sweep}",
    ]
    sweep_process = _start(command, tmp_path)
    _wait_for(signals / "reached", sweep_process)
    storage = f"sqlite:///{sweep / 'study.db'}"
    _wait_until(lambda: _states(storage).count("COMPLETE") == 2, sweep_process)
    assert sorted(_states(storage)) == ["COMPLETE", "COMPLETE", "RUNNING"]  # one still held
    (signals / "release").write_text("")
    output = sweep_process.communicate(timeout=600)[0]
    assert sweep_process.returncode == 0, output[-3000:]
    trials = _trials(storage)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    workers = {t.user_attrs["tfrecipe_worker"] for t in trials}
    assert len(workers) == 2  # this process and the one it started, each asking for the next
    assert output.count("sweep: 3 jobs (3 completed)") == 1  # one report, by the sweep's process


def _waiting_on(path: Path) -> bool:
    """Whether a process waits for a `flock` on `path` (a blocked lock in /proc/locks)."""
    inode = f":{path.stat().st_ino} "
    return any(
        "->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines()
    )


@pytest.mark.heavy  # starts a process
def test_a_worker_counts_the_trials_only_after_another_has_asked_for_its_own(tmp_path):
    """Two workers each seeing the last trial left must not both ask for it (4 trials of 3 once
    came out of SLURM array tasks): counting and asking happen under the study's ask lock, and
    the count is one read (the other worker's trial finishes while it is counted: this test's
    tell, which once fell between a read of the finished trials and one of the running)."""
    from tfrecipe.cli import optuna_lease
    from tfrecipe.tracking.optuna_trial import open_storage

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="tfrecipe", storage=open_storage(storage))
    command = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1"]
    command += [f"hydra.sweeper.storage={storage}", "optimizer.learning_rate=interval(0.001,0.01)"]
    command += [*TRIAL, f"hydra.sweep.dir={tmp_path / 'sw'}"]
    leases = optuna_lease.lease_dir(storage)
    with optuna_lease.asking(leases):  # another worker, about to ask for the last trial
        sweep = _start(command, tmp_path)
        _wait_until(lambda: _waiting_on(leases / optuna_lease.ASK_LOCK), sweep)
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    study.tell(trial, 1.0)  # ... and ran it
    output = sweep.communicate(timeout=600)[0]
    assert sweep.returncode == 0, output[-3000:]
    assert _states(storage) == ["COMPLETE"]  # the budget's one trial: nothing more asked
    sweep_dir = tmp_path / "sw"  # nor run (a sweep that ran nothing may not have made it)
    assert not sweep_dir.exists() or not any(p.name.isdigit() for p in sweep_dir.iterdir())


@pytest.mark.parametrize("planted", ["study.db.trials", "study.db.trials/ask"])
def test_a_link_planted_where_the_leases_live_is_refused_in_one_line(cli, tmp_path, planted):
    """FILE.trials and its ask lock are files the sweep makes and locks: a link in their place
    (a shared folder's) is refused before any trial is asked, and nothing is written through it."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    if planted == "study.db.trials":
        (tmp_path / planted).symlink_to(target)
    else:
        (tmp_path / "study.db.trials").mkdir()
        (tmp_path / planted).symlink_to(target / "ask")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    command = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1"]
    command += [f"hydra.sweeper.storage={storage}", "optimizer.learning_rate=interval(0.001,0.01)"]
    result = cli(*command, *TRIAL, f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    assert str(tmp_path / planted) in result.stderr and "link" in result.stderr
    assert list(target.iterdir()) == []
    assert _trials(storage) == []


def test_on_a_database_server_a_trial_asked_past_the_budget_is_dropped_unrun(tmp_path):
    """No file to lock there: a worker that asked at once with another counts the trials asked
    before its own (failed ones aside) and drops its trial where they fill the budget."""
    from tfrecipe.cli.optuna_study import _ahead

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    x = {"x": optuna.distributions.FloatDistribution(0, 1)}
    study.tell(study.ask(x), 1.0)
    study.tell(study.ask(x), state=optuna.trial.TrialState.FAIL)  # retried: not counted
    running, mine = study.ask(x), study.ask(x)
    assert _ahead(study, mine) == 2  # trial 3 comes after 2 that count: n_trials=2 drops it
    assert _ahead(study, running) == 1
