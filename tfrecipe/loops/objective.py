"""What the loops optimize and report, in one place: the task's loss per example, the metrics,
the regularization loss, one step's gradients, and the optimizer's variables.

`loop=custom` and the parameter-server loop differ only in how a step's per-example losses are
averaged (over the global batch on all replicas, or over one worker's own batch) and in how steps
are driven; `loop=fit` uses Keras' own objective, but shares `optim.build_optimizer_variables`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from tfrecipe import compat

# () -> (one Keras Loss object, new metric objects): what a loop optimizes and reports (the
# task's: tfrecipe.models.build.objective), made afresh for each use.
MakeObjective = Callable[[], tuple[keras.losses.Loss, Sequence[keras.metrics.Metric]]]
# (per-example losses, regularization loss) -> the loss this replica differentiates.
Reduction = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
# (features, labels) or (features, labels, sample weights): one batch as the data give it.
Batch = tuple[tf.Tensor, ...]


def unpack(batch: Batch) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor | None]:
    """(features, labels, sample weights or None) of a batch."""
    features, labels, *weights = batch
    return features, labels, (weights[0] if weights else None)


def weighted(per_example: tf.Tensor, weights: tf.Tensor | None) -> tf.Tensor:
    """Each example's loss times its sample weight (class weights arrive this way). Averaged
    over the examples, not over the weights, it is Keras' `sum_over_batch_size` with
    `sample_weight` (fit's loss): sum(loss x w) / examples."""
    return per_example if weights is None else per_example * tf.cast(weights, per_example.dtype)


@dataclasses.dataclass(frozen=True)
class Objective:
    """The compiled loss, unreduced (one value per example), and fresh metric objects.

    Made under the model's strategy scope (`build(model)`), each replica updates its own copy of
    the metric variables and reading a result sums the copies.
    """

    per_example_loss: keras.losses.Loss
    loss: keras.metrics.Mean
    metrics: tuple[keras.metrics.Metric, ...]

    def update(self, labels: tf.Tensor, logits: tf.Tensor, losses: tf.Tensor) -> None:
        self.loss.update_state(losses)  # a vector: the mean over examples, as fit's tracker
        for metric in self.metrics:
            metric.update_state(labels, logits)

    def results(self) -> dict[str, tf.Tensor]:
        return {metric.name: metric.result() for metric in (self.loss, *self.metrics)}

    def float_results(self) -> dict[str, float]:
        return {name: float(value) for name, value in self.results().items()}

    def reset(self) -> None:
        for metric in (self.loss, *self.metrics):
            metric.reset_state()

    def gradients(
        self, model: keras.Model, batch: Batch, reduce: Reduction
    ) -> tuple[tf.Tensor, list[tf.Tensor | None]]:
        """This replica's loss on one batch and its gradients (of the loss times the optimizer's
        loss scale, which `apply_gradients` divides out); updates the metrics (replica context).
        The batch's sample weights (if any) weigh the loss, not the metrics (as in fit)."""
        features, labels, weights = unpack(batch)
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            per_example = weighted(self.per_example_loss(labels, logits), weights)
            regularization = regularization_loss(model)
            loss = reduce(per_example, regularization)
            scaled_loss = model.optimizer.scale_loss(loss)  # dynamic loss scale for float16
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        self.update(labels, logits, per_example + regularization)
        return loss, gradients

    def test_batch(self, model: keras.Model, batch: Batch) -> None:
        """Updates the metrics with one batch in inference mode (the loss as in training)."""
        features, labels, weights = unpack(batch)
        logits = model(features, training=False)
        per_example = weighted(self.per_example_loss(labels, logits), weights)
        self.update(labels, logits, per_example + regularization_loss(model))


def build(model: keras.Model, make: MakeObjective, *, distributed: bool = True) -> Objective:
    """The loss and fresh metrics `make` gives (the task's: those the model was compiled with),
    as the loops use them.

    Args:
      make: `make() -> (loss, metrics)`: one Keras Loss object and new metric objects.
      distributed: make the metric variables under the strategy's scope (replicas or workers
        update them); False for metrics only the coordinator updates.
    """
    scope = model.distribute_strategy.scope() if distributed else contextlib.nullcontext()
    with scope:
        loss, metrics = make()
        metrics = tuple(metrics)
        for metric in metrics:
            compat.build_metric(metric, model.output_shape)
        return Objective(
            per_example_loss=_unreduced(loss),
            loss=keras.metrics.Mean(name="loss"),
            metrics=metrics,
        )


def required(make: MakeObjective | None, loop: str) -> MakeObjective:
    """`make`, which `loop` needs (fit takes the compiled model's own)."""
    if make is None:
        raise ValueError(
            f"loop={loop}: pass the objective it optimizes (LoopOptions.objective, "
            "evaluate(objective=...)), e.g. tfrecipe.models.build.objective(task)"
        )
    return make


def _unreduced(loss: keras.losses.Loss) -> keras.losses.Loss:
    """The loss per example (reduction none), set on the object rather than passed to its
    constructor: a user's loss class need not take `reduction`."""
    loss.reduction = None
    return loss


def regularization_loss(model: keras.Model) -> tf.Tensor:
    """The model's regularization losses from its last call, summed in float32 (0 without any;
    a float16 activity regularizer joins the float32 weight regularizers)."""
    losses = [tf.cast(tf.reduce_sum(loss), tf.float32) for loss in model.losses]
    return tf.add_n(losses) if losses else tf.constant(0.0)
