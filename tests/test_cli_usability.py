"""What a new user meets first on the command line: batch typos, help, compare, a copied recipe,
and a console that says only what matters (issue 11, section 4)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

SUBCOMMANDS = ("ls", "cat", "cp", "validate", "compare", "evaluate", "help")
# Noise a run used to print: TensorFlow's INFO lines (Python's and the C++ start-up's), the cuInit
# error of a machine without a CUDA driver, and Keras' progress-bar redraws (carriage returns,
# backspaces, ANSI escapes).
NOISE = ("Reduce to", "then broadcast", "Collective all_reduce", "Start watcher", "cuInit")
NOISE += ("I0000 ", "absl::InitializeLog")
ANSI = re.compile(r"\x1b\[")


def test_a_global_batch_larger_than_the_training_split_is_refused(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli("batching.per_replica_batch_size=3000000000000", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines()[-1] == (
        "tfrecipe: invalid configuration: batching.per_replica_batch_size=3000000000000: the "
        "global batch (3000000000000) is larger than the training split (1257 examples); choose "
        "a global batch of at most 1257"
    )
    assert "Traceback" not in result.stderr and not run_dir.exists()


def _stdout_of(*args: str, cwd: Path) -> str:
    """What `python -m tfrecipe ARGS` prints (it must succeed)."""
    result = subprocess.run(
        [sys.executable, "-m", "tfrecipe", *args], cwd=cwd, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.heavy
def test_help_lists_the_subcommands_and_help_is_the_same(tmp_path):
    """How fast --help answers is measured in docs/benchmarks.md (a timed test would be flaky on a
    shared machine); here: what it says."""
    help_text = _stdout_of("--help", cwd=tmp_path)
    for command in SUBCOMMANDS:
        assert f"tfrecipe {command} " in help_text or f"tfrecipe {command}\n" in help_text, command
    assert (
        "model: cnn, keras_app, linear, mlp, resnet, text" in help_text and "recipe: " in help_text
    )
    assert "task: binary, classification, multilabel, regression" in help_text
    assert _stdout_of("help", cwd=tmp_path) == help_text


def _fake_run(run_dir: Path, learning_rate: str, val_loss: float) -> None:
    """A finished run as compare reads it: summary.json and Hydra's overrides."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(
        f"- optimizer.learning_rate={learning_rate}\n"
    )
    summary = {"status": "completed", "metrics": {"loss": 0.5, "val_loss": val_loss, "auc": 0.9}}
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_compare_reads_a_relative_multirun_dir_and_refuses_an_unknown_sort(cli, tmp_path):
    sweep = Path("multirun", "2026-11-21", "10-00-00")  # as the README writes it: relative
    _fake_run(tmp_path / sweep / "0", "0.001", val_loss=0.4)
    _fake_run(tmp_path / sweep / "1", "0.003", val_loss=0.3)
    result = cli("compare", str(sweep), "--sort", "auc")  # a metric of these runs sorts too
    assert result.returncode == 0, result.stderr[-2000:]
    rows = (tmp_path / sweep / "compare.csv").read_text().splitlines()
    assert [row.split(",")[:2] for row in rows[1:]] == [["0", "0.001"], ["1", "0.003"]]

    wrong = cli("compare", str(sweep), "--sort", "nope")
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert wrong.stderr.strip() == (
        "tfrecipe: invalid configuration: compare --sort=nope: not a column of these runs; "
        "sortable: loss, auc, val_loss, test_accuracy, examples_per_sec, wall_time_s"
    )


def _filtered_stderr(body: str) -> subprocess.CompletedProcess:
    """Runs `body` (writing to fd 2 as TensorFlow's C++ log does) inside the filter around
    TensorFlow's start-up, in a real process."""
    script = (
        "import os\n"
        "from tfrecipe.cli.console import _NO_DRIVER_LINE, _START_UP_INFO, _stderr_without\n"
        "with _stderr_without(_START_UP_INFO, _NO_DRIVER_LINE):\n"
        f"    {body}\n"
        "os.write(2, b'after\\n')\n"
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)


def test_the_start_up_filter_drops_only_info_and_the_cuinit_line():
    lines = [
        "I0000 00:00:1.1 1 cudart_stub.cc:31] Could not find cuda drivers on your machine",
        "E0000 00:00:1.2 1 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error",
        "W0000 00:00:1.3 1 other.cc:9] a warning",
        "E0000 00:00:1.4 1 other.cc:7] a real error",
    ]
    written = "".join(f"{line}\n" for line in lines).encode()
    result = _filtered_stderr(f"os.write(2, {written!r})")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [*lines[2:], "after"]


def test_the_start_up_filter_passes_on_the_last_words_of_an_aborting_process():
    """TensorFlow aborts on a CPU it cannot run on; its reason must still reach the user."""
    result = _filtered_stderr("os.write(2, b'F0000 cpu_feature_guard.cc:1] no AVX\\n'); os.abort()")
    assert result.returncode != 0 and "F0000 cpu_feature_guard.cc:1] no AVX" in result.stderr


@pytest.fixture(scope="module")
def copied_recipe_run(tmp_path_factory):
    """`tfrecipe cp digits_cnn_mirrored mine.yaml`, then the command on the copy's first line
    (shortened to 2 epochs of 3 steps), its stdout a pipe as in a SLURM output file or CI log."""
    cwd = tmp_path_factory.mktemp("copied")
    copied = subprocess.run(
        [sys.executable, "-m", "tfrecipe", "cp", "digits_cnn_mirrored", "mine.yaml"],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    assert copied.returncode == 0, copied.stderr
    first_line = (cwd / "mine.yaml").read_text().splitlines()[0]
    command = shlex.split(first_line.removeprefix("# "))
    assert command == ["python", "-m", "tfrecipe", "recipe=mine.yaml"]
    (cwd / "mine.yaml").write_text((cwd / "mine.yaml").read_text() + "seed: 7\n")  # an edit
    short = ["loop.epochs=2", "loop.steps_per_epoch=3", "batching.per_replica_batch_size=16"]
    run = subprocess.run(
        [sys.executable, *command[1:], *short, "hydra.run.dir=run"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return run, cwd / "run"


@pytest.mark.slow
def test_a_copied_recipe_runs_with_the_command_on_its_first_line(copied_recipe_run):
    run, run_dir = copied_recipe_run
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["strategy"] == "mirrored"
    assert summary["seed"] == 7  # the copy, as edited, is what ran


@pytest.mark.slow
def test_a_piped_mirrored_run_prints_one_line_per_epoch_and_no_noise(copied_recipe_run):
    run, _ = copied_recipe_run
    assert run.returncode == 0, run.stderr[-3000:]
    console = run.stdout + run.stderr
    assert not re.search(r"[\r\b]", console) and not ANSI.search(console), "bar redraws in a log"
    assert len(re.findall(r"^3/3 - .*val_loss", run.stdout, re.MULTILINE)) == 2, run.stdout
    for noise in NOISE:
        assert noise not in console, f"{noise!r} in the console:\n{console[-3000:]}"


@pytest.mark.slow
def test_a_local_cluster_console_has_the_chiefs_lines_only(cli, tmp_path):
    """Two workers train in step: the chief alone shows the config and the progress; the launcher
    says nothing when all goes well; TensorFlow's collective INFO lines stay off."""
    run = cli(
        "strategy=multi_worker_mirrored",
        "cluster=local",
        "cluster.num_workers=2",
        "loop.epochs=2",
        "loop.steps_per_epoch=3",
        "batching.per_replica_batch_size=16",
        "print_config=true",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    console = run.stdout + run.stderr
    assert run.returncode == 0, console[-3000:]
    assert "[worker 0] config" in console and "[worker 1] config" not in console
    assert console.count("[worker 0] 3/3 - ") == 2 and "[worker 1] 3/3" not in console
    assert "[launcher]" not in console
    for noise in NOISE:
        assert noise not in console, f"{noise!r} in the console:\n{console[-3000:]}"


@pytest.mark.heavy  # a fresh interpreter imports TensorFlow
def test_evaluate_export_and_predict_load_tensorflow_off_the_console():
    """`evaluate`, `export` and `predict` import TensorFlow at whichever step needs it, inside
    `quiet_start_up` (tfrecipe/cli/commands.py): its start-up INFO lines stay off the console as
    training's do, and the module loads whole (its loader's other methods still answer)."""
    script = (
        "import os, sys\n"
        "from tfrecipe.cli.console import quiet_start_up\n"
        "with quiet_start_up():\n"
        "    assert 'tensorflow' not in sys.modules\n"
        "    from tfrecipe.models import build  # imports TensorFlow, as evaluate's module does\n"
        "import tensorflow as tf\n"
        "print(tf.constant(2).numpy() * 21, tf.__spec__.loader.is_package('tensorflow'))\n"
        "os.write(2, b'after\\n')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},  # as tfrecipe's main sets it
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["42", "True"]
    for noise in NOISE:
        assert noise not in result.stderr, f"{noise!r} in the console:\n{result.stderr[-3000:]}"
    assert result.stderr.splitlines()[-1] == "after"
