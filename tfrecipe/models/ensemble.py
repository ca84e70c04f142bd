"""`ensemble.seeds=N`: one model from N trained members, their averaged probabilities or values.

The ensemble takes the members' raw inputs and ends, as every tfrecipe model does, in float32
logits (or a regression's values), so the task's loss and metrics, `evaluate`, `predict` and
every export format treat it as a single model: the logits of the members' mean probability
(softmax for classification, sigmoid per output for binary and multilabel), or the members'
mean value for regression.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras

from tfrecipe import tasks

# Probabilities are kept this far from 0 and 1 before they become logits again.
_EPSILON = 1e-7


@keras.saving.register_keras_serializable(package="tfrecipe")
class MeanOfMembers(keras.layers.Layer):
    """The mean of the members' outputs in probability space, returned as logits."""

    def __init__(self, averaging: str = "values", **kwargs):
        super().__init__(dtype="float32", **{k: v for k, v in kwargs.items() if k != "dtype"})
        if averaging not in ("softmax", "sigmoid", "values"):
            raise ValueError(f"averaging={averaging!r}: expected softmax, sigmoid or values")
        self.averaging = averaging

    def call(self, outputs):
        stacked = keras.ops.stack([keras.ops.cast(o, "float32") for o in outputs], axis=0)
        if self.averaging == "values":
            return keras.ops.mean(stacked, axis=0)
        if self.averaging == "softmax":
            mean = keras.ops.mean(keras.ops.softmax(stacked, axis=-1), axis=0)
            return keras.ops.log(keras.ops.maximum(mean, _EPSILON))
        mean = keras.ops.clip(
            keras.ops.mean(keras.ops.sigmoid(stacked), axis=0), _EPSILON, 1 - _EPSILON
        )
        return keras.ops.log(mean) - keras.ops.log1p(-mean)

    def get_config(self) -> dict:
        return {**super().get_config(), "averaging": self.averaging}


def averaged(members: Sequence[keras.Model], *, task: str) -> keras.Model:
    """One model: the members (renamed member_0, member_1, ...) on shared inputs, averaged."""
    inputs = keras.tree.map_structure(
        lambda t: keras.Input(shape=t.shape[1:], dtype=t.dtype, name=_input_name(t)),
        members[0].input,
    )
    outputs = []
    for index, member in enumerate(members):
        member.name = f"member_{index}"
        outputs.append(member(inputs))
    # the probabilities of the members' logits (the task's `scores`), or the values themselves
    averaging = tasks.outputs_of(task).scores
    mean = MeanOfMembers(averaging, name="mean_of_members")(outputs)
    return keras.Model(inputs, mean, name="ensemble")


def _input_name(tensor) -> str:
    """An input's own name (a table's column), without Keras' tensor suffixes."""
    history = getattr(tensor, "_keras_history", None)
    layer = history[0] if history else None
    return layer.name if layer is not None else tensor.name
