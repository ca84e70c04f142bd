"""The real command line (`python -m tfrecipe ...` in a subprocess), as a user meets it.

Bad input: exit code 2, one clear line per problem naming the key and the value received, no
traceback, and no run directory left behind. Good input: the default job trains to the promised
accuracy and leaves everything in its run directory; help and config printing stay fast (no
TensorFlow import).
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
from conftest import REPO, TINY

CONF = REPO / "conf"
SUMMARY_FIELDS = {
    "status",
    "strategy",
    "num_replicas",
    "loop",
    "global_batch_size",
    "epochs_completed",
    "steps_completed",
    "resumed_from_step",
    "metrics",
    "test",
    "examples_per_sec",
    "wall_time_s",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def config_report(result) -> str:
    """tfrecipe's configuration-error report: its first line plus the `  - problem` lines."""
    lines = result.stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("tfrecipe: invalid config")]
    assert len(starts) == 1, f"expected one report in stderr:\n{result.stderr[-3000:]}"
    report = [lines[starts[0]]]
    report += [line for line in lines[starts[0] + 1 :] if line.startswith("  - ")]
    return "\n".join(report)


def assert_refused(result, run_dir: Path, *fragments: str) -> str:
    """Exit code 2, a report holding every fragment, no traceback, no run dir."""
    output = f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode == 2, output
    assert "Traceback" not in result.stderr + result.stdout, output
    report = config_report(result)
    for fragment in fragments:
        assert fragment in report, f"{fragment!r} missing from the report:\n{report}"
    assert not run_dir.exists(), f"a run dir was left behind: {sorted(run_dir.rglob('*'))}"
    return report


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_trained(result, run_dir: Path) -> dict:
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    return summary


# --- bad input -----------------------------------------------------------------------------------
# Each case: overrides, and the fragments its report must contain (the key and the value received,
# and what is allowed where the schema knows it). Cases marked "tf" are found after TensorFlow
# starts (they need the device list), so they cost a TensorFlow import.
BAD_INPUTS = {
    "unknown_group_option": (
        ["model=nope"],
        ["model=nope", *options("model")],
    ),
    "unknown_key": (["loop.nope=1"], ["loop.nope=1", "unknown key"]),
    "unknown_key_appended": (["+loop.nope=1"], ["loop.nope=1", "unknown key"]),
    "wrong_type": (
        ["batching.per_replica_batch_size=abc"],
        ["batching.per_replica_batch_size=abc", "integer"],
    ),
    "zero_batch_size": (
        ["batching.per_replica_batch_size=0"],
        ["batching.per_replica_batch_size=0", "greater than 0"],
    ),
    "zero_global_batch_size": (
        ["batching=global", "batching.global_batch_size=0"],
        ["batching.global_batch_size=0", "greater than 0"],
    ),
    "zero_epochs": (["loop.epochs=0"], ["loop.epochs=0", "greater than 0"]),
    "negative_epochs": (["loop.epochs=-3"], ["loop.epochs=-3", "greater than 0"]),
    "unknown_optimizer": (["optimizer.name=foo"], ["optimizer.name=foo", "adam", "sgd"]),
    "unknown_schedule": (
        ["optimizer.schedule=foo"],
        ["optimizer.schedule=foo", "constant", "cosine", "warmup_cosine"],
    ),
    "target_outside_allowed_packages": (
        ["model._target_=mypkg.build"],
        ["model._target_", "mypkg.build", "allowed_targets"],
    ),
    "os_system_even_when_allowed": (
        ["model._target_=os.system", "allowed_targets=[os]"],
        ["allowed_targets", "'os'", "standard library"],
    ),
    "missing_required_value": (["loop.epochs=???"], ["loop.epochs", "missing"]),
}
TF_BAD_INPUTS = {
    "global_batch_not_divisible": (
        [
            "batching=global",
            "batching.global_batch_size=15",
            "strategy=mirrored",
            "strategy.logical_cpus=2",
        ],
        ["batching.global_batch_size=15", "2 replicas"],
    ),
    "precision_without_hardware": (
        ["precision=mixed_float16"],  # require_native defaults to true; this CPU has no float16
        ["precision=mixed_float16", "require_native=false"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_before_anything_is_created(cli, tmp_path, case):
    overrides, fragments = BAD_INPUTS[case]
    run_dir = tmp_path / "run"
    result = cli(*overrides, f"hydra.run.dir={run_dir}", env={"PYTHONPROFILEIMPORTTIME": "1"})
    report = assert_refused(result, run_dir, *fragments)
    assert "\n" not in report, "one problem, one line"
    assert "tensorflow" not in _imported_modules(result.stderr), "found before TensorFlow starts"


@pytest.mark.parametrize("case", sorted(TF_BAD_INPUTS))
def test_bad_input_found_by_the_hardware_check_is_refused(cli, tmp_path, case):
    overrides, fragments = TF_BAD_INPUTS[case]
    run_dir = tmp_path / "run"
    report = assert_refused(cli(*overrides, f"hydra.run.dir={run_dir}"), run_dir, *fragments)
    assert "\n" not in report


def test_several_problems_are_reported_together(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(
        "batching.per_replica_batch_size=0",
        "loop.epochs=-1",
        "optimizer.schedule=foo",
        "model._target_=mypkg.build",
        f"hydra.run.dir={run_dir}",
    )
    report = assert_refused(
        result,
        run_dir,
        "4 problems",
        "batching.per_replica_batch_size=0",
        "loop.epochs=-1",
        "optimizer.schedule=foo",
        "mypkg.build",
    )
    assert len(report.splitlines()) == 5, report  # a header and one line per problem


def test_unwritable_run_dir_is_refused(cli, tmp_path):
    # Tests run as root, so permissions cannot make a directory unwritable: a regular file in
    # the path can.
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    run_dir = blocker / "run"
    assert_refused(cli(f"hydra.run.dir={run_dir}"), run_dir, f"hydra.run.dir={run_dir}")
    assert blocker.read_text() == "not a directory\n"


def test_a_completed_run_is_never_overwritten(cli, tmp_path):
    run_dir = tmp_path / "done"
    run_dir.mkdir()
    summary = {"status": "completed", "strategy": "default", "num_replicas": 1, "metrics": {}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "model.keras").write_bytes(b"the model of the finished run")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}

    result = cli(f"hydra.run.dir={run_dir}", *TINY)

    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    report = config_report(result)
    assert f"hydra.run.dir={run_dir}" in report and "completed run" in report, report
    assert sorted(run_dir.rglob("*")) == sorted(before), "nothing added"
    assert {p: p.read_bytes() for p in before} == before, "nothing changed"


def _user_conf(tmp_path: Path, model_yaml: str) -> Path:
    """A user's own config dir (`--config-dir`) with one extra model option."""
    conf = tmp_path / "my_conf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "tiny_dense.yaml").write_text(model_yaml)
    return conf


USER_MODEL = "tests.helpers.user_models.tiny_dense"
USER_ENV = {"PYTHONPATH": str(REPO)}  # the user's package is importable


def _run_user_model(cli, tmp_path: Path, model_yaml: str, *overrides: str):
    """A tiny run of `model=tiny_dense` from a user's config dir (USER_MODEL with `model_yaml`
    for its options); returns (result, run_dir)."""
    conf = _user_conf(tmp_path, f"_target_: {USER_MODEL}\n{model_yaml}")
    run_dir = tmp_path / "run"
    result = cli(
        "--config-dir",
        str(conf),
        "model=tiny_dense",
        *overrides,
        *TINY,
        f"hydra.run.dir={run_dir}",
        env=USER_ENV,
    )
    return result, run_dir


def test_missing_required_value_in_a_users_config(cli, tmp_path):
    result, run_dir = _run_user_model(
        cli, tmp_path, "# Required.\nwidth: ???\n", "allowed_targets=[tests.helpers]"
    )
    assert_refused(result, run_dir, "model.width", "missing")


# --- answers without TensorFlow --------------------------------------------------------------------
def _imported_modules(stderr: str) -> set[str]:
    """Module names from `-X importtime` lines: 'import time: self | cumulative | name'."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--help"], ["Configuration groups", "model: " + ", ".join(options("model"))]),
        (["--cfg", "job"], ["_target_: tfrecipe.models.cnn", "per_replica_batch_size: 64"]),
        (["--cfg", "job", "model=mlp", "loop.epochs=3"], ["tfrecipe.models.mlp", "epochs: 3"]),
        (["--info"], ["Defaults List", "model/cnn"]),
    ],
    ids=["help", "cfg_job", "cfg_job_overrides", "info"],
)
def test_informational_commands_do_not_import_tensorflow(cli, tmp_path, args, expected):
    result = cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    imported = _imported_modules(result.stderr)
    assert "hydra" in imported, "the import profile was not recorded"
    heavy = sorted(m for m in imported if m.split(".")[0] in {"tensorflow", "keras"})
    assert not heavy, f"{args} imported {heavy[:5]}"
    for fragment in expected:
        assert fragment in result.stdout, f"{fragment!r} not in:\n{result.stdout[:3000]}"
    assert list(tmp_path.iterdir()) == [], "nothing written"


# --- training through the command line ---------------------------------------------------------
@pytest.mark.slow
def test_default_command_trains_the_default_task_and_fills_the_run_dir(cli, tmp_path):
    import keras
    import numpy as np
    from omegaconf import OmegaConf

    from tfrecipe.data.bundled import digits

    run_dir = tmp_path / "run"
    # print_config=true: the changes show where stdout is not a terminal too (auto: terminals).
    result = cli(f"hydra.run.dir={run_dir}", "print_config=true")
    summary = assert_trained(result, run_dir)

    # summary.json: the README's fields (Where outputs go), and the accuracy target.
    assert set(summary) >= SUMMARY_FIELDS, SUMMARY_FIELDS - set(summary)
    assert (summary["strategy"], summary["num_replicas"], summary["loop"]) == ("default", 1, "fit")
    assert summary["global_batch_size"] == 64
    assert summary["resumed_from_step"] is None
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(summary["metrics"])
    assert summary["test"]["accuracy"] >= 0.97, summary["test"]
    assert summary["examples_per_sec"] > 0
    # The wall time covers the training it measures (no bound: shared machines vary): the steps
    # at the steady-state rate take no longer than the whole run.
    examples = summary["steps_completed"] * summary["global_batch_size"]
    assert 0 < examples / summary["examples_per_sec"] < summary["wall_time_s"], summary

    # config.yaml: resolved (no interpolation left), what actually ran.
    text = (run_dir / "config.yaml").read_text()
    assert "${" not in text
    cfg = OmegaConf.create(text)
    assert cfg.model._target_ == "tfrecipe.models.cnn" and "hydra" not in cfg
    epochs = cfg.loop.epochs
    assert summary["epochs_completed"] == epochs
    splits = digits(**{k: v for k, v in cfg.dataset.items() if k != "_target_"})
    steps_per_epoch = math.ceil(splits.info.num_train / summary["global_batch_size"])
    assert summary["steps_completed"] == epochs * steps_per_epoch

    # history.csv: one row per epoch with Keras' metric names.
    with open(run_dir / "history.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == epochs
    assert {"epoch", "loss", "accuracy", "val_loss", "val_accuracy"} <= set(rows[0])
    assert float(rows[-1]["loss"]) == pytest.approx(summary["metrics"]["loss"])

    # curves.png: a real image.
    assert (run_dir / "curves.png").read_bytes()[:8] == PNG_MAGIC

    # model.keras: loads, and is the model whose test accuracy the summary reports.
    model = keras.saving.load_model(run_dir / "model.keras")
    features = np.concatenate([x for x, _ in splits.test.batch(512).as_numpy_iterator()])
    labels = np.concatenate([y for _, y in splits.test.batch(512).as_numpy_iterator()])
    accuracy = float(np.mean(np.argmax(model.predict(features, verbose=0), -1) == labels))
    assert accuracy == pytest.approx(summary["test"]["accuracy"], abs=1e-6)

    # The log, and the console: what differs from the defaults and a progress bar per epoch.
    done = [
        line for line in (run_dir / "tfrecipe.log").read_text().splitlines() if "done: " in line
    ]
    assert "done: completed" in done[-1]
    # its last line says where the time went: throughput, step time, input wait, FLOP/s, MFU
    assert re.search(
        r"perf [\d.e+]+ ex/s, step [\d.]+ ms \(p90 [\d.]+\), input wait \d+%, "
        r"[\d.]+ GFLOP/s of [\d.]+ \(MFU [\d.]+%\)",
        done[-1],
    ), done[-1]
    assert "config: what differs from the defaults" in result.stdout
    assert "  print_config=true\n" in result.stdout and "\nplan:\n" in result.stdout
    assert "├── model" not in result.stdout  # the whole tree: config.yaml
    assert f"Epoch 1/{epochs}" in result.stdout and f"Epoch {epochs}/{epochs}" in result.stdout
    assert f"{steps_per_epoch}/{steps_per_epoch}" in result.stdout  # the bar reached its end


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["mirrored", "central_storage"])
def test_two_replicas_on_two_logical_cpus(cli, tmp_path, strategy):
    run_dir = tmp_path / "run"
    result = cli(
        f"strategy={strategy}", "strategy.logical_cpus=2", *TINY, f"hydra.run.dir={run_dir}"
    )
    summary = assert_trained(result, run_dir)
    assert (summary["strategy"], summary["num_replicas"]) == (strategy, 2)
    assert summary["global_batch_size"] == 2 * 16  # per-replica batch (TINY) x replicas


@pytest.mark.slow
def test_the_same_command_twice_gives_the_same_metrics(cli, tmp_path):
    runs = [tmp_path / "first", tmp_path / "second"]
    summaries = [
        assert_trained(cli(*TINY, "loop.steps_per_epoch=5", f"hydra.run.dir={d}"), d) for d in runs
    ]
    first, second = summaries
    assert first["metrics"] == second["metrics"]
    assert first["test"] == second["test"]
    assert (runs[0] / "history.csv").read_text() == (runs[1] / "history.csv").read_text()


@pytest.mark.slow
def test_a_users_own_model_from_their_package(cli, tmp_path):
    import keras

    result, run_dir = _run_user_model(
        cli, tmp_path, "width: 12\n", "allowed_targets=[tests.helpers]"
    )
    summary = assert_trained(result, run_dir)
    assert summary["model"] == USER_MODEL
    model = keras.saving.load_model(run_dir / "model.keras")
    assert model.name == "user_tiny_dense" and model.get_layer("user_hidden").units == 12


def test_a_users_model_needs_its_package_allowed(cli, tmp_path):
    result, run_dir = _run_user_model(cli, tmp_path, "width: 12\n")
    assert_refused(result, run_dir, "model._target_", USER_MODEL, "allowed_targets")


def test_a_late_config_error_leaves_an_existing_run_dir_as_it_was(cli, tmp_path):
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("the user's own file\n")
    result = cli("precision=mixed_float16", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "precision=mixed_float16" in config_report(result)
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"], "Hydra's files removed"
