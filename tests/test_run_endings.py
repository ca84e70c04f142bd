"""Every way a run can end leaves a clear line and a final status (issue 11, section 3).

Each test runs the real command line in a real process, as a user meets it: a second process
on a busy run dir, a failure before training, an unreadable only backup, Ctrl-C, data that cannot
fit in memory, a Hydra logging mistake, NaN inputs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, TINY

from tfrecipe.cli.main import EXIT_PREEMPTED

USER_ENV = {"PYTHONPATH": str(REPO)}  # tests.helpers is importable, like a user's package


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _one_line_refusal(result, *fragments: str) -> str:
    """Exit code 2 and one line on stderr holding every fragment; no traceback."""
    output = f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode == 2, output
    assert "Traceback" not in result.stderr + result.stdout, output
    lines = [line for line in result.stderr.splitlines() if line.startswith("tfrecipe:")]
    assert len(lines) == 1, output
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} missing from: {lines[0]}"
    return lines[0]


def _is_locked(run_dir: Path) -> bool:
    """Whether some process holds the run dir's lock (taking it here, and giving it back, if not)."""
    with contextlib.suppress(FileNotFoundError):
        descriptor = os.open(run_dir, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(descriptor)  # closing releases a lock taken here
    return False


def _wait(predicate, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None and not predicate():
        time.sleep(0.05)


# --- one run per run dir ---------------------------------------------------------------------
def test_a_second_process_on_a_busy_run_dir_is_refused_and_a_killed_one_frees_it(cli, tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfrecipe",
            "loop.epochs=100",
            "loop.verbose=0",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Without a lock, wait until it trains (its summary.json says "running").
        _wait(lambda: _is_locked(run_dir) or (run_dir / "summary.json").exists(), first, 120)
        assert first.poll() is None, f"the first run ended with exit code {first.returncode}"
        second = cli(*TINY, f"hydra.run.dir={run_dir}")

        _one_line_refusal(second, f"hydra.run.dir={run_dir}", f"in use by PID {first.pid}")
    finally:
        first.kill()  # SIGKILL: no clean-up of its own; the kernel releases the lock
        first.wait()
    assert not _is_locked(run_dir)


def test_train_refuses_a_run_dir_another_process_holds_and_gives_its_own_back(tmp_path):
    from tfrecipe.errors import ConfigError
    from tfrecipe.rundir import RunFiles

    run_dir = tmp_path / "run"
    holder = _hold_lock(run_dir)
    try:
        with pytest.raises(ConfigError, match=f"run dir in use by PID {holder.pid}"):
            RunFiles(run_dir).lock()
    finally:
        holder.kill()
        holder.wait()
    RunFiles(run_dir).lock()  # the killed holder's lock went with it
    assert _is_locked(run_dir)
    RunFiles(run_dir).unlock()
    assert not _is_locked(run_dir)


def test_a_command_on_a_run_dir_in_use_says_so_in_its_own_words(tmp_path, capsys):
    """`tfrecipe evaluate RUN_DIR` while a run trains there: exit 2 and one line naming RUN_DIR
    (it said `hydra.run.dir=...` and to choose another hydra.run.dir, a key evaluate has not)."""
    from tfrecipe.cli.main import main

    run_dir = tmp_path / "run"
    holder = _hold_lock(run_dir)
    try:
        with pytest.raises(SystemExit) as stop:
            main(["evaluate", str(run_dir)])
    finally:
        holder.kill()
        holder.wait()
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"tfrecipe: invalid configuration: evaluate: RUN_DIR={run_dir.resolve()}: run dir in use "
        f"by PID {holder.pid} (a run training there, or a command writing its files); wait for "
        "it to end, then run this again"
    )


def _hold_lock(run_dir: Path) -> subprocess.Popen:
    """A process holding `run_dir`'s lock, as a training run does, until killed."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from tfrecipe.rundir import RunFiles; RunFiles(Path(sys.argv[1])).lock(); "
            "print('locked', flush=True); time.sleep(120)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


# --- nothing that is not a run's own is overwritten -------------------------------------------
@pytest.mark.parametrize("resume", ["auto", "never"])
def test_a_run_dir_whose_summary_cannot_be_read_is_never_trained_over(cli, tmp_path, resume):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text('{"status": "comple')  # damaged: maybe completed
    (run_dir / "model.keras").write_bytes(b"the finished model")

    result = cli(*TINY, f"resume={resume}", f"hydra.run.dir={run_dir}")

    _one_line_refusal(result, f"hydra.run.dir={run_dir}", "summary.json cannot be read")
    assert (run_dir / "model.keras").read_bytes() == b"the finished model"
    assert sorted(p.name for p in run_dir.iterdir()) == ["model.keras", "summary.json"]


def test_a_dir_with_a_users_own_config_yaml_is_not_a_run_dir(cli, tmp_path):
    own = tmp_path / "project"
    own.mkdir()
    (own / "config.yaml").write_text("my: settings\n")

    result = cli(*TINY, f"hydra.run.dir={own}")

    _one_line_refusal(result, f"hydra.run.dir={own}", "holds config.yaml but no summary.json")
    assert (own / "config.yaml").read_text() == "my: settings\n"
    assert sorted(p.name for p in own.iterdir()) == ["config.yaml"]


def test_an_empty_run_dir_is_refused_not_the_current_directory(cli, tmp_path):
    result = cli(*TINY, "hydra.run.dir=")
    _one_line_refusal(result, "hydra.run.dir=''", "current directory")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_job_refused_by_the_lock_writes_nothing_into_that_dir(cli, tmp_path):
    sweep = tmp_path / "sweep"
    holder = _hold_lock(sweep / "0")
    try:
        result = cli("-m", *TINY, "seed=1", f"hydra.sweep.dir={sweep}")
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"run dir in use by PID {holder.pid}" in result.stderr, result.stderr[-3000:]
    left = {p.name: p.stat().st_size for p in (sweep / "0").iterdir()}
    assert left in ({}, {"tfrecipe.log": 0}), left  # Hydra opens its log file; nothing else


_ANOTHER_CONFIG = "holds a run started with another config"


@pytest.mark.parametrize(
    ("summary", "allowed", "refusal"),
    [
        ('{"status": "completed"}', [], _ANOTHER_CONFIG),
        ('{"status": "preempted"}', [], _ANOTHER_CONFIG),
        ('{"status": "completed"}', ["resume_allow_changes=[seed]"], _ANOTHER_CONFIG),
        ('{"status": "comple', [], "summary.json cannot be read"),
    ],
)
def test_a_sweep_job_refused_for_another_config_leaves_that_runs_record(
    cli, tmp_path, summary, allowed, refusal
):
    """A sweep rerun into its dir with other values: job 0's dir holds a run of seed=1, the
    job asks for seed=2 and is refused (a finished job is, whatever it allows to change; so is
    a dir whose summary.json cannot be read); the report and compare still read seed=1 there."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    _interrupted_run(sweep / "0", "seed=1")
    (sweep / "0" / "summary.json").write_text(summary)
    (sweep / "0" / ".hydra").mkdir()
    recorded = "".join(f"- {override}\n" for override in [*TINY, "seed=1"])
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text(recorded)

    result = cli("-m", *TINY, "seed=2", *allowed, f"hydra.sweep.dir={sweep}")

    assert result.returncode == 1, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert refusal in output, output[-3000:]
    if summary == '{"status": "completed"}':  # what to do: the sweep's, not a run's
        assert "run other values into a new hydra.sweep.dir" in output, output[-3000:]
        assert "continue this one with" not in output, output[-3000:]
    assert (sweep / "0" / ".hydra" / "overrides.yaml").read_text() == recorded
    report = json.loads((sweep / "sweep.json").read_text())
    assert [job["overrides"]["seed"] for job in report["jobs"]] == ["1"], report["jobs"]


# --- a resumed run is the run its dir holds ----------------------------------------------------
def _interrupted_run(run_dir: Path, *overrides: str) -> str:
    """A run dir as a preempted run of `overrides` leaves it; returns its config.yaml."""
    from tfrecipe.config.compose import compose
    from tfrecipe.rundir import RunFiles

    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "preempted"}))
    RunFiles(run_dir).write_config(compose([*TINY, *overrides]))
    return (run_dir / "config.yaml").read_text()


def test_resuming_with_another_dataset_or_model_is_refused_naming_the_keys(cli, tmp_path):
    run_dir = tmp_path / "run"
    saved = _interrupted_run(run_dir)

    result = cli(*TINY, "model=mlp", "dataset=synthetic", f"hydra.run.dir={run_dir}")

    line = _one_line_refusal(result, f"hydra.run.dir={run_dir} holds a run started with another")
    assert "dataset._target_ ('tfrecipe.data.bundled.digits' -> " in line, line
    assert "model._target_ ('tfrecipe.models.cnn' -> 'tfrecipe.models.mlp')" in line, line
    assert line.endswith("continue this one with resume_allow_changes=[dataset,model]"), line
    assert (run_dir / "config.yaml").read_text() == saved  # nothing rewritten
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "summary.json"]


def test_resuming_on_another_number_of_replicas_is_refused_unless_the_global_batch_is_kept(
    cli, tmp_path
):
    """Two replicas at 16 examples each, preempted after step 2; one replica would read from
    step x 16 instead of step x 32 (the config unchanged but for the allowed strategy)."""
    run_dir = tmp_path / "run"
    stop = [
        "+callbacks.extra.stop._target_=tests.helpers.finetune_models.SignalAtStep",
        "+callbacks.extra.stop.step=2",
        "allowed_targets=[tests.helpers]",
    ]
    common = [*TINY, "batching.steps_per_execution=1", *stop, f"hydra.run.dir={run_dir}"]
    first = cli("strategy=mirrored", "strategy.logical_cpus=2", *common, env=USER_ENV)
    assert first.returncode == 75, first.stderr[-3000:]
    saved = _summary(run_dir)["steps_completed"]

    moved = ["strategy=default", "resume_allow_changes=[strategy]", *common]
    line = _one_line_refusal(cli(*moved, env=USER_ENV), "num_replicas=1: ")
    assert "trained on 2 replicas at a global batch of 32" in line, line
    assert line.endswith("batching=global batching.global_batch_size=32"), line

    kept = cli(
        *moved,
        "batching=global",
        "batching.global_batch_size=32",
        "resume_allow_changes=[strategy,batching]",
        env=USER_ENV,
    )
    assert kept.returncode == 0, kept.stderr[-3000:]
    summary = _summary(run_dir)
    assert (summary["resumed_from_step"], summary["global_batch_size"]) == (saved, 32)


def _whole_and_resumed_at_step_4(cli, tmp_path: Path, run: list[str]):
    """(whole, resumed, the resume's result): `run` uninterrupted into `whole`, and into
    `resumed` preempted after step 5 (mid-epoch 2 of 3-step epochs, one step per call), then
    run again to its end."""
    stop = [
        "+callbacks.extra.stop._target_=tests.helpers.finetune_models.SignalAtStep",
        "+callbacks.extra.stop.step=4",
        "allowed_targets=[tests.helpers]",
    ]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert cli(*run, f"hydra.run.dir={whole}").returncode == 0
    first = cli(*run, *stop, f"hydra.run.dir={resumed}", env=USER_ENV)
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    assert _summary(resumed)["steps_completed"] == 5
    again = cli(*run, f"hydra.run.dir={resumed}")
    assert again.returncode == 0, again.stderr[-3000:]
    # the metrics' totals the backup holds are read later: no warning that they were left out
    assert "could not be found in the restored object" not in again.stderr, again.stderr[-3000:]
    return whole, resumed, again


def test_early_stopping_resumed_stops_and_restores_as_the_uninterrupted_run(cli, tmp_path):
    """Early stopping counts the epochs a preempted run trained before its resume: an epoch that
    does not beat epoch 1 by `min_delta` waits, so both runs stop after epoch 3 and keep epoch
    1's weights (best.weights.h5 holds them: its monitor's best of the epochs before the resume;
    Keras' callback would start afresh, stop after epoch 4 and restore epoch 2's)."""
    import keras

    stopping = [
        *TINY,
        "loop.epochs=6",
        "batching.steps_per_execution=1",
        "deterministic=true",
        "callbacks.early_stopping.enabled=true",
        "callbacks.early_stopping.patience=2",
        "callbacks.early_stopping.min_delta=10",
        "callbacks.model_checkpoint.mode=max",
    ]
    whole, resumed, again = _whole_and_resumed_at_step_4(cli, tmp_path, stopping)
    assert "Warning" not in again.stderr, again.stderr[-3000:]  # none of Keras' on the load

    expected = {"epochs_completed": 3, "stopped_epoch": 3, "steps_completed": 9}
    for summary in (_summary(whole), _summary(resumed)):
        assert {key: summary[key] for key in expected} == expected, summary
    weights = [keras.saving.load_model(d / "model.keras").get_weights() for d in (whole, resumed)]
    for resumed_weights, uninterrupted in zip(*weights, strict=True):
        np.testing.assert_array_equal(resumed_weights, uninterrupted)


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_an_epoch_resumed_mid_way_logs_the_uninterrupted_runs_training_metrics(cli, tmp_path, loop):
    """The backup keeps the training metrics' running totals: the epoch a preempted run resumes
    in logs its loss and accuracy over all its steps, as the uninterrupted run does (they were
    over the steps after the resume only), in history.csv and summary.json's metrics."""
    one_step = "batching.steps_per_execution=1" if loop == "fit" else "loop.steps_per_loop=1"
    run = [*TINY, "loop.epochs=3", f"loop={loop}", one_step]
    whole, resumed, _ = _whole_and_resumed_at_step_4(cli, tmp_path, run)
    rows = [(d / "history.csv").read_text().splitlines() for d in (whole, resumed)]
    assert rows[0] == rows[1]  # epoch 2, resumed after its second step, to the last digit
    assert _summary(resumed)["metrics"] == _summary(whole)["metrics"]


def test_an_epoch_resumed_mid_way_keeps_its_accuracy_under_the_default_strategy(cli, tmp_path):
    """Preempted in a 5-step first epoch (saved at step 4): the resumed run's accuracy in history.csv
    is over the epoch's 5 steps, as the uninterrupted run's (its compiled metrics, built only when
    the first step is traced, missed the backup's totals: 1 step's accuracy, loss right)."""
    run = ["loop.epochs=1", "loop.steps_per_epoch=5", "loop.verbose=0"]
    run += ["batching.steps_per_execution=1", "logger=[csv]"]
    stop = [
        "+callbacks.extra.stop._target_=tests.helpers.finetune_models.SignalAtStep",
        "+callbacks.extra.stop.step=3",
        "allowed_targets=[tests.helpers]",
    ]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert cli(*run, f"hydra.run.dir={whole}").returncode == 0
    first = cli(*run, *stop, f"hydra.run.dir={resumed}", env=USER_ENV)
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    again = cli(*run, f"hydra.run.dir={resumed}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert _summary(resumed)["resumed_from_step"] == 4  # the step the preemption saved
    rows = [(d / "history.csv").read_text().splitlines() for d in (whole, resumed)]
    assert rows[0] == rows[1]


def test_what_a_resumed_run_may_change_and_what_it_may_be_allowed_to(tmp_path):
    from tfrecipe.config.changes import Resuming, check_resume_unchanged
    from tfrecipe.config.compose import compose
    from tfrecipe.errors import ConfigError
    from tfrecipe.rundir import public_config

    run_dir = tmp_path / "run"
    _interrupted_run(run_dir)

    def check(*overrides: str, allowed=(), resume="auto") -> None:
        config = public_config(compose([*TINY, *overrides]))
        check_resume_unchanged(run_dir, config, Resuming(resume, tuple(allowed)))

    check("loop.epochs=5", "loop.verbose=2", "logger=[csv,tensorboard]", "sweep.fail_fast=true")
    check("callbacks.backup.every_n_steps=7", "resume_allow_changes=[seed]")
    with pytest.raises(ConfigError, match=r"changed: seed \(42 -> 7\)\. Choose"):
        check("seed=7")
    check("seed=7", allowed=["seed"])
    check("dataset.validation_fraction=0.3", allowed=["dataset"])  # a key allows what is under it
    check("model=mlp", resume="never")  # a new run only: the dir check refuses a held dir


# --- a final status on every exit path -------------------------------------------------------
def test_a_failure_while_building_the_model_leaves_a_failed_summary(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(
        *TINY,
        "model._target_=tests.helpers.failing_model.out_of_memory",
        "~model.filters",
        "~model.dense_units",
        "~model.dropout",
        "allowed_targets=[tests.helpers]",
        f"hydra.run.dir={run_dir}",
        env=USER_ENV,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "summary.json and traceback.txt have the details" in result.stdout + result.stderr
    summary = _summary(run_dir)
    assert summary["status"] == "failed"
    assert "OOM when allocating" in summary["error"]
    assert "OOM when allocating" in (run_dir / "traceback.txt").read_text()


def test_a_run_ends_when_a_users_thread_pool_was_never_shut_down(cli, tmp_path):
    """The process ends as the interpreter would: the pool's queued work done, its idle worker
    stopped (the fast exit once joined that thread first and waited forever)."""
    run_dir, epochs = tmp_path / "run", tmp_path / "epochs.jsonl"
    result = cli(
        *TINY,
        "+callbacks.extra.pool._target_=tests.helpers.pooled_callback.PooledCallback",
        f"+callbacks.extra.pool.path={epochs}",
        "allowed_targets=[tests.helpers]",
        f"hydra.run.dir={run_dir}",
        env=USER_ENV,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [json.loads(line)["epoch"] for line in epochs.read_text().splitlines()] == [0, 1]
    assert _summary(run_dir)["status"] == "completed"


def test_a_rerun_whose_only_backup_is_unreadable_ends_failed_not_running(cli, tmp_path):
    run_dir = tmp_path / "run"
    backup = run_dir / "backup"
    backup.mkdir(parents=True)
    # What a killed run leaves: status "running", one backup (here damaged).
    (run_dir / "summary.json").write_text(json.dumps({"status": "running", "steps_completed": 3}))
    (backup / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-3"\n'
    )
    (backup / "ckpt-3.index").write_bytes(b"not a checkpoint index")
    (backup / "ckpt-3.data-00000-of-00001").write_bytes(b"not checkpoint data")

    result = cli(*TINY, f"hydra.run.dir={run_dir}")

    assert result.returncode == 1, result.stderr[-3000:]
    summary = _summary(run_dir)
    assert summary["status"] == "failed", summary
    assert "can be restored" in summary["error"]


def test_a_second_ctrl_c_is_recorded_as_what_it_was(tmp_path):
    """A second Ctrl-C stops at once (KeyboardInterrupt, no text of its own): summary.json's
    error says so and how to go on (it said "KeyboardInterrupt: ")."""
    from tfrecipe.fault.disk import error_text

    text = error_text(KeyboardInterrupt(), tmp_path)
    assert text.startswith("interrupted (a second Ctrl-C)") and "resume" in text, text


@pytest.mark.heavy
def test_ctrl_c_saves_a_backup_and_exits_preempted_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "tfrecipe",
        "loop.epochs=2",
        "loop.steps_per_epoch=200",
        "loop.verbose=0",
        "batching.per_replica_batch_size=16",
        "logger.csv.every_n_steps=1",
        f"hydra.run.dir={run_dir}",
    ]
    # A terminal's process: SIGINT not ignored. A pytest-xdist worker ignores SIGINT and its
    # children inherit that, and tfrecipe rightly leaves an ignored SIGINT ignored (a shell
    # script's background job), so without this the run would finish untouched.
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        steps = run_dir / "steps.csv"
        _wait(lambda: steps.exists() and len(steps.read_text().splitlines()) > 3, process, 120)
        process.send_signal(signal.SIGINT)  # what Ctrl-C sends
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == EXIT_PREEMPTED, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert "interrupted (SIGINT)" in output and "rerun to resume" in output, output[-3000:]
    summary = _summary(run_dir)
    assert summary["status"] == "preempted"
    assert (run_dir / "backup" / f"ckpt-{summary['steps_completed']}.index").is_file()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_while_the_run_starts_is_recorded_as_preempted(tmp_path, signum):
    """The moment its run dir exists (about 1 s in, long before TensorFlow is imported)."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "tfrecipe", *TINY, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    try:
        _wait(run_dir.exists, process, 60)
        process.send_signal(signum)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == EXIT_PREEMPTED, output[-3000:]
    assert "Traceback" not in output and "before training began" in output, output[-3000:]
    assert _summary(run_dir)["status"] == "preempted"


def test_a_signal_before_the_run_dir_is_known_is_recorded_once_it_is(tmp_path):
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "tfrecipe", *TINY, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(0.5)  # importing the command line, composing the config
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == EXIT_PREEMPTED, output[-3000:]
    assert "Traceback" not in output and "tensorflow" not in output.lower(), output[-3000:]
    assert _summary(run_dir)["status"] == "preempted"


def test_a_subcommand_stops_on_sigterm_as_any_program_does(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "tfrecipe", "ls"], stdout=subprocess.DEVNULL)
    time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) in (-signal.SIGTERM, 0)  # killed, or done already


# --- a full disk --------------------------------------------------------------------------------
# Runs the command line with its run dir on a tmpfs of SIZE in a private mount namespace (a user
# namespace where not root): a real ENOSPC, not a simulated one. Prints, after the run, its exit
# code and what the run dir holds (the mount goes with the namespace).
_ON_A_SMALL_DISK = """
mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99
run_dir="$2/run"; shift 2
"$@"; echo "exit code: $?"
python3 -c 'import json, os, sys; root = sys.argv[1]
print("left:", json.dumps(sorted(os.path.relpath(os.path.join(d, f), root)
      for d, _, files in os.walk(root) for f in files if "/.hydra" not in d)))
print("summary:", open(os.path.join(root, "summary.json")).read().replace(chr(10), " "))' "$run_dir"
"""


def _unshare() -> list[str] | None:
    """The `unshare` that gives this process a mount namespace it can mount a tmpfs in."""
    for command in (["unshare", "-m"], ["unshare", "-U", "-r", "-m"]):
        probe = subprocess.run(
            [*command, "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True
        )
        if probe.returncode == 0:
            return command
    return None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("size", "overrides", "left"),
    [
        # best.weights.h5 (the optimizer's slots too: 0.94 MB) does not fit: where h5py crashed
        ("1m", [], {"config.yaml", "signature.json", "history.csv", "steps.csv", "tfrecipe.log"}),
        # a backup at every step fills it: TensorFlow's checkpoint writer fails mid-save
        (
            "1200k",
            [
                "callbacks.model_checkpoint.enabled=false",
                "callbacks.backup.enabled=true",
                "callbacks.backup.every_n_steps=1",
            ],
            {
                "config.yaml",
                "signature.json",
                "steps.csv",
                "tfrecipe.log",
                "backup/checkpoint",
                "backup/ckpt-1.index",
                "backup/ckpt-1.data-00000-of-00001",
            },
        ),
    ],
    ids=["best weights", "backups"],
)
def test_a_full_disk_ends_failed_disk_full_in_one_line_without_partial_files(
    tmp_path, size, overrides, left
):
    unshare = _unshare()
    if unshare is None:
        pytest.skip("no mount namespace here (unshare -m / -U -r -m) for a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    result = subprocess.run(
        [
            *unshare,
            "sh",
            "-c",
            _ON_A_SMALL_DISK,
            "sh",
            size,
            str(disk),
            sys.executable,
            "-m",
            "tfrecipe",
            *TINY,
            *overrides,
            f"hydra.run.dir={disk}/run",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert "exit code: 1\n" in result.stdout, output[-3000:]  # not 139 (h5py's segfault)
    assert "Traceback" not in output and "Logging error" not in output, output[-3000:]
    failed = [line for line in output.splitlines() if "training failed: disk full" in line]
    assert len(failed) == 1, output[-3000:]
    summary = json.loads(result.stdout.split("summary: ", 1)[1])
    assert summary["status"] == "failed" and summary["error"].startswith("disk full"), summary
    files = set(json.loads(result.stdout.split("left: ", 1)[1].splitlines()[0]))
    # no .reserve, .NAME.tmp, .partial-*, *_temp: only complete files (and what failed says)
    # (and the run's own manifest and data fingerprint, written whole at its start)
    assert files == {
        *left,
        "summary.json",
        "traceback.txt",
        ".tfrecipe-files",
        "data_fingerprint.json",
    }, files


# Fills the tmpfs to 8 KB free before the command runs: Hydra's own .hydra/ files do not fit.
_ON_A_FULL_DISK = """
mount -t tmpfs -o size=1m tmpfs "$1" || exit 99
python3 -c 'import os, sys; s = os.statvfs(sys.argv[1])
open(os.path.join(sys.argv[1], "filler"), "wb").write(b"x" * (s.f_bavail * s.f_frsize - 8192))' "$1"
run_dir="$1/run"; shift
"$@"; echo "exit code: $?"
echo "left: $(cd "$run_dir" && find . -type f | sort | tr '\\n' ' ')"
echo "summary: $(cat "$run_dir/summary.json" | tr -d '\\n')"
"""


@pytest.mark.heavy  # a process on a mount of its own; it stops before TensorFlow loads (seconds)
def test_a_disk_full_before_training_starts_is_one_line_and_a_failed_summary(tmp_path):
    unshare = _unshare()
    if unshare is None:
        pytest.skip("no mount namespace here (unshare -m / -U -r -m) for a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    result = subprocess.run(
        [
            *unshare,
            "sh",
            "-c",
            _ON_A_FULL_DISK,
            "sh",
            str(disk),
            sys.executable,
            "-m",
            "tfrecipe",
            *TINY,
            f"hydra.run.dir={disk}/run",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "exit code: 1\n" in result.stdout, result.stdout + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip() == (
        f"tfrecipe: training failed: disk full: no space left in {disk}/run (free some, then "
        "rerun the same command to resume from the last backup); OSError: [Errno 28] No space "
        "left on device"
    )
    # Hydra's half files gone; the run's manifest (which names .hydra/) is whole
    assert "left: ./.tfrecipe-files ./summary.json \n" in result.stdout, result.stdout
    summary = json.loads(result.stdout.split("summary: ", 1)[1])
    assert summary["status"] == "failed" and summary["error"].startswith("disk full"), summary


# --- refused before anything is allocated or trained -----------------------------------------
def test_synthetic_data_that_cannot_fit_in_memory_is_refused_with_the_estimate(cli, tmp_path):
    run_dir = tmp_path / "run"
    # 10^6 images of 1024x1024x3 float32: 12.6 TB, more than any machine here has.
    result = cli(
        "dataset=synthetic",
        "dataset.num_examples=1000000",
        "dataset.shape=[1024,1024,3]",
        f"hydra.run.dir={run_dir}",
    )
    line = _one_line_refusal(result, "dataset.num_examples=1000000", "TB", "available")
    assert "[1024, 1024, 3]" in line
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        # a mean per cluster: 10^9 x 64 float32 = 256 GB
        (["dataset.num_classes=1000000000", "dataset.shape=[64]"], ["GB", "(a mean per class)"]),
        # multi-hot codes: (10^6)^2 float32 = 4 TB
        (
            [
                "dataset.num_classes=1000000",
                "dataset.shape=[4]",
                "dataset.targets=multi_hot",
                "task=multilabel",
            ],
            ["TB", "multi_hot data", "multi-hot codes"],
        ),
    ],
    ids=["classes", "multi_hot"],
)
def test_synthetic_classes_that_cannot_fit_in_memory_are_refused(
    cli, tmp_path, overrides, fragments
):
    run_dir = tmp_path / "run"
    result = cli("dataset=synthetic", *overrides, f"hydra.run.dir={run_dir}")
    _one_line_refusal(result, "dataset.num_classes=", "available", *fragments)
    assert not run_dir.exists()


def test_label_ids_in_the_billions_are_refused_with_the_estimate_before_the_model(cli, tmp_path):
    """npz labels give num_classes = the largest id + 1: the head of 2,000,000,001 classes would
    take hundreds of GB (it grew until the OOM killer came)."""
    path = tmp_path / "data.npz"
    x = np.random.default_rng(0).normal(size=(60, 4)).astype("float32")
    np.savez(path, x=x, y=np.array([0, 1, 2_000_000_000] * 20))
    run_dir = tmp_path / "run"
    result = cli(
        *TINY, "dataset=npz", f"dataset.path={path}", "model=mlp", f"hydra.run.dir={run_dir}"
    )
    _one_line_refusal(result, "2000000001 classes", "GB of memory is available", "0..k-1")
    assert not run_dir.exists()


def test_an_image_folder_link_to_a_device_is_refused_before_it_is_read(tmp_path):
    from helpers.datafiles import write_image_folder

    from tfrecipe.data import image_folder

    root = write_image_folder(tmp_path / "pics")
    (root / "dark" / "zero.jpg").symlink_to("/dev/zero")
    with pytest.raises(
        ValueError, match=r"zero\.jpg: a link to /dev/zero, a character device; an image of"
    ):
        image_folder.load(path=str(root))
    (root / "dark" / "zero.jpg").unlink()
    with open(root / "dark" / "huge.png", "wb") as huge:  # sparse: no disk used
        huge.truncate(image_folder.MAX_IMAGE_BYTES + 1)
    with pytest.raises(
        ValueError, match=r"huge\.png: 512\.0 MB, more than an image of a training set can be"
    ):
        image_folder.load(path=str(root))


def test_the_memory_estimate_counts_what_synthetic_data_holds():
    from tfrecipe.data.bundled import synthetic_bytes

    assert synthetic_bytes(num_examples=20000, shape=[256, 256, 3]) == 20000 * 256 * 256 * 3 * 4


def test_a_hydra_logging_mistake_is_one_line(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli("hydra.job_logging.handlers.file.class=nope.Nope", f"hydra.run.dir={run_dir}")
    _one_line_refusal(result, "hydra.job_logging", "nope")
    assert not run_dir.exists()


def test_nan_features_in_an_npz_file_are_refused_when_loaded(cli, tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 8, 8, 1)).astype("float32")
    x[3, 0, 0, 0] = x[7, 1, 2, 0] = x[9, 4, 4, 0] = np.nan
    x[11, 0, 0, 0] = np.inf
    path = tmp_path / "data.npz"
    np.savez(path, x=x, y=np.arange(64) % 2)
    run_dir = tmp_path / "run"

    result = cli(*TINY, "dataset=npz", f"dataset.path={path}", f"hydra.run.dir={run_dir}")

    _one_line_refusal(result, str(path), "4 non-finite")
    assert not run_dir.exists()
