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
