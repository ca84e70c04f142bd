"""The numbers training and `tfrecipe predict` accept: finite, and within float32's range (the
models' dtype: 1e39 is Inf once converted). One check for both, so that what training refuses
`predict` refuses too, with the same line naming the file, the place and the value, instead of
scoring it with confident probabilities. No TensorFlow here (`predict` checks before it loads).
"""

from __future__ import annotations

import numpy as np

FLOAT32_MAX = float(np.finfo(np.float32).max)


def out_of_range(value: float) -> bool:
    """Whether a number is NaN, Inf, or beyond float32's range (Inf once the model reads it)."""
    return not np.isfinite(value) or abs(value) > FLOAT32_MAX


# What a cell of a numeric column may be wrong with, and what to do about it in training's data
# (its dataset config) and in `predict`'s input (the run's model is fixed: the cell must change).
# ("missing or not finite": a Parquet value, known only as null or not finite.)
_TRAINING_ADVICE = {
    "missing": "list its marker in dataset.na_values (e.g. ['']) to fill it with the training "
    "mean, or fill it in the file",
    "not a number": "list the column in dataset.categorical if it holds categories, or the "
    "marker in dataset.na_values",
    "not finite": "list it in dataset.na_values to treat it as missing",
    "beyond float32": "rescale the column",
    "spaces": "remove them",
    "missing or not finite": "set dataset.allow_missing=true to fill missing values with the "
    "training mean",
}
_PREDICT_ADVICE = {
    "missing": "the run's model was trained without a missing-value marker for this column "
    "(dataset.na_values) and takes a number in every cell: fill the cell, or leave the row out",
    "not a number": "the run's model takes a number (float32) in this column: correct the cell, "
    "or leave the row out",
    "not finite": "the run's model takes finite numbers in this column: correct the cell, or "
    "leave the row out",
    "beyond float32": "the run's model takes float32 numbers in this column: correct the cell, "
    "or leave the row out",
    "spaces": "remove them",
    "missing or not finite": "the run's model takes a finite number in every cell of this "
    "column: correct the cell, or leave the row out",
}


def number_fault(cell: str, na_values: set[str] | frozenset[str] | tuple = ()) -> str | None:
    """What is wrong with a table's `cell` as a number: missing, not a number, not finite,
    beyond float32 or spaces (None: nothing; a marker of `na_values` is a missing number the run
    fills)."""
    if cell in na_values:
        return None
    text = cell.strip()
    if not text:
        return "missing"
    try:
        value = float(text)
    except ValueError:
        return "not a number"
    if not np.isfinite(value):
        return "not finite"
    if abs(value) > FLOAT32_MAX:  # Inf once read as the models' float32
        return "beyond float32"
    return "spaces" if text != cell else None


def fault_text(fault: str, cell: str | None, column: str, *, predict: bool = False) -> str:
    """`column 'c': what is wrong; what to do`, for training's data or (`predict`) for new
    input. `cell` is the cell as written."""
    what = {
        "missing": "missing value",
        "not a number": f"{cell!r} is not a number",
        "not finite": f"{cell!r} is not a finite number",
        "beyond float32": f"{cell!r} is beyond float32's range (at most {FLOAT32_MAX:.4g} in size)",
        "spaces": f"{cell!r} has spaces around the number",
        "missing or not finite": "missing or not a finite number",
    }[fault]
    advice = (_PREDICT_ADVICE if predict else _TRAINING_ADVICE)[fault]
    return f"column {column!r}: {what}; {advice}"


def number_problem(cell: str, column: str, na_values: set[str] | frozenset[str]) -> str | None:
    """What is wrong with `cell` as a number of `column` (None: nothing)."""
    fault = number_fault(cell, na_values)
    return None if fault is None else fault_text(fault, cell, column)


class CellError(ValueError):
    """A cell that is no number the models take: `WHERE: column 'c': ...` in training's words;
    `where` (`file:line`, `file: row N`), `column`, `cell` (as written; None: a Parquet value)
    and `fault` (`number_fault`'s) let `predict` say it in its own."""

    def __init__(self, where: str, column: str, cell: str | None, fault: str):
        super().__init__(f"{where}: {fault_text(fault, cell, column)}")
        self.where, self.column, self.cell, self.fault = where, column, cell, fault


def _bad(x: np.ndarray) -> np.ndarray:
    """Where an array holds a value the models cannot take as a number."""
    if x.dtype.kind != "f":
        return np.zeros(x.shape, bool)  # integers (even int64's) fit float32's range
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(x) | (np.abs(x) > FLOAT32_MAX)


def check_finite_array(where: str, name: str, x: np.ndarray, *, first_row: int = 0) -> None:
    """Refuses an array of inputs holding NaN, Inf or values beyond float32's range: they would
    train into a NaN loss (which reads as a diverged learning rate), or be scored as if they
    were numbers.

    Args:
      where: the file (for the message).
      name: the array's name in it (an `.npz` key, `x` for an `.npy` file).
      x: the values, examples along the first axis.
      first_row: the index in the file of `x`'s first example (arrays checked in chunks).

    Raises:
      ValueError: `FILE: NAME holds N non-finite values (...; the first at NAME[i, j]=v)`.
    """
    bad = _bad(x)
    count = int(np.count_nonzero(bad))
    if not count:
        return
    first = np.unravel_index(int(np.argmax(bad)), x.shape)
    index = (first[0] + first_row, *first[1:]) if first else ()
    value = x[first].item() if x.ndim else x.item()
    raise ValueError(
        f"{where}: {name} holds {count} non-finite value{'s' * (count > 1)} (NaN, Inf or beyond "
        f"float32's range; the first at {name}[{', '.join(map(str, index))}]={value!r}); inputs "
        "must be finite numbers"
    )
