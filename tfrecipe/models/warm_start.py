"""`model.init_from`: a new run starts from the weights of something tfrecipe wrote.

The source is a run dir (its model.keras, else its latest backup), a `.keras` model, a
`.weights.h5` file, or a backup checkpoint (a backup dir or a checkpoint prefix). Tensors are
matched by where they sit in the model and by shape, never by Keras' auto-generated layer names
(`conv2d_3` in one process is `conv2d` in another):

- Keras files (`.keras` holds a `model.weights.h5`) by their path in Keras' weights file
  (`layers/conv2d_1/vars/0`: each layer named by its class and its rank among layers of that
  class, as Keras itself reads them back);
- backups by their object path in the checkpoint (`_operations/3/_kernel`).

A different head is fine: its tensors change shape and are skipped; a tensor with no counterpart
stays as built. Only the model's weights are read: the optimizer and the step start fresh (that is
`resume`'s job).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from tfrecipe.errors import ConfigError
from tfrecipe.init_source import KEY, Source, resolve

log = logging.getLogger("tfrecipe")

_WEIGHTS_IN_KERAS_FILE = "model.weights.h5"  # inside a .keras zip (Keras 3's format)


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What a warm start did, for the log and summary.json."""

    path: str
    loaded: int
    skipped: list[str]  # "name (source shape -> model shape)"
    new: int

    def summary(self) -> dict[str, Any]:
        skipped = len(self.skipped)
        return {"path": self.path, "loaded": self.loaded, "skipped": skipped, "new": self.new}

    def line(self) -> str:
        why = f" (shape mismatch: {', '.join(self.skipped)})" if self.skipped else ""
        return (
            f"init_from {self.path}: loaded {self.loaded} tensors, skipped {len(self.skipped)}"
            f"{why}, {self.new} new"
        )


def init_from(model, path: str | Path) -> Loaded:
    """Loads the tensors of `path` that match `model` by position and shape into `model` (call
    it in the strategy's scope: the assignments reach every replica); logs one line.

    Raises:
      ConfigError: `path` is not an accepted source, or nothing in it matches the model.
    """
    from tfrecipe.fault.backup import resolve_checkpoints

    source = resolve(path, checkpoints=resolve_checkpoints)
    if source.kind == "checkpoint":
        loaded = _from_checkpoint(model, source.path, shown=str(path))
    else:
        loaded = _from_weights_file(model, source, shown=str(path))
    if not loaded.loaded:
        raise ConfigError(
            f"{KEY}={path}: no tensor of it matches the model by position and shape "
            f"({len(loaded.skipped)} differ in shape, {loaded.new} have no counterpart); "
            "start from a run of the same model (the head may differ)"
        )
    log.info(loaded.line())
    return loaded


# --- Keras weights files -------------------------------------------------------------------------
def _from_weights_file(model, source: Source, *, shown: str) -> Loaded:
    """Keras' own weights-file paths on both sides: the model writes its weights to a scratch
    file, the matching datasets are overwritten with the source's, and Keras loads it back."""
    import h5py

    with tempfile.TemporaryDirectory(prefix="tfrecipe-init-from-") as scratch:
        source_file = _weights_h5(source, Path(scratch))
        target_file = Path(scratch) / "target.weights.h5"
        model.save_weights(target_file)
        try:
            src = h5py.File(source_file, "r")
        except OSError as error:  # not HDF5, truncated
            raise ConfigError(f"{KEY}={shown}: cannot read {source_file.name} ({error})") from None
        with src, h5py.File(target_file, "r+") as dst:
            loaded, skipped, new = _copy_matching(_h5_tensors(src), _h5_tensors(dst))
        model.load_weights(target_file)
    return Loaded(shown, loaded, skipped, new)


def _weights_h5(source: Source, scratch: Path) -> Path:
    if source.kind == "h5":
        return source.path
    try:
        with zipfile.ZipFile(source.path) as archive:
            return Path(archive.extract(_WEIGHTS_IN_KERAS_FILE, scratch))
    except (zipfile.BadZipFile, KeyError):
        raise ConfigError(
            f"{KEY}={source.path}: not a Keras 3 .keras file (no {_WEIGHTS_IN_KERAS_FILE} inside)"
        ) from None


def _h5_tensors(file) -> dict[str, Any]:
    """The model's weight datasets by path (`layers/conv2d/vars/0`); the optimizer's are left."""
    import h5py

    found: dict[str, Any] = {}

    def visit(name: str, item) -> None:
        if isinstance(item, h5py.Dataset) and not name.startswith("optimizer/"):
            found[name] = item

    file.visititems(visit)
    return found


def _copy_matching(source: dict[str, Any], target: dict[str, Any]) -> tuple[int, list[str], int]:
    """Writes each source dataset into the target one at the same path and shape; returns
    (loaded, skipped descriptions, new)."""
    loaded, skipped, new = 0, [], 0
    for name, dataset in target.items():
        match = source.get(name)
        if match is None:
            new += 1
        elif match.shape != dataset.shape:
            skipped.append(_mismatch(_short(name), match.shape, dataset.shape))
        else:
            dataset[...] = match[...]
            loaded += 1
    return loaded, skipped, new


def _short(name: str) -> str:
    """`layers/dense_1/vars/0` -> `dense_1:0` (nested: `functional/conv2d:0`)."""
    return name.removeprefix("layers/").replace("/layers/", "/").replace("/vars/", ":")


def _mismatch(name: str, source_shape, target_shape) -> str:
    return f"{name} {list(source_shape)}->{list(target_shape)}"


# --- backup checkpoints --------------------------------------------------------------------------
def _from_checkpoint(model, prefix: Path, *, shown: str) -> Loaded:
    """A backup's model variables by their object path under `model` in the checkpoint, matched
    with the same paths in `model`; assigned directly (a fresh optimizer is left alone)."""
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(str(prefix))
    except (tf.errors.OpError, ValueError) as error:
        raise ConfigError(f"{KEY}={prefix}: cannot read the checkpoint ({error})") from None
    source = _checkpoint_keys(reader)
    loaded, skipped, new = 0, [], 0
    for path, variable in _model_variables(model).items():
        key = source.get(path)
        if key is None:
            new += 1
            continue
        value = reader.get_tensor(key)
        if tuple(value.shape) != tuple(variable.shape):
            skipped.append(_mismatch(path, value.shape, variable.shape))
            continue
        variable.assign(value)
        loaded += 1
    return Loaded(shown, loaded, skipped, new)


def _checkpoint_keys(reader) -> dict[str, str]:
    """Object path under the checkpoint's `model` (`_operations/1/_kernel`) -> tensor key."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    root = {child.local_name: child.node_id for child in graph.nodes[0].children}
    if "model" not in root:
        return {}

    def children(node_id: int):
        return [(child.local_name, child.node_id) for child in graph.nodes[node_id].children]

    keys = {}
    for path, node_id in _walk(root["model"], children):
        for attribute in graph.nodes[node_id].attributes:
            if attribute.name == "VARIABLE_VALUE":
                keys[path] = attribute.checkpoint_key
    return keys


def _model_variables(model) -> dict[str, Any]:
    """The model's variables by object path, as a checkpoint of `model=model` records them."""
    import tensorflow as tf

    view = tf.train.TrackableView(model)

    def children(obj):
        return list(view.children(obj).items())

    variables = {}
    for path, obj in _walk(model, children, key=id):
        if isinstance(obj, tf.Variable) or _is_keras_variable(obj):
            variables[path] = obj
    return variables


def _is_keras_variable(obj) -> bool:
    import keras

    return isinstance(obj, keras.Variable)


# The model's compiled optimizer hangs under the model too: its slots are not the model's weights.
_NOT_WEIGHTS = frozenset({"optimizer", "_compiled_trainable_state"})


def _walk(root, children, *, key=lambda node: node):
    """(path, node) breadth-first, each node once under its first path (as a checkpoint names
    an object by its first path), without the optimizer."""
    seen = {key(root)}
    queue = [("", root)]
    while queue:
        path, node = queue.pop(0)
        if path:
            yield path, node
        for name, child in children(node):
            if (not path and name in _NOT_WEIGHTS) or key(child) in seen:
                continue
            seen.add(key(child))
            queue.append((f"{path}/{name}" if path else name, child))
