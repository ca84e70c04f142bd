"""SavedModel export for serving (`export.formats`), beside the `.keras` files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_cli import assert_refused

from tests.helpers.configs import validate
from tfrecipe.errors import ConfigError
from tfrecipe.models.export import export_saved_model

BOTH = ["export.formats=[keras,saved_model]", "callbacks.export.every_n_epochs=1"]


def _predictions(run_dir: Path, export: str) -> tuple[np.ndarray, np.ndarray]:
    """What a SavedModel export serves and what the final model.keras predicts, on one batch."""
    import keras
    import tensorflow as tf

    model = keras.saving.load_model(run_dir / "model.keras")
    batch = np.random.default_rng(0).random((5, *model.input_shape[1:]), dtype=np.float32)
    loaded = tf.saved_model.load(str(run_dir / export))  # held: `serve` needs its variables
    served = loaded.serve(tf.constant(batch))
    return np.asarray(served), np.asarray(model(batch))


def _unfinished(run_dir: Path) -> list[str]:
    """Hidden files left over (the run's manifest of its own files is not one)."""
    from tfrecipe.files import MANIFEST

    return sorted(
        p.name for p in run_dir.iterdir() if p.name.startswith(".") and p.name != MANIFEST
    )


def test_saved_model_exports_every_epoch_and_at_the_end(train_run):
    _, run_dir = train_run("model=mlp", "model.hidden_units=[16]", "loop.epochs=2", *BOTH)

    assert sorted(p.name for p in run_dir.glob("model*.keras")) == [
        "model-001.keras",
        "model-002.keras",
        "model.keras",
    ]
    exports = sorted(p.name for p in run_dir.glob("saved_model*"))
    assert exports == ["saved_model", "saved_model-001", "saved_model-002"]
    assert all((run_dir / name / "saved_model.pb").is_file() for name in exports)
    served, predicted = _predictions(run_dir, "saved_model")
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-6)
    last_epoch, _ = _predictions(run_dir, "saved_model-002")
    np.testing.assert_allclose(last_epoch, predicted, rtol=1e-5, atol=1e-6)
    first_epoch, _ = _predictions(run_dir, "saved_model-001")
    assert not np.allclose(first_epoch, predicted), "epoch 1's export is not the final model"
    assert _unfinished(run_dir) == []


def test_a_mirrored_model_exports_a_saved_model(train_run):
    summary, run_dir = train_run(
        "strategy=mirrored",
        "strategy.logical_cpus=2",
        "model=mlp",
        "model.hidden_units=[16]",
        "loop.epochs=1",
        "callbacks.export.every_n_epochs=1",
        "export.formats=[saved_model]",
    )
    assert summary["num_replicas"] == 2
    # saved_model only: no periodic .keras, but the final model.keras all the same.
    assert sorted(p.name for p in run_dir.glob("model*.keras")) == ["model.keras"]
    assert (run_dir / "saved_model-001").is_dir()
    served, predicted = _predictions(run_dir, "saved_model")
    np.testing.assert_allclose(served, predicted, rtol=1e-5, atol=1e-6)
    assert _unfinished(run_dir) == []


class _Exports:
    """A stand-in for a Keras model: `export` writes one file, or half of one and crashes."""

    def __init__(self, content: str, *, crash: bool = False):
        self.content, self.crash = content, crash

    def export(self, filepath, format, verbose):
        assert format == "tf_saved_model" and verbose is False
        Path(filepath).mkdir()
        (Path(filepath) / "saved_model.pb").write_text(self.content)
        if self.crash:
            raise RuntimeError("killed while exporting")


def test_a_re_export_replaces_the_old_one_and_a_crash_leaves_it_whole(tmp_path):
    path = tmp_path / "saved_model-003"
    export_saved_model(_Exports("first run"), path)
    (path / "stale.txt").write_text("only in the first export")

    with pytest.raises(RuntimeError, match="killed"):
        export_saved_model(_Exports("half", crash=True), path)
    assert sorted(p.name for p in path.iterdir()) == ["saved_model.pb", "stale.txt"]
    assert (path / "saved_model.pb").read_text() == "first run"

    export_saved_model(_Exports("resumed run"), path)  # also clears the crash's leftover
    assert sorted(p.name for p in path.iterdir()) == ["saved_model.pb"]
    assert (path / "saved_model.pb").read_text() == "resumed run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved_model-003"]


@pytest.mark.parametrize("formats", ["[]", "[keras,keras]", "keras", "null"])
def test_bad_formats_are_one_problem(compose_cfg, formats):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(f"export.formats={formats}"))
    [problem] = error.value.messages
    assert problem.startswith("export.formats="), problem  # the key and value first
    assert "expected a non-empty list" in problem and "'saved_model'" in problem


def test_an_unknown_format_is_refused_on_the_command_line(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(f"hydra.run.dir={run_dir}", "export.formats=[keras,tflite]")
    report = assert_refused(result, run_dir, "export.formats=['keras', 'tflite']", "'litert'")
    assert len(report.splitlines()) == 1, report  # one problem: one line
