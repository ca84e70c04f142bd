"""What the scikit-learn baselines (tfrecipe/training/baselines.py) take in memory, estimated
before anything is allocated: a table of 10,000-value categorical columns is a matrix tens of
thousands of one-hot columns wide, and 3,000 classes give a linear model 3,000 weight vectors
of that width; fitted as they come, they grow until the kernel kills the process.

The estimate adds what is held at the heaviest moment of each step, in bytes:
- the encoded matrix, float32, while its chunks are joined (twice);
- the linear model (LogisticRegression, Ridge): scikit-learn's float64 copy of the training
  rows; its weights (an output's vector per class, or per label kept for every label), L-BFGS's
  10 correction pairs plus the gradient; its probabilities, their gradient and log;
- the boosted trees: the training rows binned (one byte a cell), the raw predictions, gradients
  and hessians of each output, a few nodes' histograms (256 bins x 20 bytes a column), and for
  multi-hot targets the fitted models of every label kept;
- the scores: each model's probabilities on the held-out rows, widened and turned to logits.
No TensorFlow here.
"""

from __future__ import annotations

import dataclasses

from tfrecipe.errors import ConfigError

_LBFGS_COPIES = 22  # 10 (s, y) pairs, the gradient and the weights
_HISTOGRAM_NODES = 8  # nodes whose histograms the boosted trees hold at once
_HISTOGRAM_BYTES = 256 * 20  # per column: 256 bins of (gradient, hessian, count)
_TREES_BYTES = 256 * 1024  # a fitted boosted model: 100 trees of up to 31 leaves
_SCORED_COPIES = 4  # probabilities, widened, logits, the metric's copy


@dataclasses.dataclass(frozen=True)
class BaselineData:
    """The matrix the baselines are fitted on.

    Attributes:
      train_rows, test_rows: the rows fitted on and scored on (at most `baseline.max_rows`).
      width: the encoded features' width (one-hot categories included).
      outputs: classes (class ids), labels (multi-hot) or values (regression).
      targets: the task's targets: "class_ids", "multi_hot" or "values".
    """

    train_rows: int
    test_rows: int
    width: int
    outputs: int
    targets: str


def estimated_bytes(data: BaselineData) -> int:
    """The most memory the baselines hold at once (see the module's docstring)."""
    rows, width, outputs = data.train_rows + data.test_rows, data.width, max(data.outputs, 1)
    matrix = 2 * rows * width * 4
    linear = data.train_rows * width * 8 + _LBFGS_COPIES * outputs * (width + 1) * 8
    linear += 3 * data.train_rows * outputs * 8
    boosted = data.train_rows * width + _HISTOGRAM_NODES * width * _HISTOGRAM_BYTES
    boosted += 3 * data.train_rows * outputs * 8
    if data.targets == "multi_hot":  # every label's two fitted models are kept
        boosted += outputs * (_TREES_BYTES + 2 * (width + 1) * 8)
    scored = _SCORED_COPIES * data.test_rows * outputs * 8
    return matrix + max(linear, boosted) + scored


def check_fits(data: BaselineData, *, available: int | None, command: str) -> None:
    """Refuses baselines that would not fit in `available` bytes (None: unknown, not checked).

    Raises:
      ConfigError: one line: the matrix's size, the estimate, what is available, what to do.
    """
    from tfrecipe.reading import human_bytes

    needed = estimated_bytes(data)
    if available is None or needed <= available:
        return
    raise ConfigError(
        f"{command}: the scikit-learn baselines on {data.train_rows:,} training rows of "
        f"{data.width:,} encoded columns with {data.outputs:,} outputs ({data.targets}) need "
        f"about {human_bytes(needed)} of memory, but {human_bytes(available)} is available; "
        "lower baseline.max_rows, or use baseline=none"
    )
