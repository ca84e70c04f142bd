"""Exports laid out for model servers (`export.name`, `tfrecipe export --name NAME`):

    exports/serving/NAME/1/             a SavedModel: TF Serving's model base is exports/serving,
                                        its version folder 1 (TF Serving loads no other layout)
    exports/triton/NAME/config.pbtxt    Triton's model config, written from the ONNX graph
    exports/triton/NAME/1/model.onnx    Triton's ONNX Runtime backend (its TensorFlow backend is
                                        deprecated since 25.03: triton-inference-server#8068)

The config.pbtxt names each of the graph's inputs and outputs with its ONNX element type and its
full shape (-1 for a free size) and `max_batch_size: 0`, so its names, types and shapes are the
graph's own: Triton refuses a config that disagrees with the model it loads.
"""

from __future__ import annotations

from pathlib import Path

from tfrecipe import files, rundir

SERVING = Path(rundir.EXPORTS, "serving")
TRITON = Path(rundir.EXPORTS, "triton")
VERSION = "1"
TRITON_CONFIG = "config.pbtxt"

# ONNX's TensorProto element types (onnx.TensorProto.DataType) -> Triton's data types.
TRITON_TYPES = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}


def server_path(root: Path, fmt: str, name: str) -> Path | None:
    """Where `fmt` goes for servers under run dir `root` (None: the format has no server
    layout, it keeps its flat file)."""
    if fmt == "saved_model":
        return root / SERVING / name / VERSION
    if fmt == "onnx":
        return root / TRITON / name / VERSION / "model.onnx"
    return None


def graph_signature(onnx_path: Path) -> dict[str, list[tuple[str, str, list[int]]]]:
    """The ONNX graph's inputs and outputs as (name, Triton type, shape with -1 for a free
    size); initializers listed as inputs (older exporters) are weights, not inputs."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    weights = {tensor.name for tensor in graph.initializer}

    def described(values) -> list[tuple[str, str, list[int]]]:
        rows = []
        for value in values:
            tensor = value.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
            rows.append((value.name, TRITON_TYPES[tensor.elem_type], shape))
        return rows

    return {
        "input": described(v for v in graph.input if v.name not in weights),
        "output": described(graph.output),
    }


def triton_config(name: str, onnx_path: Path) -> str:
    """Triton's config.pbtxt for the ONNX model at `onnx_path`, served as `name`."""
    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', "max_batch_size: 0"]
    for kind, tensors in graph_signature(onnx_path).items():
        entries = [
            f'  {{\n    name: "{tensor}"\n    data_type: {dtype}\n'
            f"    dims: [ {', '.join(str(n) for n in shape)} ]\n  }}"
            for tensor, dtype, shape in tensors
        ]
        lines.append(f"{kind} [\n" + ",\n".join(entries) + "\n]")
    return "\n".join(lines) + "\n"


def write_triton_config(onnx_path: Path) -> Path:
    """config.pbtxt beside the version folder of `onnx_path` (exports/triton/NAME/1/model.onnx),
    through the one writer; returns its path."""
    model_dir = onnx_path.parent.parent
    path = model_dir / TRITON_CONFIG
    files.write_atomic(path, triton_config(model_dir.name, onnx_path))
    return path
