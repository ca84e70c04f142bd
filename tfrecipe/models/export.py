"""A trained model in the formats it is served in, each checked in its own runtime.

`model.keras` (Keras), `saved_model/` (TF Serving, `tf.saved_model.load`), `model.onnx`
(onnxruntime) and `model.tflite` (LiteRT, optionally quantized to `model-QUANTIZE.tflite`). Each
file is written under a temporary name, loaded back in the runtime that serves it and compared
with Keras on held-out examples; only a file within tolerance takes its final name. An invalid or
inaccurate file fails loudly and is removed: Keras writes an ONNX file for string preprocessing
without an error, which onnxruntime then refuses or misreads.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfrecipe import files, rundir
from tfrecipe.config import export_limits
from tfrecipe.models import onnx_file, serving_layout
from tfrecipe.models.native_log import XNNPACK_LINE, without_lines

# The final file (or directory) of each format in the run dir (the table: config.export_limits).
FILES = {fmt: spec.file for fmt, spec in export_limits.FORMATS.items()}
# The Python packages each format's exporter and runtime need: the `export` extra.
REQUIRED = {fmt: spec.packages for fmt, spec in export_limits.FORMATS.items() if spec.packages}

Features = np.ndarray | Mapping[str, np.ndarray]


class ExportError(RuntimeError):
    """An export that failed its check: invalid, or off Keras by more than the tolerance."""


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """`export.*` of the config, as the exporters need it."""

    formats: tuple[str, ...] = ("keras",)
    tolerance: float = 1e-4
    check_examples: int = 256  # held-out examples each export is compared on
    quantize: str = "none"  # none | dynamic | float16 | int8 (LiteRT)
    representative_examples: int = 200  # training examples int8 calibrates on
    name: str | None = None  # export.name: saved_model and onnx laid out for servers


def options_from(spec) -> ExportOptions:
    """The options of the `export` config (schema.Export)."""
    return ExportOptions(
        formats=tuple(dict.fromkeys(["keras", *spec.formats])),  # model.keras always
        tolerance=spec.tolerance,
        check_examples=spec.check_examples,
        quantize=spec.litert.quantize,
        representative_examples=spec.litert.representative_examples,
        name=spec.name,
    )


def missing_packages(formats: Iterable[str]) -> list[str]:
    """The packages of the `export` extra that `formats` need and this environment lacks."""
    import importlib.util

    needed = [name for fmt in formats for name in REQUIRED.get(fmt, ())]
    return [name for name in needed if importlib.util.find_spec(name) is None]


def unsupported(model, fmt: str) -> str | None:
    """Why `fmt` cannot carry `model` (a layer it has no ops for, string inputs in ONNX), or
    None when it can."""
    from tfrecipe import compat

    for layer in compat.flatten_layers(model):
        why = export_limits.why_not(fmt, type(layer).__name__)
        if why is not None:
            return f"layer {layer.name} ({type(layer).__name__}): {why}"
    if fmt == "onnx" and any(x.dtype == "string" for x in model.inputs):
        return "the model takes strings, which ONNX cannot feed"
    return None


def float32_model(model):
    """`model` itself when it computes in float32, else a float32 rebuild with its weights: a
    mixed-precision graph (bfloat16/float16 casts) fails both the ONNX and the LiteRT converter."""
    import keras

    from tfrecipe import compat

    if all(layer.dtype_policy.compute_dtype == "float32" for layer in compat.flatten_layers(model)):
        return model
    serialized = _float32_policies(keras.saving.serialize_keras_object(model))
    rebuilt = keras.saving.deserialize_keras_object(serialized)
    rebuilt.set_weights(model.get_weights())
    return rebuilt


def _float32_policies(node: Any) -> Any:
    """A model config with every layer's dtype policy float32."""
    if isinstance(node, dict):
        if node.get("class_name") == "DTypePolicy" and "config" in node:
            return {**node, "config": {**node["config"], "name": "float32"}}
        return {key: _float32_policies(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_float32_policies(value) for value in node]
    return node


# --- the runtimes that serve each format ------------------------------------------------------
def run_saved_model(path: Path) -> Callable[[Features], np.ndarray]:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))  # kept: `serve` needs the object's variables

    def serve(x: Features) -> np.ndarray:
        return np.asarray(loaded.serve(_as_tensors(x)))

    return serve


def run_onnx(path: Path) -> Callable[[Features], np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]

    def serve(x: Features) -> np.ndarray:
        return np.asarray(session.run(None, _by_name(names, x))[0])

    return serve


def run_litert(path: Path) -> Callable[[Features], np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    runner = interpreter.get_signature_runner()
    names = list(runner.get_input_details())
    called = []

    def serve(x: Features) -> np.ndarray:
        if called:
            outputs = runner(**_by_name(names, x))
        else:  # the first call applies the XNNPACK delegate, and says so: an INFO line
            with without_lines(XNNPACK_LINE):
                outputs = runner(**_by_name(names, x))
            called.append(True)
        return np.asarray(next(iter(outputs.values())))

    return serve


RUNTIMES = {"saved_model": run_saved_model, "onnx": run_onnx, "litert": run_litert}


def _as_tensors(x: Features):
    import tensorflow as tf

    if isinstance(x, Mapping):
        return {name: tf.constant(as_model_input(value)) for name, value in x.items()}
    return tf.constant(as_model_input(x))


def _by_name(names: list[str], x: Features) -> dict[str, np.ndarray]:
    """The runtime's inputs by its names: one array for a one-input model, else the columns
    (exporters may add a suffix such as ":0" to the Keras input names)."""
    if not isinstance(x, Mapping):
        return {names[0]: as_model_input(x)}
    by_name = {}
    for name in names:
        key = next(k for k in x if name == k or name.split(":")[0] == k or name.endswith(k))
        by_name[name] = as_model_input(x[key])
    return by_name


def as_model_input(x: np.ndarray) -> np.ndarray:
    """Arrays a model takes: NumPy's fixed-width strings (`<U160`, what `np.array(["a", ...])`
    gives) as Python objects, which TensorFlow reads as tf.string; float64 as float32."""
    x = np.asarray(x)
    if x.dtype.kind in "US":
        return x.astype(object)
    if x.dtype == np.float64:
        return x.astype(np.float32)
    return x


# --- writing and checking ---------------------------------------------------------------------
def _keras_outputs(model, x: Features) -> np.ndarray:
    """The model's outputs, called directly: `predict_on_batch` under a MirroredStrategy returns
    each replica's rows again (Keras 3.15)."""
    return np.asarray(model(_as_tensors(x), training=False))


def max_abs_difference(model, serve: Callable[[Features], np.ndarray], examples) -> float:
    """The largest |served - Keras| over `examples` (batches of features)."""
    worst = 0.0
    for x in examples:
        expected = np.asarray(_keras_outputs(model, x), dtype=np.float64)
        served = np.asarray(serve(x), dtype=np.float64).reshape(expected.shape)
        worst = max(worst, float(np.max(np.abs(served - expected))) if expected.size else 0.0)
    return worst


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _write(model, fmt: str, path: Path, **converter: Any) -> None:
    """The file of `fmt` at `path` (Keras' exporters), checked for validity where the format
    has a checker."""
    if fmt == "saved_model":
        model.export(str(path), format="tf_saved_model", verbose=False)
    elif fmt == "onnx":
        try:
            onnx_file.write(model, path)
        except onnx_file.InvalidFile as error:
            raise ExportError(f"onnx: the converter wrote an invalid ONNX file ({error})") from None
    elif fmt == "litert":
        model.export(str(path), format="litert", verbose=False, **converter)
    else:
        raise ValueError(f"unknown export format {fmt!r}")


def export_checked(
    model,
    fmt: str,
    path: Path,
    examples: list[Features],
    *,
    tolerance: float | None,
    **converter: Any,
) -> dict[str, Any]:
    """Writes `model` as `fmt` to `path` through a temporary sibling, loads it in its runtime and
    compares it with Keras on `examples`; renames it into place only when within `tolerance`
    (None: no limit, for quantized models, whose accuracy is measured instead).

    Returns:
      {"path", "max_abs_diff", "bytes"} for summary.json.

    Raises:
      ExportError: the file is invalid or off by more than `tolerance` (nothing is left).
    """
    why = unsupported(model, fmt)
    if why is not None:
        raise ExportError(f"{fmt} cannot carry this model: {why}")
    source = float32_model(model)
    source(_as_tensors(_row(examples[0], 0)))  # Keras exports only a model that has run
    files.check_writable(path)  # before minutes of converting
    scratch = Path(tempfile.mkdtemp(prefix=f".export-{fmt}-", dir=path.parent))
    try:
        written = scratch / path.name
        _write(source, fmt, written, **converter)
        # against the model converted: a mixed-precision model's float32 rebuild differs from it
        # by bfloat16/float16 round-off, which says nothing about the file
        difference = max_abs_difference(source, RUNTIMES[fmt](written), examples)
        if not np.isfinite(difference) or (tolerance is not None and difference > tolerance):
            raise ExportError(
                f"{fmt}: {path.name} differs from the Keras model by up to {difference:.3g} on "
                f"held-out examples (export.tolerance={tolerance}); the file was not kept"
            )
        files.put(written, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record = {"path": path.name, "max_abs_diff": difference, "bytes": _size(path)}
    if source is not model:
        record["float32_rebuild"] = True
    return record


# --- LiteRT quantization ----------------------------------------------------------------------
def quantization_options(quantize: str, representative: list[Features] | None) -> dict[str, Any]:
    """The LiteRT converter's settings for `export.litert.quantize`."""
    import tensorflow as tf

    if quantize == "none":
        return {}
    options: dict[str, Any] = {"optimizations": [tf.lite.Optimize.DEFAULT]}
    if quantize == "float16":
        options["target_spec"] = {"supported_types": [tf.float16]}
    elif quantize == "int8":
        if not representative:
            raise ExportError("litert int8 quantization needs representative training examples")
        if isinstance(representative[0], Mapping):  # its AttributeError came after training
            raise ExportError(
                "litert int8 quantization cannot calibrate a model of named columns (a table's): "
                "LiteRT's calibration feeds one array per example; use dynamic or float16"
            )

        def examples():
            for batch in representative:
                for row in range(len(_first(batch))):
                    yield [_row(batch, row)]

        options["representative_dataset"] = examples
    return options


def _first(batch: Features) -> np.ndarray:
    return next(iter(batch.values())) if isinstance(batch, Mapping) else batch


def _row(batch: Features, row: int):
    if isinstance(batch, Mapping):
        return {k: as_model_input(v[row : row + 1]) for k, v in batch.items()}
    return as_model_input(batch[row : row + 1])


def quantized_path(run_dir: Path, quantize: str) -> Path:
    return run_dir / f"model-{quantize}.tflite"


# --- everything a run exports -------------------------------------------------------------------
def export_all(
    model,
    run_dir: Path,
    options: ExportOptions,
    *,
    held_out: list[Features],
    representative: list[Features] | None = None,
    score: Callable[[Callable[[Features], np.ndarray]], dict[str, float]] | None = None,
    root: Path | None = None,
) -> dict[str, Any]:
    """Every format of `options` in `run_dir`, checked (model.keras is Keras' own: unchecked);
    with `options.name`, saved_model and onnx laid out for servers under `root`
    (tfrecipe.models.serving_layout).

    Args:
      held_out: batches of held-out features (normalized as the model takes them) the exports
        are compared on.
      representative: batches of training features (int8 calibration).
      score: the test metrics of a predict function (the quantized model's, next to the float
        model's); None: not measured.
      root: the run dir (where exports/serving and exports/triton go); None: `run_dir`.

    Returns:
      summary.json's "exports": per format {path, max_abs_diff, bytes} (paths relative to
      `root`; Triton's also its `config`), and for a quantized LiteRT model also its metrics and
      the float model's.
    """
    root = run_dir if root is None else root
    save_model(model, run_dir / rundir.MODEL)
    report: dict[str, Any] = {"keras": {"path": rundir.MODEL}}
    for fmt in options.formats:
        if fmt != "keras":
            report[fmt] = _placed(model, fmt, run_dir, root, options, held_out)
    if "litert" in options.formats and options.quantize != "none":
        report[f"litert_{options.quantize}"] = _quantized(
            model, run_dir, options, held_out, representative, score
        )
    for fmt in ("keras", f"litert_{options.quantize}"):
        if fmt in report:  # the flat files, beside model.keras
            report[fmt]["path"] = str((run_dir / report[fmt]["path"]).relative_to(root))
    report["keras"]["bytes"] = _size(run_dir / rundir.MODEL)
    return report


def _placed(model, fmt: str, run_dir: Path, root: Path, options, held_out) -> dict[str, Any]:
    """`fmt` exported and checked at its flat file in `run_dir`, or with `options.name` where
    its server loads it under `root` (Triton's also with its config.pbtxt)."""
    placed = serving_layout.server_path(root, fmt, options.name) if options.name else None
    path = placed or run_dir / FILES[fmt]
    if placed is not None:
        path.parent.mkdir(parents=True, exist_ok=True)  # the version folder
    record = export_checked(model, fmt, path, held_out, tolerance=options.tolerance)
    record["path"] = str(path.relative_to(root))
    if placed is not None and fmt == "onnx":
        config = serving_layout.write_triton_config(path)
        record["config"] = str(config.relative_to(root))
    return record


def _quantized(model, run_dir, options, held_out, representative, score) -> dict[str, Any]:
    converter = quantization_options(options.quantize, representative)
    path = quantized_path(run_dir, options.quantize)
    record = export_checked(model, "litert", path, held_out, tolerance=None, **converter)
    record["quantize"] = options.quantize
    record["size_ratio"] = round(record["bytes"] / _size(run_dir / FILES["litert"]), 4)
    if score is not None:
        record["test"] = score(run_litert(path))
        record["float_test"] = score(lambda x: _keras_outputs(model, x))
    return record


def export_run(
    model,
    run_dir: Path,
    options: ExportOptions,
    *,
    splits,
    pipeline,
    task,
    batch_size: int,
    root: Path | None = None,
) -> dict[str, Any]:
    """`export_all` with the examples of a run's splits: its test split (else validation, else
    training) to compare on, training examples to calibrate int8 on, the test split to score a
    quantized model on."""

    def first(dataset, limit: int) -> list[Features]:
        return _feature_batches(
            dataset, pipeline, batch_size=batch_size, limit=limit, chunks=splits.batched
        )

    held_out = next(
        (d for d in (splits.test, splits.validation, splits.train) if d is not None), None
    )
    representative = score = None
    if "litert" in options.formats and options.quantize != "none":
        representative = first(splits.train, options.representative_examples)
        if splits.test is not None:
            score = _scorer(
                splits.test, pipeline, task=task, batch_size=batch_size, chunks=splits.batched
            )
    return export_all(
        model,
        run_dir,
        options,
        held_out=first(held_out, options.check_examples),
        representative=representative,
        score=score,
        root=root,
    )


# --- the run's own formats, written atomically (the callbacks' per-epoch exports too) ------------
def save_model(model, path: Path) -> None:
    """A `.keras` file, written under a temporary name and renamed: never half-written."""
    with files.replace_with(path) as partial:
        model.save(partial)


def export_saved_model(model, path: Path) -> None:
    """An inference SavedModel (`serve` signature, for TF Serving or `tf.saved_model.load`) in
    directory `path`, exported into a temporary sibling and renamed into place: the final name
    never holds a half-written export, and an existing one is replaced only by a complete one."""
    with files.replace_with(path) as tmp:  # a resumed run exports this epoch again
        model.export(str(tmp), format="tf_saved_model", verbose=False)


def export_model(model, run_dir: Path, formats: Collection[str], *, epoch: int | None = None):
    """The model in each of `formats`: `model.keras` ("keras") and `saved_model/`
    ("saved_model"), or `model-EPOCH.keras` and `saved_model-EPOCH/` for an epoch."""
    from tfrecipe.fault import disk

    suffix = "" if epoch is None else f"-{epoch:03d}"
    # h5py (inside `.keras`) crashed the process on a full disk: refuse before it writes.
    disk.check_room(run_dir, disk.weights_bytes(model))
    if "keras" in formats:
        save_model(model, run_dir / f"model{suffix}.keras")
    if "saved_model" in formats:
        export_saved_model(model, run_dir / f"saved_model{suffix}")


def _feature_batches(
    dataset, options, *, batch_size: int, limit: int, chunks: bool = False
) -> list:
    """The first `limit` examples' features of a split (`chunks`: a streamed table's), as NumPy
    batches normalized as the model takes them (`batch_transform`): what exports are checked
    and calibrated on."""
    from tfrecipe.data.pipeline import batch_transform
    from tfrecipe.data.splits import batch

    normalize = batch_transform(options)
    batches = batch(dataset, batch_size, chunks=chunks).take(-(-limit // batch_size))
    from tfrecipe.graph import plain

    return list(batches.map(plain(lambda x, y: normalize(x, y)[0])).as_numpy_iterator())


def _scorer(dataset, options, *, task, batch_size: int, chunks: bool = False):
    """`score(predict) -> {metric: value}`: the task's metrics (`tasks.metrics`) of a predict
    function (features -> model outputs) on a whole split, e.g. an exported model's runtime."""
    from tfrecipe import tasks
    from tfrecipe.data.pipeline import batch_transform
    from tfrecipe.data.splits import batch

    normalize = batch_transform(options)
    batches = batch(dataset, batch_size, chunks=chunks).map(normalize)

    def score(predict) -> dict[str, float]:
        metrics = tasks.metrics(task)
        for x, y in batches.as_numpy_iterator():
            outputs = np.asarray(predict(x), dtype=np.float32)
            for metric in metrics:
                metric.update_state(y, outputs.reshape(len(y), -1))
        return {metric.name: float(metric.result()) for metric in metrics}

    return score
