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
from pathlib import Path
from typing import Any

SIGNATURE = "signature.json"


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
    record: dict[str, Any] = {"task": task.name}
    if task.name in ("binary", "multilabel"):
        record["threshold"] = task.threshold
    record["outputs"] = _output_names(task.name, num_outputs, class_names, label)
    if task.name == "binary":  # the class the probability is of (task.positive_class)
        record["positive_class"] = record["outputs"][1]
    record["inputs"] = _inputs(features, feature_names)
    record["normalize"] = normalize
    return record


def _output_names(
    task: str, num_outputs: int, class_names: Sequence[str], label: str | Sequence[str] | None
) -> list[str]:
    labels = [label] if isinstance(label, str) else list(label or [])
    if task == "binary":
        return list(class_names) if len(class_names) == 2 else ["0", "1"]
    if task == "classification":
        return list(class_names) if len(class_names) == num_outputs else _ids(num_outputs)
    if len(labels) == num_outputs:
        return labels
    if task == "regression" and num_outputs == 1:
        return ["prediction"]
    return _ids(num_outputs)


def _ids(count: int) -> list[str]:
    return [str(i) for i in range(count)]


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


def write(run_dir: Path, record: Mapping[str, Any]) -> None:
    from tfrecipe.rundir import atomic_write

    atomic_write(run_dir / SIGNATURE, json.dumps(record, indent=2) + "\n")


def read(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / SIGNATURE).read_text())
    except FileNotFoundError:
        return None
