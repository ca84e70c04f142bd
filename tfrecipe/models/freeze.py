"""`model.freeze`: which layers of a built model train.

    none           everything trains
    backbone       the layer named "backbone" (model=keras_app's application), else every layer
                   but the head ("logits"): the small builders' whole body
    fraction:0.8   the first 80% of the backbone's layers (the early, generic features)
    REGEX          every layer whose name it matches (`re.search`; nested layers included)

A frozen layer's weights do not move, and its BatchNormalization layers run in inference mode
(Keras 3 uses the moving statistics of a BN layer whose `trainable` is False, the fine-tuning
guidance of keras.io/guides/transfer_learning). Two-phase fine-tuning undoes it with `unfreeze`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import keras

from tfrecipe.config.schema import parse_freeze
from tfrecipe.errors import ConfigError, Problem

BACKBONE = "backbone"
HEAD = "logits"


def apply(model: keras.Model, spec: str | None) -> list[str]:
    """Freezes what `spec` (a `model.freeze` value) names; returns the frozen layers' names.

    Raises:
      ConfigError: a bad spec, or one that names no layer of this model.
    """
    try:
        kind, argument = parse_freeze(spec)
    except ValueError as error:
        raise ConfigError(Problem("model.freeze", spec, str(error))) from None
    if kind == "none":
        return []
    if kind == "backbone":
        frozen = backbone_layers(model)
    elif kind == "fraction":
        body = backbone_layers(model, flatten=True)
        frozen = body[: int(argument * len(body))]
    else:
        frozen = [layer for layer in all_layers(model) if re.search(argument, layer.name)]
    if not frozen:
        raise ConfigError(Problem("model.freeze", spec, _nothing_matched(model)))
    for layer in frozen:
        layer.trainable = False
    return [layer.name for layer in frozen]


def unfreeze(model: keras.Model, regex: str | None = None) -> list[str]:
    """Makes trainable the backbone (regex None: what `freeze=backbone` freezes; keras_app's
    fixed preprocessing stays fixed) or the layers whose name `regex` matches (with what they
    contain, and the models that contain them); returns the names of the layers that were
    frozen and now train. The caller recompiles (fit) or rebuilds its train step (custom loop):
    the trainable set is read when a step is traced.
    """
    paths = list(_paths(model))
    before = {id(path[-1]): path[-1].trainable for path in paths}
    if regex is None:
        matched = {id(layer) for layer in backbone_layers(model)}
    else:
        matched = {id(p[-1]) for p in paths if re.search(regex, p[-1].name)}
    ancestors = {id(outer) for p in paths if id(p[-1]) in matched for outer in p[:-1]}
    # Keras passes `trainable` down to every sublayer: set outer before inner (the order of
    # `_paths`) so each layer ends as wanted, the others as they were.
    for path in paths:
        layer = path[-1]
        inside_matched = any(id(outer) in matched for outer in path[:-1])
        wanted = id(layer) in matched | ancestors or inside_matched or before[id(layer)]
        layer.trainable = wanted
    return [p[-1].name for p in paths if p[-1].trainable and not before[id(p[-1])]]


def backbone_layers(model: keras.Model, *, flatten: bool = False) -> list[keras.layers.Layer]:
    """The layers `freeze=backbone` freezes: the nested "backbone" model (its layers, in order,
    when `flatten`), else the model's layers but its inputs and the head."""
    for layer in model.layers:
        if layer.name == BACKBONE and isinstance(layer, keras.Model):
            return list(layer.layers) if flatten else [layer]
    return [
        layer
        for layer in model.layers
        if layer.name != HEAD and not isinstance(layer, keras.layers.InputLayer)
    ]


def all_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """Every layer of the model, nested models' layers included (outer before inner)."""
    return [path[-1] for path in _paths(model)]


def _paths(model: keras.Model, outer: tuple = ()) -> Iterator[tuple[keras.layers.Layer, ...]]:
    for layer in model.layers:
        yield (*outer, layer)
        if isinstance(layer, keras.Model):
            yield from _paths(layer, (*outer, layer))


def _nothing_matched(model: keras.Model) -> str:
    names = [layer.name for layer in all_layers(model)]
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return f"matches no layer of this model; its layers: {shown}"


def param_counts(model: keras.Model) -> dict[str, int]:
    """{total, trainable}: the model's parameter counts (summary.json's `params`)."""
    trainable = sum(math.prod(w.shape) for w in model.trainable_weights)
    return {"total": int(model.count_params()), "trainable": trainable}
