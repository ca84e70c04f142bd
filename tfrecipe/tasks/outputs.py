"""What a task's model outputs mean: the names `signature.json` gives them, whether a threshold
and a positive class apply, the columns `tfrecipe predict` writes and how it decodes the outputs
into them, how an ensemble averages them, and the outputs a probability stands for (baselines).

| task           | outputs named by          | head scores       | prediction columns             |
|----------------|---------------------------|-------------------|--------------------------------|
| classification | class names by id         | softmax logits    | prediction, prob_CLASS...      |
| binary         | [negative, positive]      | 1 sigmoid logit   | prediction, prob_NEG, prob_POS |
| multilabel     | label names               | sigmoid logits    | pred_LABEL..., prob_LABEL...   |
| regression     | target names              | values            | prediction(_TARGET...)         |

NumPy only: `predict` decodes with it, and reads it before TensorFlow is imported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

# Probabilities are kept this far from 0 and 1 before they become logits (finite losses).
EPSILON = 1e-7


@dataclasses.dataclass(frozen=True)
class Outputs:
    """What one task's head gives, and how it reads as predictions.

    Attributes:
      scores: what the head scores: "softmax" (logits of one class among several), "sigmoid"
        (a logit per output, each a probability of its own) or "values" (targets' own units);
        an ensemble averages its members' outputs in that space.
      names: the outputs' names from (num_outputs, class names, label columns).
      thresholded: a probability at `task.threshold` or above is a yes (signature's `threshold`).
      positive_class: the output is the probability of class 1, `outputs[1]`
        (`task.positive_class`; signature's `positive_class`).
      columns: `predict`'s columns after the pass-through ones, from the outputs' names.
      decode: the head's outputs (rows of logits or values, float64) as those columns, from
        (outputs, names, threshold).
      from_probabilities: the head's outputs a model predicting these probabilities (or values)
        would give, from (probabilities, num_classes): a baseline scored as the model is.
    """

    scores: str
    names: Callable[[int, Sequence[str], list[str]], list[str]]
    thresholded: bool
    positive_class: bool
    columns: Callable[[list[str]], list[str]]
    decode: Callable[[np.ndarray, list[str], float | None], dict[str, np.ndarray]]
    from_probabilities: Callable[[np.ndarray, int], np.ndarray]


def _ids(count: int) -> list[str]:
    return [str(i) for i in range(count)]


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits))


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


def _clipped(p: np.ndarray) -> np.ndarray:
    return np.clip(p, EPSILON, 1 - EPSILON)


def _class_columns(names: list[str]) -> list[str]:
    return ["prediction", *(f"prob_{name}" for name in names)]


# --- classification: one class among num_outputs ------------------------------------------------
def _class_names(num_outputs: int, class_names: Sequence[str], labels: list[str]) -> list[str]:
    return list(class_names) if len(class_names) == num_outputs else _ids(num_outputs)


def _softmax_decode(outputs: np.ndarray, names: list[str], threshold: float | None):
    shifted = np.exp(outputs - outputs.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    chosen = np.asarray(names, dtype=object)[probabilities.argmax(axis=1)]
    return {"prediction": chosen} | {
        f"prob_{name}": probabilities[:, i] for i, name in enumerate(names)
    }


def _class_logits(probabilities: np.ndarray, num_classes: int) -> np.ndarray:
    p = _clipped(probabilities)
    if p.shape[1] < num_classes:  # classes above the training split's
        p = np.pad(p, ((0, 0), (0, num_classes - p.shape[1])), constant_values=EPSILON)
    return np.log(p)


# --- binary: the probability of class 1 of two ---------------------------------------------------
def _two_class_names(num_outputs: int, class_names: Sequence[str], labels: list[str]):
    return list(class_names) if len(class_names) == 2 else ["0", "1"]


def _binary_decode(outputs: np.ndarray, names: list[str], threshold: float | None):
    positive = _sigmoid(outputs[:, 0])
    chosen = np.where(positive >= threshold, names[1], names[0]).astype(object)
    return {
        "prediction": chosen,
        f"prob_{names[0]}": 1 - positive,
        f"prob_{names[1]}": positive,
    }


def _positive_logit(probabilities: np.ndarray, num_classes: int) -> np.ndarray:
    p = _clipped(probabilities)
    p = p[:, 1] if p.ndim == 2 else p
    return _logit(p).reshape(-1, 1)


# --- multilabel: a yes or no per label; regression: values ---------------------------------------
def _label_names(num_outputs: int, class_names: Sequence[str], labels: list[str]) -> list[str]:
    return labels if len(labels) == num_outputs else _ids(num_outputs)


def _label_columns(names: list[str]) -> list[str]:
    return [*(f"pred_{name}" for name in names), *(f"prob_{name}" for name in names)]


def _multilabel_decode(outputs: np.ndarray, names: list[str], threshold: float | None):
    probabilities = _sigmoid(outputs)
    chosen = (probabilities >= threshold).astype(np.int64)
    return {f"pred_{n}": chosen[:, i] for i, n in enumerate(names)} | {
        f"prob_{n}": probabilities[:, i] for i, n in enumerate(names)
    }


def _target_names(num_outputs: int, class_names: Sequence[str], labels: list[str]) -> list[str]:
    if len(labels) == num_outputs:
        return labels
    return ["prediction"] if num_outputs == 1 else _ids(num_outputs)


def _value_columns(names: list[str]) -> list[str]:
    return ["prediction"] if len(names) == 1 else [f"prediction_{name}" for name in names]


def _values_decode(outputs: np.ndarray, names: list[str], threshold: float | None):
    return {column: outputs[:, i] for i, column in enumerate(_value_columns(names))}


CLASSES = Outputs(
    scores="softmax",
    names=_class_names,
    thresholded=False,
    positive_class=False,
    columns=_class_columns,
    decode=_softmax_decode,
    from_probabilities=_class_logits,
)
BINARY = Outputs(
    scores="sigmoid",
    names=_two_class_names,
    thresholded=True,
    positive_class=True,
    columns=_class_columns,
    decode=_binary_decode,
    from_probabilities=_positive_logit,
)
LABELS = Outputs(
    scores="sigmoid",
    names=_label_names,
    thresholded=True,
    positive_class=False,
    columns=_label_columns,
    decode=_multilabel_decode,
    from_probabilities=lambda probabilities, num_classes: _logit(_clipped(probabilities)),
)
VALUES = Outputs(
    scores="values",
    names=_target_names,
    thresholded=False,
    positive_class=False,
    columns=_value_columns,
    decode=_values_decode,
    from_probabilities=lambda values, num_classes: values.reshape(len(values), -1),
)
