"""`loop=fit`: Keras `Model.fit` on the strategy's distributed datasets.

A restored run may continue mid-epoch, which `fit` cannot do (`initial_epoch` starts at an epoch
boundary): it runs the rest of the interrupted epoch as one short `fit` (steps_per_epoch = the
steps left), then the remaining epochs as a second `fit` on the data from the next epoch's first
step. The callbacks see one training run: one `on_train_begin`, one `on_train_end`, epochs
numbered as in an uninterrupted run (batch indices of the short epoch count from 0).

Gradient accumulation (`loop.gradient_accumulation_steps` = N, the custom loop's key): the
optimizer averages N micro-batches' gradients per update (Keras' `gradient_accumulation_steps`,
built in `optim.build_optimizer`), `fit` runs N micro-batches per step of `steps_per_epoch`, and
the callbacks see optimizer steps (`OptimizerSteps`): a batch hook at each update, numbered by
updates, so backups, step logs and throughput count what the custom loop counts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import tensorflow as tf

from tfrecipe.compat import fix_fit_under_strategy
from tfrecipe.loops import epoch_groups, resident_fit
from tfrecipe.loops.options import LoopOptions
from tfrecipe.perf.clock import time_train_step


def run(
    model: keras.Model, train_data, validation_data, *, options: LoopOptions, callbacks
) -> None:
    """`Loop.run` with `Model.fit` (a run restored mid-epoch needs `options.train_data_from`)."""
    # Under a strategy Keras would build the model from a throwaway iterator and train on a
    # second one (another order: the training data reshuffle on every iteration), and weigh a
    # short batch's examples unequally when the replicas split it unevenly.
    fix_fit_under_strategy(model)
    if options.input_clock is not None:
        time_train_step(model, options.input_clock)  # before fit traces the step
    accumulate = options.gradient_accumulation_steps
    if accumulate > 1:
        callbacks = [OptimizerSteps(callbacks, model, accumulate)]
    start_epoch, start = divmod(options.initial_step, options.steps_per_epoch)
    if start == 0:
        _fit(model, train_data, validation_data, options, callbacks, start_epoch, options.epochs)
        return
    if options.train_data_from is None:
        raise ValueError("loop=fit: continuing mid-epoch needs LoopOptions.train_data_from")
    relay = OneTrainingRun(callbacks, model, last=start_epoch + 1 >= options.epochs)
    rest = dataclasses.replace(options, steps_per_epoch=options.steps_per_epoch - start)
    _fit(model, train_data, validation_data, rest, [relay], start_epoch, start_epoch + 1)
    if relay.last:
        return
    if model.stop_training:  # e.g. TerminateOnNaN or early stopping in the short epoch
        relay.end()
        return
    relay.last = True
    next_data = options.train_data_from((start_epoch + 1) * options.steps_per_epoch)
    _fit(model, next_data, validation_data, options, [relay], start_epoch + 1, options.epochs)


def _fit(model, data, validation_data, options: LoopOptions, callbacks, initial_epoch, epochs):
    grouped = {"options": options, "callbacks": callbacks, "epochs": (initial_epoch, epochs)}
    if epoch_groups.fit(model, data, validation_data, **grouped):
        return  # a held split's short epochs, several in one call
    data, detach = resident_fit.attach(model, data)  # a held split: fit runs its steps in-graph
    validation_data, detach_validation = resident_fit.attach_evaluation(model, validation_data)
    try:
        _fit_data(model, data, validation_data, options, callbacks, initial_epoch, epochs)
    finally:
        detach()
        detach_validation()


def _fit_data(model, data, validation_data, options: LoopOptions, callbacks, initial_epoch, epochs):
    model.fit(
        data,
        validation_data=validation_data,
        initial_epoch=initial_epoch,
        epochs=epochs,
        # micro-batches: N per optimizer step with gradient accumulation
        steps_per_epoch=options.steps_per_epoch * options.gradient_accumulation_steps,
        validation_freq=options.validation_freq,
        callbacks=callbacks,
        verbose=options.verbose,
        shuffle=False,  # the dataset shuffles itself (seeded)
    )


class _Relay(keras.callbacks.Callback):
    """Passes every hook on to `callbacks` (subclasses change some)."""

    def __init__(self, callbacks: list[keras.callbacks.Callback], model):
        super().__init__()
        self.inner = keras.callbacks.CallbackList(callbacks, model=model)

    def set_model(self, model):
        super().set_model(model)
        self.inner.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.inner.set_params(params)

    def on_train_begin(self, logs=None):
        self.inner.on_train_begin(logs)

    def on_train_end(self, logs=None):
        self.inner.on_train_end(logs)

    def on_epoch_begin(self, epoch, logs=None):
        self.inner.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self.inner.on_epoch_end(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self.inner.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self.inner.on_train_batch_end(batch, logs)

    def on_test_begin(self, logs=None):
        self.inner.on_test_begin(logs)

    def on_test_end(self, logs=None):
        self.inner.on_test_end(logs)

    def on_test_batch_begin(self, batch, logs=None):
        self.inner.on_test_batch_begin(batch, logs)

    def on_test_batch_end(self, batch, logs=None):
        self.inner.on_test_batch_end(batch, logs)


class OptimizerSteps(_Relay):
    """`fit` with gradient accumulation counts micro-batches; `callbacks` see optimizer steps:
    batch hooks at update boundaries only (every call ends on one: `training.model.pace`), numbered by
    updates, and `params["steps"]` in updates."""

    def __init__(self, callbacks, model, accumulate: int):
        super().__init__(callbacks, model)
        self.accumulate = accumulate

    def set_params(self, params):
        steps = params.get("steps")
        super().set_params(
            params if steps is None else {**params, "steps": steps // self.accumulate}
        )

    def on_train_batch_begin(self, batch, logs=None):
        if batch % self.accumulate == 0:
            self.inner.on_train_batch_begin(batch // self.accumulate, logs)

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.accumulate == 0:
            self.inner.on_train_batch_end((batch + 1) // self.accumulate - 1, logs)


class OneTrainingRun(_Relay):
    """Relays every hook of several `fit` calls to `callbacks`, except that they see only the
    first `on_train_begin` and the `on_train_end` of the call marked `last`."""

    def __init__(self, callbacks: list[keras.callbacks.Callback], model, *, last: bool):
        super().__init__(callbacks, model)
        self.last = last
        self._begun = False

    def on_train_begin(self, logs=None):
        if not self._begun:
            self._begun = True
            self.inner.on_train_begin(logs)

    def on_train_end(self, logs=None):
        if self.last:
            self.inner.on_train_end(logs)

    def end(self) -> None:
        self.inner.on_train_end(None)


def evaluate(
    model: keras.Model,
    data: tf.distribute.DistributedDataset,
    steps: int | None = None,
    *,
    objective: Any = None,
) -> dict[str, float]:
    """The compiled loss and metrics of `model` on `data` (all of it, or `steps` batches);
    fit's objective is the compiled one (`objective` is for the custom loops)."""
    data, detach = resident_fit.attach_evaluation(model, data)  # a held split: in one call
    try:
        results = model.evaluate(data, steps=steps, verbose=0, return_dict=True)
    finally:
        detach()
    return {name: float(value) for name, value in results.items()}
