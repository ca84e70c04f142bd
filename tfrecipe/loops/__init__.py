"""Training loops. Each takes built objects (model, distributed datasets, callbacks), never config.

Every loop module (`fit`, `custom`, `parameter_server`) is a `Loop`: the caller picks one by name
and calls it the same way; what a loop alone needs (e.g. fit's data for a run restored mid-epoch)
travels in `LoopOptions`. The loss, metrics, regularization and optimizer variables the loops share
are built in `loops/objective.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the CLI imports tfrecipe without TensorFlow
    import keras

    from tfrecipe.loops.options import LoopOptions


class Loop(Protocol):
    """What `train` calls: a module with these two functions."""

    def run(
        self,
        model: keras.Model,
        train_data: Any,
        validation_data: Any | None,
        *,
        options: LoopOptions,
        callbacks: list[keras.callbacks.Callback],
    ) -> None:
        """Trains `model` from step `options.initial_step` until `options.epochs` are done or a
        callback sets `model.stop_training`, then leaves `model.history` as fit does.

        Args:
          model: compiled (optimizer, one Keras loss object, metric objects) under the strategy's
            scope.
          train_data: endless training data from step `options.initial_step` on, one global
            batch per element (distributed by the strategy).
          validation_data: finite data validated every `options.validation_freq` epochs (its
            loss and metrics as `val_*` logs), or None.
          options: epochs, steps, verbosity and resume data (see `LoopOptions`).
          callbacks: Keras callbacks, driven through their public hooks as fit drives them.
        """

    def evaluate(
        self, model: keras.Model, data: Any, steps: int | None = None, *, objective: Any = None
    ) -> dict[str, float]:
        """The loss and metrics of `model` on `data` (all of it, or `steps` batches): the
        custom loops' are `objective`'s (as `LoopOptions.objective`), fit's the compiled ones."""
