"""A user's dataset builder whose targets a task must refuse (tests/test_tasks.py), and a model
builder written for the signature before tasks (`num_classes`)."""

from __future__ import annotations

import keras
import numpy as np

from tfrecipe.data.splits import Holdout, Splits, from_arrays

_N = 40


def bad_targets(*, problem: str) -> Splits:
    """8 features and targets with one `problem`: strings, class_id (5 with num_classes=3),
    width (3-wide multi-hot labels), nan (a NaN float target)."""
    features = np.random.default_rng(0).normal(size=(_N, 8)).astype("float32")
    classes = (np.arange(_N) % 3).astype("int32")
    if problem == "strings":
        targets, kind, num_classes = np.array(["cheap", "dear"] * (_N // 2)), "classes", 2
    elif problem == "class_id":
        targets, kind, num_classes = (
            np.where(classes == 2, 5, classes).astype("int32"),
            "classes",
            3,
        )
    elif problem == "width":
        targets, kind, num_classes = np.eye(3, dtype="float32")[classes], "multi_hot", 3
    else:
        targets = classes.astype("float32")[:, None]
        targets[7] = np.nan
        kind, num_classes = "float", 0
    return from_arrays(
        features,
        targets,
        num_classes=num_classes,
        target_kind=kind,
        holdout=Holdout(0.0, 0.0, 0),
    )


def old_signature(*, input_shape, num_classes) -> keras.Model:
    inputs = keras.Input(shape=tuple(input_shape))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))
