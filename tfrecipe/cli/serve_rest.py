"""TF Serving's REST request and response bodies for a run's model (`tfrecipe serve`), read
against the run's `signature.json` the way `tfrecipe predict` reads files: the same checks and
the same one-line messages (a bad cell, a missing column, NaN or Inf, a wrong shape).

    {"instances": [EXAMPLE, ...]}           the row format: an example is the array the model
                                            takes, a row {column: cell} of a table, or a text
    {"inputs": COLUMNS}                     the columnar format: {column: [cells]} of a table,
                                            or the batch itself ([EXAMPLE, ...] or {NAME: [...]})

A table's cells are taken as its CSV gives them, numbers or strings ("42", a marker of the run's
`dataset.na_values`); a label column is ignored. NumPy only: no TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfrecipe.data.readers import check_shape, missing_columns
from tfrecipe.data.values import check_finite_array, fault_text, number_fault
from tfrecipe.errors import ConfigError

ROWS, COLUMNAR = "instances", "inputs"
SIGNATURE = "serving_default"  # the one signature served (the SavedModel's own name)


class BadRequest(ValueError):
    """A request the model cannot take: HTTP 400 with this one line."""


@dataclasses.dataclass(frozen=True)
class Request:
    """A predict request, checked: the features as the model takes them (before the run's
    normalization), the rows, and which format to answer in."""

    features: np.ndarray | dict[str, np.ndarray]
    rows: int
    format: str  # ROWS | COLUMNAR


@dataclasses.dataclass(frozen=True)
class Reading:
    """How a run's requests are read: its signature and the cells its table took as missing."""

    signature: Mapping[str, Any]
    na_values: frozenset[str] = frozenset()
    allow_missing: bool = False

    @classmethod
    def of(cls, signature: Mapping[str, Any], dataset: Mapping[str, Any]) -> Reading:
        markers = frozenset(str(v) for v in dataset.get("na_values") or ())
        return cls(signature, markers, bool(markers) or bool(dataset.get("allow_missing")))


def parse(body: bytes, reading: Reading) -> Request:
    """The request in `body`.

    Raises:
      BadRequest: not JSON, neither format, or features the model cannot take (predict's line).
    """
    try:
        return _parse(body, reading)
    except RecursionError:  # `[[[[...` past Python's recursion limit, in json or as it is read
        raise BadRequest(
            "the request body nests its lists or objects too deeply to be read; send examples "
            "nested as the model's shape is"
        ) from None


def _parse(body: bytes, reading: Reading) -> Request:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(f"the request body is not JSON ({error})") from None
    formats = [key for key in (ROWS, COLUMNAR) if isinstance(payload, dict) and key in payload]
    if len(formats) != 1:
        raise BadRequest(
            'expected a JSON object with "instances" (a list of examples) or "inputs" (columns), '
            "one of them"
        )
    signature = payload.get("signature_name", SIGNATURE)
    if signature != SIGNATURE:  # TF Serving refuses a signature its model does not have
        raise BadRequest(
            f"signature_name: {signature!r} is not served here; the model serves {SIGNATURE!r}"
        )
    if b"true" in body or b"false" in body:  # rare: a walk over every number only then
        _refuse_booleans(payload[formats[0]], formats[0], reading.signature["inputs"])
    try:
        features = _features(payload[formats[0]], formats[0], reading)
    except ConfigError as error:  # predict's own line
        raise BadRequest(str(error)) from None
    rows = len(next(iter(features.values())) if isinstance(features, dict) else features)
    if rows == 0:
        raise _no_examples(formats[0])
    return Request(features, rows, formats[0])


def _no_examples(fmt: str) -> BadRequest:
    return BadRequest(f'"{fmt}" holds no examples')


def _features(value: Any, fmt: str, reading: Reading) -> np.ndarray | dict[str, np.ndarray]:
    inputs = reading.signature["inputs"]
    if inputs["kind"] == "columns":
        columns = _table(value, fmt, list(inputs["columns"]))
        return {
            name: _cells(columns[name], name, kind, fmt, reading)
            for name, kind in inputs["columns"].items()
        }
    if inputs["kind"] == "text":
        texts = _batch(value, fmt)
        if not all(isinstance(t, str) for t in texts):
            raise BadRequest(
                f"predict: {fmt}: each example is a text (a JSON string), the model takes raw text"
            )
        return np.asarray(texts, dtype=object)
    names = inputs.get("feature_names")
    if names and _named(value, names):  # a table's rows or columns, stacked as training did
        table = _table(value, fmt, names)
        cells = [_cells(table[name], name, "float32", fmt, reading) for name in names]
        return _array(np.stack(cells, axis=1), fmt, inputs)
    return _array(_batch(value, fmt), fmt, inputs)


def _refuse_booleans(value: Any, fmt: str, inputs: Mapping[str, Any]) -> None:
    """TF Serving refuses `true`/`false` where a tensor of numbers is expected; numpy would take
    them as 1 and 0. (A table's cells are checked one by one, by `_cells`.)"""
    if inputs["kind"] in ("columns", "text") or _named(value, inputs.get("feature_names") or []):
        return
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            raise BadRequest(
                f"predict: {fmt}: examples must be arrays of numbers of shape {inputs['shape']} "
                f"(got {json.dumps(item)}, a boolean)"
            )
        stack.extend(
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )


def _named(value: Any, names: Sequence[str]) -> bool:
    """Whether a vector model's examples come as named cells: {column: [cells]} or rows of
    {column: cell}."""
    first = value[0] if isinstance(value, list) and value else value
    return isinstance(first, dict) and any(name in first for name in names)


def _batch(value: Any, fmt: str) -> list:
    """The list of examples: the value itself, or a one-input model's {NAME: [...]}."""
    if isinstance(value, dict) and len(value) == 1:
        value = next(iter(value.values()))
    if isinstance(value, dict) and fmt == ROWS:  # TF Serving's {"instances": [{"x": ...}]}
        value = [value]
    if not isinstance(value, list):
        raise BadRequest(f'"{fmt}" must be a list of examples, received a {type(value).__name__}')
    if fmt == ROWS and value and all(isinstance(v, dict) and len(v) == 1 for v in value):
        first = next(iter(value[0]))
        if all(first in v for v in value) and not isinstance(value[0][first], int | float | str):
            value = [v[first] for v in value]  # [{"x": example}, ...] of a one-input model
    return value


def _table(value: Any, fmt: str, columns: Sequence[str]) -> dict[str, list]:
    """{column: [cells]} from rows ({column: cell} each) or columns; other columns (a label) are
    ignored, a missing one is predict's message."""
    if fmt == ROWS:
        if not isinstance(value, list) or not all(isinstance(row, dict) for row in value):
            raise BadRequest('"instances" of a table\'s model: a list of rows, {column: cell} each')
        for index, row in enumerate(value):
            if any(name not in row for name in columns):
                raise missing_columns(f"instances[{index}]", columns, list(row))
        return {name: [row[name] for row in value] for name in columns}
    if not isinstance(value, dict):
        raise BadRequest('"inputs" of a table\'s model: {column: [cells]}')
    if any(name not in value for name in columns):
        raise missing_columns("inputs", columns, list(value))
    lists = {name: value[name] for name in columns}
    if not all(isinstance(cells, list) for cells in lists.values()):
        raise BadRequest('"inputs" of a table\'s model: a list of cells per column')
    if len({len(cells) for cells in lists.values()}) > 1:
        sizes = {name: len(cells) for name, cells in lists.items()}
        raise BadRequest(f'"inputs": columns of different lengths ({sizes})')
    return lists


def _cells(cells: list, column: str, kind: str, fmt: str, reading: Reading) -> np.ndarray:
    """A column's cells as the model takes them: strings, or numbers checked as predict checks
    a CSV's (missing cells: NaN where the run fills them, as training did)."""
    where = (lambda i: f"instances[{i}]") if fmt == ROWS else (lambda i: f"inputs[{column!r}][{i}]")
    if kind == "string":
        for index, cell in enumerate(cells):
            if isinstance(cell, dict | list):  # a CSV's cell is text: no JSON of its own
                shape = "an object" if isinstance(cell, dict) else "a list"
                raise ConfigError(
                    f"predict: {where(index)}: column {column!r}: a cell is a string or a "
                    f"number, got {shape}"
                )
        return np.asarray(["" if c is None else str(c) for c in cells], dtype=object)
    values = np.empty(len(cells), dtype=np.float32)
    for index, cell in enumerate(cells):
        text = None if cell is None else cell if isinstance(cell, str) else repr(cell)
        if text is None or text in reading.na_values:
            fault = None if reading.allow_missing else "missing"
        elif isinstance(cell, bool):
            fault = "not a number"
        else:
            fault = number_fault(text, reading.na_values)
        if fault is not None:
            text = fault_text(fault, text, column, predict=True)
            raise ConfigError(f"predict: {where(index)}: {text}")
        values[index] = np.nan if text is None or text in reading.na_values else float(text)
    return values.astype(kind)


def _array(batch: list, fmt: str, inputs: Mapping[str, Any]) -> np.ndarray:
    """The examples as one array of the model's shape and dtype, every value finite."""
    if isinstance(batch, list) and not batch:  # not "examples of shape []": there are none
        raise _no_examples(fmt)
    try:
        array = np.asarray(batch, dtype=np.float64)
    except (ValueError, TypeError, OverflowError) as error:  # ragged, a string, 10**400
        raise BadRequest(
            f"predict: {fmt}: examples must be arrays of numbers of shape {inputs['shape']} "
            f"({str(error).splitlines()[0]})"
        ) from None
    check_shape(fmt, array.shape[1:], inputs["shape"])
    try:
        check_finite_array(fmt, fmt, array)
    except ValueError as error:
        raise BadRequest(f"predict: {error}") from None
    dtype = np.dtype(inputs["dtype"])
    if dtype.kind in "iu" and (
        np.any(array != np.round(array))
        or array.min() < np.iinfo(dtype).min
        or array.max() > np.iinfo(dtype).max
    ):
        raise BadRequest(f"predict: {fmt}: the model takes whole numbers of {dtype.name}")
    return array.astype(dtype)


def response(outputs: np.ndarray, decoded: Mapping[str, np.ndarray], fmt: str) -> dict:
    """TF Serving's answer: `predictions` (rows) or `outputs` (columnar), the model's outputs as
    the SavedModel gives them; `decoded`: `tfrecipe predict`'s columns (class names,
    probabilities, values in the targets' units), a field TF Serving clients ignore."""
    columns = {name: np.asarray(values).tolist() for name, values in decoded.items()}
    if fmt == ROWS:
        rows = [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]
        return {"predictions": outputs.tolist(), "decoded": rows}
    return {"outputs": outputs.tolist(), "decoded": columns}
