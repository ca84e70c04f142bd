"""What a run's model takes and what its outputs mean: `RUN_DIR/signature.json`.

Written by the chief when training starts (the dataset's class names and target encoding are
known only then), read by `tfrecipe predict` before it imports TensorFlow:

    {"task": "binary", "threshold": 0.5, "outputs": ["no", "yes"], "positive_class": "yes",
     "inputs": {"kind": "columns", "columns": {"age": "float32", "city": "string"}},
     "normalize": "scale"}

`outputs` names what the model's head scores: class names by class id (classification, binary:
[negative, positive]), label names (multilabel) or target names (regression, in the targets' own
units). `inputs.kind` is `columns` (a table's named columns, each a number or a string),
`array` (a tensor of `shape`, with `feature_names` naming a vector's columns when known) or
`text` (one raw string per example).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tfrecipe import files, rundir, tasks

SIGNATURE = rundir.SIGNATURE
TASKS = tuple(tasks.SPECS)
NORMALIZE = ("scale", "per_example", "none")  # pipeline.normalize's values
# A signature is a few KB (class names; a table's columns): one of many MB is not one.
MAX_SIGNATURE_BYTES = 16 * 1024**2


def describe(
    *,
    task: Any,
    num_outputs: int,
    class_names: Sequence[str],
    feature_names: Sequence[str],
    features: Any,
    label: str | Sequence[str] | None,
    normalize: str,
) -> dict[str, Any]:
    """The signature of a run.

    Args:
      task: the validated `task` config (schema.Task).
      num_outputs: the width of the model's head.
      class_names: the dataset's names of class ids (empty: the ids are the names).
      feature_names: the names of a feature vector's columns (empty: unnamed).
      features: the element spec of one example's features (a `tf.TensorSpec`, or a dict of them
        for a table's columns).
      label: the dataset's label column(s), when it reads a table.
      normalize: `pipeline.normalize`, which predictions apply as training did.
    """
    outputs = tasks.outputs_of(task.name)
    record: dict[str, Any] = {"task": task.name}
    if outputs.thresholded:
        record["threshold"] = task.threshold
    labels = [label] if isinstance(label, str) else list(label or [])
    record["outputs"] = outputs.names(num_outputs, class_names, labels)
    if outputs.positive_class:  # the class the probability is of (task.positive_class)
        record["positive_class"] = record["outputs"][1]
    record["inputs"] = _inputs(features, feature_names)
    record["normalize"] = normalize
    return record


def _inputs(features: Any, feature_names: Sequence[str]) -> dict[str, Any]:
    if isinstance(features, Mapping):
        return {
            "kind": "columns",
            "columns": {name: spec.dtype.name for name, spec in features.items()},
        }
    if features.dtype.name == "string":
        return {"kind": "text"}
    described: dict[str, Any] = {
        "kind": "array",
        "shape": list(features.shape),
        "dtype": features.dtype.name,
    }
    if feature_names:
        described["feature_names"] = list(feature_names)
    return described


def write(home: rundir.RunFiles, record: Mapping[str, Any]) -> None:
    files.write_atomic(home.file("signature"), json.dumps(record, indent=2) + "\n")


def read(home: rundir.RunFiles) -> dict[str, Any] | None:
    """The run's signature; None when it has none.

    Raises:
      reading.UnreadableFile: not a regular file, too large, not JSON, or not a signature (one
        line naming the file).
    """
    from tfrecipe import reading

    path = home.file("signature")
    try:
        record = reading.read_json(path, limit=MAX_SIGNATURE_BYTES, what="a signature.json")
    except FileNotFoundError:
        return None
    problem = _problem(record)
    if problem:
        raise reading.UnreadableFile(
            f"{path}: {problem}; not a signature tfrecipe wrote (retrain, or restore the file)"
        )
    return record


def _problem(record: Any) -> str | None:
    """What makes `record` no signature `predict` can use (None: nothing)."""
    if not isinstance(record, dict):
        return f"holds a JSON {type(record).__name__}, not an object"
    if record.get("task") not in TASKS:
        return f"task={record.get('task')!r}, expected one of {', '.join(TASKS)}"
    outputs = record.get("outputs")
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) for o in outputs):
        return "outputs must be a non-empty list of names"
    meaning = tasks.outputs_of(record["task"])
    if meaning.thresholded and not isinstance(record.get("threshold"), int | float):
        return f"threshold={record.get('threshold')!r}, expected a number"
    if meaning.positive_class and len(outputs) != 2:  # [negative, positive]
        return f"a {record['task']} task names 2 outputs, received {len(outputs)}"
    if record.get("normalize", "scale") not in NORMALIZE:
        return f"normalize={record.get('normalize')!r}, expected one of {', '.join(NORMALIZE)}"
    inputs = record.get("inputs")
    kind = inputs.get("kind") if isinstance(inputs, dict) else None
    if kind not in ("columns", "array", "text"):
        return f"inputs.kind={kind!r}, expected columns, array or text"
    if kind == "columns" and not (
        isinstance(inputs.get("columns"), dict)
        and inputs["columns"]
        and all(isinstance(t, str) for t in inputs["columns"].values())
    ):
        return "inputs.columns must map column names to their types"
    if kind == "array":
        shape = inputs.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape
        ):
            return f"inputs.shape={shape!r}, expected a list of positive sizes"
        names = inputs.get("feature_names")
        if names is not None and not (
            isinstance(names, list) and all(isinstance(n, str) for n in names)
        ):
            return "inputs.feature_names must be a list of names"
    return None
