"""`export.formats` onnx and litert (and quantization), `tfrecipe export RUN_DIR --format F`: each
file is checked in its own runtime against Keras, and a bad one is never left behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, TINY

from tests.helpers.configs import validate
from tfrecipe.cli.main import main
from tfrecipe.errors import ConfigError

pytest.importorskip("onnxruntime", reason="the export extra: pip install 'tfrecipe[export]'")
pytest.importorskip("ai_edge_litert", reason="the export extra: pip install 'tfrecipe[export]'")

pytestmark = pytest.mark.heavy  # trains (module fixture)

ALL = "export.formats=[keras,saved_model,onnx,litert]"


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    """The mlp on digits, exported to every format, with an int8 LiteRT model beside."""
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    run_dir = tmp_path_factory.mktemp("digits") / "run"
    overrides = [
        *TINY,
        "loop.steps_per_epoch=20",
        "model=mlp",
        "model.hidden_units=[256]",
        ALL,
        "export.litert.quantize=int8",
    ]
    train(compose(overrides), run_dir=run_dir)
    return run_dir


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _leftovers(run_dir: Path) -> list[str]:
    """Hidden files left over (the run's manifest of its own files is not one)."""
    from tfrecipe.files import MANIFEST

    return sorted(
        p.name for p in run_dir.iterdir() if p.name.startswith(".") and p.name != MANIFEST
    )


def test_every_format_matches_keras_on_held_out_examples(digits_run):
    exports = _summary(digits_run)["exports"]
    assert set(exports) == {"keras", "saved_model", "onnx", "litert", "litert_int8"}
    for fmt in ("saved_model", "onnx", "litert"):
        assert exports[fmt]["max_abs_diff"] <= 1e-4, exports[fmt]
        assert (digits_run / exports[fmt]["path"]).exists()
    assert _leftovers(digits_run) == []

    # and each file serves what model.keras predicts, read back here independently
    import keras
    import onnxruntime
    from ai_edge_litert.interpreter import Interpreter

    model = keras.saving.load_model(digits_run / "model.keras")
    x = np.random.default_rng(0).random((7, 8, 8, 1), dtype=np.float32)
    expected = np.asarray(model(x))
    session = onnxruntime.InferenceSession(str(digits_run / "model.onnx"))
    served = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(served, expected, atol=1e-5)
    runner = Interpreter(model_path=str(digits_run / "model.tflite")).get_signature_runner()
    [name] = runner.get_input_details()
    np.testing.assert_allclose(next(iter(runner(**{name: x}).values())), expected, atol=1e-5)


def test_int8_litert_is_smaller_and_scored_next_to_the_float_model(digits_run):
    quantized = _summary(digits_run)["exports"]["litert_int8"]
    assert (digits_run / "model-int8.tflite").is_file()
    assert quantized["size_ratio"] < 0.5
    assert quantized["bytes"] == (digits_run / "model-int8.tflite").stat().st_size
    float_accuracy = quantized["float_test"]["accuracy"]
    assert float_accuracy == pytest.approx(_summary(digits_run)["test"]["accuracy"], abs=1e-6)
    assert quantized["test"]["accuracy"] == pytest.approx(float_accuracy, abs=0.05)


def test_an_export_off_keras_is_removed_and_fails_loudly(digits_run, tmp_path):
    import keras

    from tfrecipe.models import export

    model = keras.saving.load_model(digits_run / "model.keras")
    x = [np.random.default_rng(1).random((16, 8, 8, 1), dtype=np.float32)]
    converter = export.quantization_options("dynamic", None)
    with pytest.raises(export.ExportError, match=r"differs from the Keras model by up to"):
        export.export_checked(
            model, "litert", tmp_path / "m.tflite", x, tolerance=1e-7, **converter
        )
    assert list(tmp_path.iterdir()) == []


def test_an_invalid_onnx_file_is_caught_and_removed(tmp_path, monkeypatch):
    """Keras' own ONNX exporter writes StringLookup models to an invalid file without an error;
    should a converter do so, the checker catches it."""
    import keras
    import tf2onnx

    from tfrecipe.models import export

    def keras_exporter(model, input_signature, output_path):  # Keras' export, a real converter
        model.export(output_path, format="onnx", verbose=False)

    monkeypatch.setattr(tf2onnx.convert, "from_keras", keras_exporter)

    inputs = keras.Input(shape=(1,), dtype="string")
    lookup = keras.layers.StringLookup(vocabulary=["a", "b"], output_mode="one_hot")
    model = keras.Model(inputs, keras.layers.Dense(2)(lookup(inputs)))
    model(np.array([["a"]], dtype=object))  # Keras exports only a model that has run
    assert "StringLookup" in export.unsupported(model, "onnx")  # refused up front ...
    monkeypatch.setattr(export, "unsupported", lambda model, fmt: None)  # ... and if not:
    with pytest.raises(export.ExportError, match=r"invalid ONNX file"):
        export.export_checked(
            model, "onnx", tmp_path / "m.onnx", [np.array([["a"]], dtype=object)], tolerance=1
        )
    assert list(tmp_path.iterdir()) == []


def test_a_model_that_standardizes_its_features_exports_to_onnx(tmp_path):
    """The bundled tables' models (wine_tabular, diabetes_regression, breast_cancer_binary, a
    CSV of numbers) start with a Normalization layer holding its mean and variance as tensors:
    Keras' ONNX export made each another graph input, which onnxruntime asked to be fed, and the
    run failed after training with a ValueError and a traceback."""
    import keras
    import onnxruntime
    import tensorflow as tf

    from tfrecipe.data.splits import standardize_in_model
    from tfrecipe.models import export

    rows = np.random.default_rng(0).normal(50, 10, (32, 3)).astype("float32")
    inputs, standardized = standardize_in_model(tf.data.Dataset.from_tensor_slices((rows, rows)))
    model = keras.Model(inputs, keras.layers.Dense(2)(standardized))
    record = export.export_checked(model, "onnx", tmp_path / "m.onnx", [rows], tolerance=1e-4)
    assert record["max_abs_diff"] <= 1e-4
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    assert [i.name for i in session.get_inputs()] == ["features"]  # the Keras input's name
    np.testing.assert_allclose(session.run(None, {"features": rows})[0], model(rows), atol=1e-4)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["model=text", "dataset=text_folder", "dataset.path=x"],
            "model=text cannot be exported to onnx",
        ),
        (
            ["dataset=csv", "dataset.path=x.csv", "dataset.label=y", "dataset.categorical=[city]"],
            "dataset.categorical=['city'] are encoded by StringLookup",
        ),
    ],
)
def test_a_format_that_cannot_carry_the_model_is_refused_at_config_check(
    compose_cfg, overrides, expected
):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(*overrides, "export.formats=[keras,onnx,litert]"))
    assert any(expected in str(p) for p in error.value.messages), error.value.messages


@pytest.mark.parametrize("dataset", ["csv", "parquet"])
def test_int8_litert_of_a_table_model_is_refused_before_training(compose_cfg, dataset):
    """It used to fail after training (LiteRT's calibration cannot feed a dict of columns)."""
    table = [f"dataset={dataset}", "dataset.path=x", "dataset.label=y"]
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(*table, "export.formats=[litert]", "export.litert.quantize=int8"))
    assert error.value.messages == [
        "export.litert.quantize=int8: a table's model takes a dict of named columns, which "
        "LiteRT's int8 calibration cannot feed (it fails after training); use dynamic or "
        "float16, or none"
    ]
    validate(compose_cfg(*table, "export.formats=[litert]", "export.litert.quantize=float16"))
    validate(compose_cfg("export.formats=[litert]", "export.litert.quantize=int8"))  # digits


def test_int8_calibration_of_named_columns_is_one_export_error():
    """`tfrecipe export --quantize int8` of a table's run: a line, not LiteRT's AttributeError."""
    from tfrecipe.models import export

    table = [{"age": np.zeros(4, "float32"), "city": np.array(["a"] * 4, dtype=object)}]
    with pytest.raises(export.ExportError, match=r"cannot calibrate a model of named columns"):
        export.quantization_options("int8", table)
    assert "representative_dataset" in export.quantization_options("int8", [np.zeros((4, 2))])


def test_a_mixed_precision_model_exports_through_a_float32_rebuild(train_run):
    summary, _ = train_run(
        "model=cnn",
        "model.filters=[4]",
        "model.dense_units=8",
        "precision=mixed_bfloat16",
        "precision.require_native=false",
        "export.formats=[keras,onnx,litert]",
    )
    assert summary["precision"] == "mixed_bfloat16"
    for fmt in ("onnx", "litert"):  # against the float32 rebuild the file was converted from
        assert summary["exports"][fmt]["max_abs_diff"] <= 1e-4, summary["exports"]
        assert summary["exports"][fmt]["float32_rebuild"] is True


def test_export_command_adds_a_format_to_a_finished_run(train_run, capsys):
    _, run_dir = train_run("model=mlp", "model.hidden_units=[8]")
    assert not (run_dir / "model.onnx").exists()
    trained = (run_dir / "model.keras").read_bytes()
    trained_exports = _summary(run_dir)["exports"]
    main(["export", str(run_dir), "--format", "onnx"])
    report = json.loads(capsys.readouterr().out)
    assert report["onnx"]["max_abs_diff"] <= 1e-4
    assert report["onnx"]["path"] == "exports/final/model.onnx"
    assert (run_dir / "exports" / "final" / "model.onnx").is_file()
    exports = _summary(run_dir)["exports"]
    assert exports["final/onnx"] == report["onnx"]
    # training's records stay as they were (the command's keras copy is final/keras)
    assert {k: exports[k] for k in trained_exports} == trained_exports
    assert exports["final/keras"]["path"] == "exports/final/model.keras"
    # An export adds files: what training wrote stays as it was.
    assert (run_dir / "model.keras").read_bytes() == trained
    assert not (run_dir / "model.onnx").exists()


def test_a_failed_export_command_leaves_no_file_behind(train_run):
    """It said "the file was not kept", and left exports/final/model.keras behind, a file no
    record names (with --name, the server layout's empty version folders too)."""
    _, run_dir = train_run("model=mlp", "model.hidden_units=[64]")
    summary = _summary(run_dir)
    with pytest.raises(SystemExit) as stop:  # LiteRT is off Keras by ~1e-6 on this model
        main(["export", str(run_dir), "--format", "litert", "--tolerance", "1e-12"])
    assert "the file was not kept" in str(stop.value.code)
    assert not (run_dir / "exports").exists()
    assert _summary(run_dir) == summary


def test_export_command_refuses_a_bad_request_in_one_line(tmp_path, capsys):
    for args in (["--format", "tflite"], ["--format", "onnx", "--quantize", "int8"]):
        with pytest.raises(SystemExit) as stop:
            main(["export", str(tmp_path), *args])
        assert stop.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("tolerance", ["0", "-1", "nan"])
def test_export_command_refuses_a_tolerance_that_is_not_positive(tmp_path, capsys, tolerance):
    """As export.tolerance is (a positive float): `--tolerance 0` was the run's 1e-4 instead,
    silently, and a negative one failed every format after converting it."""
    with pytest.raises(SystemExit) as stop:
        main(["export", str(tmp_path), "--format", "onnx", "--tolerance", tolerance])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"tfrecipe: invalid configuration: export: --tolerance={float(tolerance)}: expected a "
        "positive number (the largest difference from Keras an exported file may have)"
    )


def test_docs_saved_model_snippet_runs_as_written(train_run):
    """The serving example of docs/using_a_model.md, executed on a real export."""
    _, run_dir = train_run(
        "model=mlp", "model.hidden_units=[8]", "export.formats=[keras,saved_model]"
    )
    page = (REPO / "docs" / "using_a_model.md").read_text()
    snippet = page.split("<!-- saved-model-snippet -->")[1].split("```python")[1].split("```")[0]
    namespace = {"path": str(run_dir / "saved_model")}
    exec(snippet, namespace)
    assert np.asarray(namespace["scores"]).shape == (2, 10)
