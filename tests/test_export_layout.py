"""Exports laid out for model servers (`export.name`, `tfrecipe export --name`): TF Serving's
`exports/serving/NAME/1/` and Triton's `exports/triton/NAME/` (1/model.onnx + config.pbtxt),
checked the way the servers read them (saved_model_cli, the ONNX graph), without a server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY

from tfrecipe.cli.main import main
from tfrecipe.errors import ConfigError

pytest.importorskip("onnx", reason="the export extra: pip install 'tfrecipe[export]'")

pytestmark = pytest.mark.heavy  # trains (module fixture)


@pytest.fixture(scope="module")
def named_run(tmp_path_factory) -> Path:
    """The digits CNN, exported for servers as `digits`."""
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    run_dir = tmp_path_factory.mktemp("layout") / "run"
    overrides = [
        *TINY,
        "model=cnn",
        "model.filters=[4]",
        "model.dense_units=8",
        "export.formats=[keras,saved_model,onnx]",
        "export.name=digits",
    ]
    train(compose(overrides), run_dir=run_dir)
    return run_dir


def _pbtxt_tensors(text: str, kind: str) -> list[tuple[str, str, list[int]]]:
    """(name, data_type, dims) of each `kind` (input/output) entry of a config.pbtxt, read with
    a parser of its own (not the writer's code)."""
    block = re.search(rf"^{kind} \[(.*?)^\]", text, re.S | re.M).group(1)
    entries = re.findall(r'name: "([^"]+)"\s+data_type: (\w+)\s+dims: \[([^\]]*)\]', block)
    return [(n, t, [int(d) for d in dims.split(",")]) for n, t, dims in entries]


def test_saved_model_is_where_tf_serving_loads_it_with_the_signatures_inputs(named_run):
    exports = json.loads((named_run / "summary.json").read_text())["exports"]
    assert exports["saved_model"]["path"] == "exports/serving/digits/1"
    assert exports["saved_model"]["max_abs_diff"] <= 1e-4
    assert (named_run / "exports/serving/digits/1/saved_model.pb").is_file()
    assert not (named_run / "saved_model").exists()  # laid out instead of the flat folder

    shown = subprocess.run(
        [
            str(Path(sys.executable).parent / "saved_model_cli"),
            "show",
            "--dir",
            str(named_run / "exports/serving/digits/1"),
            "--tag_set",
            "serve",
            "--signature_def",
            "serving_default",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    inputs = json.loads((named_run / "signature.json").read_text())["inputs"]
    listed = re.findall(
        r"inputs\['(\w+)'\] tensor_info:\s+dtype: (\w+)\s+shape: \(([^)]*)\)", shown
    )
    assert len(listed) == 1, shown
    _, dtype, shape = listed[0]
    assert dtype == "DT_FLOAT" and inputs["dtype"] == "float32"
    assert [int(n) for n in shape.split(",")] == [-1, *inputs["shape"]]


def test_triton_config_names_the_onnx_graphs_inputs_outputs_types_and_shapes(named_run):
    import onnx

    model_dir = named_run / "exports/triton/digits"
    exports = json.loads((named_run / "summary.json").read_text())["exports"]
    assert exports["onnx"]["path"] == "exports/triton/digits/1/model.onnx"
    assert exports["onnx"]["config"] == "exports/triton/digits/config.pbtxt"
    text = (model_dir / "config.pbtxt").read_text()
    assert 'name: "digits"' in text and 'platform: "onnxruntime_onnx"' in text

    graph = onnx.load(str(model_dir / "1" / "model.onnx")).graph
    onnx.checker.check_model(onnx.load(str(model_dir / "1" / "model.onnx")), full_check=True)
    triton_type = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.INT64: "TYPE_INT64"}

    def in_graph(values):
        return [
            (
                v.name,
                triton_type[v.type.tensor_type.elem_type],
                [
                    d.dim_value if d.HasField("dim_value") else -1
                    for d in v.type.tensor_type.shape.dim
                ],
            )
            for v in values
        ]

    weights = {t.name for t in graph.initializer}
    assert _pbtxt_tensors(text, "input") == in_graph(
        v for v in graph.input if v.name not in weights
    )
    assert _pbtxt_tensors(text, "output") == in_graph(graph.output)
    assert _pbtxt_tensors(text, "input")[0][2] == [-1, 8, 8, 1]


def test_export_command_lays_a_saved_model_out_under_a_name(named_run, capsys):
    trained = (named_run / "model.keras").read_bytes()
    main(["export", str(named_run), "--format", "saved_model", "--name", "served"])
    report = json.loads(capsys.readouterr().out)
    assert report["saved_model"]["path"] == "exports/serving/served/1"
    assert (named_run / "exports/serving/served/1/saved_model.pb").is_file()
    assert (named_run / "model.keras").read_bytes() == trained  # what training wrote stays
    exports = json.loads((named_run / "summary.json").read_text())["exports"]
    assert exports["saved_model"]["path"] == "exports/serving/digits/1"  # training's record too
    assert exports["final/saved_model"] == report["saved_model"]

    import tensorflow as tf

    loaded = tf.saved_model.load(str(named_run / "exports/serving/served/1"))
    batch = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    assert np.asarray(loaded.serve(tf.constant(batch))).shape == (4, 10)


@pytest.mark.parametrize("fmt", ["saved_model", "onnx"])
def test_export_command_never_replaces_the_layout_training_wrote(named_run, capsys, fmt):
    """`tfrecipe export --name digits` of a run trained with export.name=digits wrote over
    training's exports/serving/digits/1 (or triton/digits/1), the model a server loads, and its
    summary entry: it is refused before any work, and what training wrote stays."""
    written = {p: p.read_bytes() for p in (named_run / "exports").rglob("*") if p.is_file()}
    summary = (named_run / "summary.json").read_text()
    with pytest.raises(SystemExit) as stop:
        main(["export", str(named_run), "--format", fmt, "--name", "digits", "--model", "best"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"tfrecipe: invalid configuration: export: --name=digits: the run's training laid its "
        f"{fmt} out under that name (export.name=digits), and an export never replaces what "
        "training wrote; name another (e.g. --name digits-best)"
    )
    assert {p: p.read_bytes() for p in written} == written
    assert (named_run / "summary.json").read_text() == summary


@pytest.mark.parametrize("name", ["../outside", "a/b", ".hidden", ""])
def test_a_name_that_is_not_one_folder_is_refused_in_one_line(name, tmp_path):
    with pytest.raises(ConfigError) as refused:
        from tfrecipe.cli.export import _parse

        _parse([str(tmp_path), "--format", "saved_model", "--name", name])
    assert "--name" in str(refused.value) and "letters, digits" in str(refused.value)
