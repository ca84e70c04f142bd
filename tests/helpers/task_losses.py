"""A user's own loss and metric classes, named by `_target_` under `allowed_targets`
(tests/test_task_options.py). The loss's constructor takes no `reduction`, as a user's may not:
the custom loop must still get its per-example form."""

from __future__ import annotations

import keras


class ScaledSquaredError(keras.losses.Loss):
    """`factor` x the squared error, averaged over each example's outputs."""

    def __init__(self, factor: float = 1.0, name: str = "scaled_squared_error"):
        super().__init__(name=name)
        self.factor = factor

    def call(self, y_true, y_pred):
        y_true = keras.ops.cast(keras.ops.reshape(y_true, keras.ops.shape(y_pred)), y_pred.dtype)
        return self.factor * keras.ops.mean(keras.ops.square(y_pred - y_true), axis=-1)

    def get_config(self):
        return {"name": self.name, "factor": self.factor}


class MaxAbsoluteError(keras.metrics.Metric):
    """The largest absolute error seen (a metric of the user's own)."""

    def __init__(self, name: str = "max_absolute_error", **kwargs):
        super().__init__(name=name, **kwargs)
        self.largest = self.add_variable(shape=(), initializer="zeros", name="largest")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = keras.ops.cast(keras.ops.reshape(y_true, keras.ops.shape(y_pred)), "float32")
        error = keras.ops.max(keras.ops.abs(keras.ops.cast(y_pred, "float32") - y_true))
        self.largest.assign(keras.ops.maximum(self.largest, error))

    def result(self):
        # A new tensor, not the variable (nor a view of it): fit reads the training logs only
        # after validation has updated the metric.
        return self.largest * 1.0
