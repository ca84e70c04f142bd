"""`tfrecipe evaluate` and the periodic model export."""

from __future__ import annotations

import json

import keras
import pytest

from tfrecipe.cli.evaluate import evaluate_run
from tfrecipe.errors import ConfigError


def test_evaluate_reports_the_runs_own_test_metrics(train_run):
    summary, run_dir = train_run("model=mlp")
    result = evaluate_run(run_dir)
    assert result["split"] == "test"
    assert result["metrics"]["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-5)
    assert result["metrics"]["accuracy"] == pytest.approx(summary["test"]["accuracy"])


def test_evaluate_the_best_weights_and_an_override(train_run):
    _, run_dir = train_run("model=mlp")
    result = evaluate_run(run_dir, which="best", overrides=["dataset.test_fraction=0.5"])
    assert 0.0 <= result["metrics"]["accuracy"] <= 1.0
    assert result["model"] == "best"


def test_evaluate_without_the_model_file_is_a_clear_error(train_run):
    _, run_dir = train_run("model=mlp")
    (run_dir / "model.keras").unlink()
    with pytest.raises(ConfigError, match=r"--model=model\.keras: no such file"):
        evaluate_run(run_dir)


def test_periodic_export_saves_a_loadable_model_every_n_epochs(train_run):
    _, run_dir = train_run("model=mlp", "loop.epochs=4", "callbacks.export.every_n_epochs=2")
    exported = sorted(p.name for p in run_dir.glob("model-*.keras"))
    assert exported == ["model-002.keras", "model-004.keras"]
    model = keras.saving.load_model(run_dir / "model-004.keras")
    final = keras.saving.load_model(run_dir / "model.keras")
    for a, b in zip(model.get_weights(), final.get_weights(), strict=True):
        assert (a == b).all()  # the last export is the final model
    assert not list(run_dir.glob(".partial-*"))


@pytest.mark.slow
def test_evaluate_through_the_command_line(train_run, cli):
    summary, run_dir = train_run("model=mlp")
    result = cli("evaluate", str(run_dir))
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout[result.stdout.index("{") :])
    assert printed["metrics"]["accuracy"] == pytest.approx(summary["test"]["accuracy"])
    assert json.loads((run_dir / "evaluation.json").read_text()) == printed
    missing = cli("evaluate", str(run_dir / "nope"))
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


@pytest.mark.parametrize(
    ("broken", "content", "message"),
    [
        (
            "model.keras",
            b"PK\x03\x04 not a whole zip",
            r"--model=model\.keras: .*model\.keras: not a readable zip archive \(BadZipFile",
        ),
        ("config.yaml", b"model: [unclosed\n", r"config\.yaml: damaged YAML \(.*Error"),
        ("config.yaml", b"- a list\n", r"config\.yaml holds no mapping"),
    ],
)
def test_a_damaged_model_or_config_is_a_config_error(train_run, broken, content, message):
    _, run_dir = train_run("model=mlp")
    (run_dir / broken).write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        evaluate_run(run_dir)


@pytest.mark.slow
def test_evaluate_takes_the_readmes_order_and_damaged_files_get_one_line(train_run, cli):
    _, run_dir = train_run("model=mlp")
    readme_order = cli("evaluate", str(run_dir), "--model", "best", "dataset.test_fraction=0.5")
    assert readme_order.returncode == 0, readme_order.stderr[-2000:]
    assert json.loads((run_dir / "evaluation.json").read_text())["model"] == "best"

    (run_dir / "model.keras").write_bytes(b"not a model")
    damaged = cli("evaluate", str(run_dir))
    assert damaged.returncode == 2 and "Traceback" not in damaged.stderr, damaged.stderr[-2000:]
    lines = [line for line in damaged.stderr.splitlines() if line.startswith("tfrecipe:")]
    assert len(lines) == 1 and "not a readable zip archive" in lines[0], damaged.stderr[-2000:]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--model"], "argument --model: expected one argument"),
    ],
)
def test_a_usage_mistake_is_one_line(tmp_path, capsys, args, said):
    """As predict's, export's and serve's: argparse printed its usage and the error, two lines."""
    from tfrecipe.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["evaluate", str(tmp_path), *args])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"tfrecipe: invalid configuration: evaluate: {said} (tfrecipe evaluate --help)"
    )
