"""cluster=slurm: the resolver on CPU and GPU nodes, and scripts/slurm_multi_worker.sbatch on a
real one-node SLURM cluster (munged, slurmctld, slurmd started by the `slurm` fixture) through
every way SLURM stops a job: each stopped run resumes and completes with the exact step count."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import slurm as slurm_cluster
from tests.helpers.configs import validate
from tests.helpers.ports import free_port_pair
from tfrecipe.distribute import cluster

SCRIPT = REPO / "scripts" / "slurm_multi_worker.sbatch"
EPOCHS, STEPS_PER_EPOCH = 2, 40  # long enough to stop mid-run, short enough for CI
RUN = [
    f"loop.epochs={EPOCHS}",
    f"loop.steps_per_epoch={STEPS_PER_EPOCH}",
    "loop.verbose=0",
    "batching.per_replica_batch_size=16",
    "callbacks.progress.enabled=false",
    "callbacks.backup.every_n_steps=5",
]
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
HOLD = [  # a job holds at step 7 until its preemption comes (tests/helpers/slow_steps.py)
    "logger.csv.every_n_steps=1",
    "+callbacks.extra.hold._target_=helpers.slow_steps.HoldForSignal",
    "+callbacks.extra.hold.steps=7",
    "allowed_targets=[helpers]",
]


# --- the resolver (no cluster needed) -----------------------------------------------------------
SLURM_JOB = {
    "SLURM_JOB_ID": "7",
    "SLURM_PROCID": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "node01",
    "SLURM_STEP_TASKS_PER_NODE": "2",
}


def _resolver(monkeypatch, compose_cfg, *overrides: str):
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi (nor scontrol: one node)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name, value in SLURM_JOB.items():
        monkeypatch.setenv(name, value)
    run = validate(compose_cfg("strategy=multi_worker_mirrored", "cluster=slurm", *overrides))
    resolver = cluster.build_resolver(run.cluster)
    return resolver, resolver.cluster_spec().as_dict()


def test_a_cpu_node_has_no_gpu(monkeypatch, compose_cfg):
    resolver, spec = _resolver(monkeypatch, compose_cfg, "cluster.port_base=9000")
    assert spec == {"worker": ["node01:9000", "node01:9001"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.num_accelerators() == {}  # MultiWorkerMirroredStrategy picks the CPU
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_gpu_node_splits_its_gpus_between_its_tasks(monkeypatch, compose_cfg):
    resolver, spec = _resolver(monkeypatch, compose_cfg, "cluster.gpus_per_node=4")
    assert spec == {"worker": ["node01:8888", "node01:8889"]}
    assert resolver.num_accelerators() == {"GPU": 2}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"  # task 1's half


def test_settle_summary_marks_a_killed_run_at_its_last_backup(tmp_path):
    (tmp_path / "backup").mkdir()
    (tmp_path / "backup" / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-15"\nall_model_checkpoint_paths: "ckpt-15"\n'
    )
    (tmp_path / "summary.json").write_text(json.dumps({"status": "running", "steps_completed": 0}))
    cluster.settle_summary(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps_completed"] == 15
    assert "step 15" in summary["error"]
    (tmp_path / "summary.json").write_text(json.dumps({"status": "preempted"}))
    cluster.settle_summary(tmp_path)  # a run that said how it ended is left alone
    assert json.loads((tmp_path / "summary.json").read_text()) == {"status": "preempted"}


def test_only_task_0_judges_and_saves_hydra_files_in_the_shared_run_dir(monkeypatch, tmp_path):
    """Every task of a step pre-checks the run dir they share; a task whose Hydra started first
    must not make it look like another program's to the chief (`.hydra/` but no summary.json)."""
    from tfrecipe.cli.precheck import Invocation, precheck
    from tfrecipe.errors import ConfigError

    monkeypatch.setattr(os, "environ", {**os.environ, **SLURM_JOB})  # precheck exports trust
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)  # another task's Hydra, or the user's
    argv = ["strategy=multi_worker_mirrored", "cluster=slurm", f"hydra.run.dir={run_dir}"]
    pinned = precheck(argv, Invocation())  # task 1: the chief judges; this one saves no .hydra/
    assert pinned[-1] == "hydra.output_subdir=null" and str(run_dir) in pinned[-2]
    assert sorted(p.name for p in run_dir.iterdir()) == [".hydra"]

    os.environ["SLURM_PROCID"] = "0"  # the chief finds .hydra/ with no run beside it: refused
    with pytest.raises(ConfigError, match=r"holds \.hydra/ but no summary\.json"):
        precheck(argv, Invocation())
    (run_dir / ".hydra").rmdir()
    assert "hydra.output_subdir=null" not in precheck(argv, Invocation())  # it saves the run's


# --- a real SLURM cluster ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if reason := slurm_cluster.missing():
        pytest.skip(reason)
    with slurm_cluster.cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


class Job:
    """One submission of the sbatch script, in its own directory (run dir, log, TMPDIR)."""

    def __init__(self, slurm, where: Path, *sbatch_args: str, overrides=RUN, run_dir=None):
        self.slurm, self.where = slurm, where
        self.run_dir = run_dir or where / "run"
        self.tmp = where / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        env = {
            **slurm.env,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",  # tests/helpers as `helpers`
            "RUN_DIR": str(self.run_dir),
            "PORT_BASE": str(free_port_pair()),
            "TMPDIR": str(self.tmp),
        }
        self.id = slurm.run(
            "sbatch",
            "--parsable",
            "--nodes=1",
            "--ntasks-per-node=2",
            "--cpus-per-task=1",
            f"--output={where}/slurm-%j.out",
            *sbatch_args,
            str(SCRIPT),
            *overrides,
            env=env,
        )

    @property
    def log(self) -> str:
        return (self.where / f"slurm-{self.id}.out").read_text(errors="replace")

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def wait_for_backup(self) -> None:
        """Until the chief has saved its first periodic backup (training is under way), however
        long a loaded machine takes; fails when the job ends without one."""
        try:
            self.slurm.wait_while_running(
                self.id, lambda: (self.run_dir / "backup" / "checkpoint").exists()
            )
        except AssertionError as ended:  # say why: the job's own log
            raise AssertionError(f"{ended}\n{self.log[-3000:]}") from None

    def finish(self, *states: str) -> dict[str, str]:
        """Waits for one of the final `states` (the job's own end, not a budget)."""
        return self.slurm.wait_for(self.id, *states)

    def scratch_left(self) -> list[str]:
        return sorted(p.name for p in self.tmp.iterdir())


def _saved_steps(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"backup saved at step (\d+)", log)]


def _assert_resumed_to_completion(job: Job, stopped_at: int) -> None:
    summary = job.summary()
    assert summary["status"] == "completed", job.log[-3000:]
    assert summary["steps_completed"] == TOTAL_STEPS
    assert summary["resumed_from_step"] == stopped_at
    assert f"resuming from {job.run_dir}/backup/ckpt-{stopped_at} at step {stopped_at}" in job.log
    assert job.scratch_left() == []


@pytest.mark.slow
def test_the_sbatch_script_trains_two_tasks_as_one_cluster(slurm, tmp_path):
    # TensorFlow's INFO lines (off by default) say which cluster and devices each task joined.
    info = "hydra.job_logging.loggers.tensorflow.level=INFO"
    shown = ["print_config=true", "loop.verbose=2"]  # by the chief (task 0) alone
    job = Job(slurm, tmp_path, overrides=["loop.epochs=2", "loop.steps_per_epoch=3", info, *shown])
    fields = job.finish("COMPLETED", "FAILED", "CANCELLED")
    assert fields["JobState"] == "COMPLETED", job.log[-3000:]
    summary = job.summary()
    assert summary["status"] == "completed" and summary["num_replicas"] == 2
    assert summary["steps_completed"] == 6
    assert job.log.count("num_workers = 2") == 2  # both tasks joined the same cluster
    assert "device:CPU:0" in job.log and "GPU:0" not in job.log  # no phantom GPU
    assert job.log.count("config: what differs from the defaults") == 1
    assert job.log.count("Epoch 2/2") == 1
    assert job.scratch_left() == []


@pytest.mark.slow
def test_a_preempted_job_saves_is_requeued_and_resumes(slurm, tmp_path):
    job = Job(slurm, tmp_path, overrides=[*RUN, *HOLD])  # both tasks hold at step 7 until then
    job.wait_for_backup()
    slurm.preempt(tmp_path)  # a job of the high-priority partition needs the whole node
    fields = job.finish("COMPLETED", "FAILED", "CANCELLED")
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), job.log[-3000:]
    saved = _saved_steps(job.log)
    assert len(saved) == 2 and saved[0] == saved[1]  # both tasks at the same step
    assert "Exited with exit code 75" in job.log and "requeueing job" in job.log
    _assert_resumed_to_completion(job, stopped_at=saved[0])


@pytest.mark.slow
def test_a_time_limit_signal_saves_every_task_and_requeues(slurm, tmp_path):
    # SIGTERM to every task once 100 s of the time limit are left. The limit is set once training
    # is under way (a signal during start-up would find nothing to save: exit 143, requeued too).
    # SLURM checks time limits every 30 s: both tasks hold at step 7 until the signal comes.
    job = Job(slurm, tmp_path, "--time=10", "--signal=TERM@100", overrides=[*RUN, *HOLD])
    job.wait_for_backup()
    slurm.run("scontrol", "update", f"JobId={job.id}", "TimeLimit=2")
    slurm.wait_while_running(job.id, lambda: "requeueing job" in job.log)
    # The requeued job gets the limit back, so that the rest of the run fits.
    slurm.wait_for(job.id, "PENDING", "RUNNING")
    slurm.run("scontrol", "update", f"JobId={job.id}", "TimeLimit=10")
    fields = job.finish("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), job.log[-3000:]
    saved = _saved_steps(job.log)
    assert len(saved) == 2 and saved[0] == saved[1], job.log[-3000:]
    assert "stopped (exit 75)" in job.log  # every task exited 75: srun's own exit code
    _assert_resumed_to_completion(job, stopped_at=saved[0])


@pytest.mark.slow
def test_scancel_leaves_a_consistent_run_that_a_resubmission_completes(slurm, tmp_path):
    job = Job(slurm, tmp_path / "first")
    job.wait_for_backup()
    slurm.run("scancel", job.id)
    fields = job.finish("CANCELLED", "COMPLETED", "FAILED")
    assert (fields["JobState"], fields["Restarts"]) == ("CANCELLED", "0")
    # Saved at an agreed step (preempted) or SIGKILLed by srun first (failed): either way the
    # summary counts the steps of the backup a rerun starts from, and no scratch is left.
    summary = job.summary()
    latest = _latest_backup(job)
    assert summary["status"] in ("preempted", "failed"), summary
    assert 0 < summary["steps_completed"] == latest < TOTAL_STEPS
    assert job.scratch_left() == []

    # The same run dir again; `scancel --full -s TERM` signals srun too (which SIGKILLs the
    # tasks unless they saved first): requeued either way, and resumed from the latest backup.
    again = Job(slurm, tmp_path / "again", run_dir=job.run_dir)
    slurm.wait_while_running(again.id, lambda: (_latest_backup(again) or 0) > latest)
    slurm.run("scancel", "--full", "--signal=TERM", again.id)
    fields = again.finish("COMPLETED", "FAILED", "CANCELLED")
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), again.log[-3000:]
    resumed = [int(n) for n in re.findall(r"resuming from .* at step (\d+)", again.log)]
    assert resumed[0] == latest and resumed[-1] > latest
    _assert_resumed_to_completion(again, stopped_at=resumed[-1])


def _latest_backup(job: Job) -> int | None:
    return cluster.latest_backup_step(job.run_dir / "backup")


# --- Hydra's submitit launcher ------------------------------------------------------------------
@pytest.mark.slow
def test_a_preempted_submitit_sweep_job_is_requeued_and_resumes_at_the_saved_step(slurm, tmp_path):
    """hydra/launcher=submitit_slurm: the preemption's SIGUSR2 saves a backup, submitit requeues
    the job (hydra.launcher.max_num_timeout=1), and the requeued job resumes at that step."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")

    sweep = tmp_path / "sweep"
    run_dir, logs = _preempted_sweep(
        slurm,
        tmp_path,
        [
            "-m",
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.partition=low",
            f"hydra.launcher.cpus_per_task={slurm_cluster.CPUS}",
            "hydra.launcher.timeout_min=10",
            "hydra.launcher.max_num_timeout=1",
            f"hydra.sweep.dir={sweep}",
            "seed=1",
            *RUN,
            *HOLD,
        ],
    )
    saved = _saved_steps(logs)
    assert len(saved) == 1 and 0 < saved[0] < TOTAL_STEPS, logs[-3000:]
    assert "preempted (SIGUSR2)" in logs and "Requeued job" in logs, logs[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["resumed_from_step"] == saved[0]
    assert summary["steps_completed"] == TOTAL_STEPS
    assert f"resuming from {run_dir}/backup/ckpt-{saved[0]} at step {saved[0]}" in logs


@pytest.mark.slow
def test_an_optuna_sweep_runs_in_slurm_array_tasks_that_share_one_study(slurm, tmp_path):
    """hydra/sweeper=optuna with hydra/launcher=submitit_slurm: n_jobs=2 array tasks, each a
    worker asking the one study for its next trial, until it has n_trials finished."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    optuna = pytest.importorskip("optuna")
    import subprocess

    sweep = tmp_path / "sweep"
    env = {
        **slurm.env,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
    }
    sweep_args = [
        *("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=2"),
        *("hydra/launcher=submitit_slurm", "hydra.launcher.partition=low"),
        *("hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10"),
        *("optimizer.learning_rate=interval(0.001,0.01)", "model=mlp", "loop.epochs=1"),
        *("loop.steps_per_epoch=2", "loop.verbose=0", f"hydra.sweep.dir={sweep}"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "tfrecipe", *sweep_args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=slurm_cluster.HUNG_S,
    )
    logs = {p.name: p.read_text(errors="replace") for p in sweep.glob(".submitit/*/*_log.out")}
    assert done.returncode == 0, done.stderr[-3000:] + "".join(logs.values())[-3000:]
    array = {name.split("_log")[0] for name in logs}
    assert len(array) == 2 and all(re.fullmatch(r"\d+_[01]_0", n) for n in array), array
    assert all("optuna: study 'tfrecipe'" in log for log in logs.values())  # both joined it
    study = optuna.load_study(study_name="tfrecipe", storage=f"sqlite:///{sweep / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3  # 3 in all, not 3 a task
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "1", "2"]
    assert "sweep: 3 jobs (3 completed)" in done.stdout  # one report, by the sweep's process


@pytest.mark.slow
def test_a_preempted_optuna_array_task_retries_its_trial_at_the_saved_step(slurm, tmp_path):
    """The array task's worker ignores submitit's SIGUSR2 and saves on the SIGTERM of SLURM's
    requeue; its trial is failed and retried, and the requeued task resumes it at that step."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    optuna = pytest.importorskip("optuna")

    sweep = tmp_path / "sweep"
    sweep_args = [
        *("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1"),
        *("hydra/launcher=submitit_slurm", "hydra.launcher.partition=low"),
        *(f"hydra.launcher.cpus_per_task={slurm_cluster.CPUS}", "hydra.launcher.timeout_min=10"),
        "hydra.launcher.max_num_timeout=1",  # submitit may take a preemption for a time-out
        *("optimizer.learning_rate=interval(0.001,0.01)", f"hydra.sweep.dir={sweep}"),
        *RUN,
        *HOLD,
    ]
    run_dir, logs = _preempted_sweep(slurm, tmp_path, sweep_args)
    saved = _saved_steps(logs)
    assert len(saved) == 1 and 0 < saved[0] < TOTAL_STEPS, logs[-3000:]
    assert "Requeued job" in logs, logs[-3000:]  # by submitit, once the worker had saved
    study = optuna.load_study(study_name="tfrecipe", storage=f"sqlite:///{sweep / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"], logs[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["resumed_from_step"] == saved[0]
    assert summary["steps_completed"] == TOTAL_STEPS


def _preempted_sweep(slurm, tmp_path: Path, sweep_args: list[str]) -> tuple[Path, str]:
    """Runs `python -m tfrecipe SWEEP_ARGS` (a submitit sweep into tmp_path/sweep), preempts
    its first job once it has logged 6 steps (HOLD keeps it at step 7 until then), and waits
    for the sweep's own end. Returns that job's run dir and the submitit logs."""
    import subprocess

    sweep = tmp_path / "sweep"
    env = {
        **slurm.env,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
    }
    with open(tmp_path / "driver.out", "w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tfrecipe", *sweep_args],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    run_dir = sweep / "0"
    try:
        steps = run_dir / "steps.csv"
        trained = lambda: steps.exists() and len(steps.read_text().splitlines()) > 6  # noqa: E731
        slurm.wait(lambda: trained() or driver.poll() is not None, slurm_cluster.HUNG_S)
        assert trained(), (tmp_path / "driver.out").read_text()[-3000:]  # the sweep ended
        slurm.preempt(tmp_path)
        driver.wait(timeout=slurm_cluster.HUNG_S)  # the sweep's own end
    finally:
        driver.kill()
    logs = "".join(p.read_text(errors="replace") for p in sweep.glob(".submitit/*/*_log.*"))
    assert driver.returncode == 0, (tmp_path / "driver.out").read_text()[-3000:] + logs[-3000:]
    return run_dir, logs
