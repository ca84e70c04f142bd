"""`loop=custom` under `strategy=parameter_server`: ClusterCoordinator schedule/join.

The coordinator (this process, the chief) schedules `steps_per_epoch` training steps per epoch as
closures on whichever worker is free; each worker reads its own copy of the training data
(`create_per_worker_dataset`), trains its own share of that stream (every n-th batch: `own_batch`)
and updates the variables on the parameter servers asynchronously.
`join()` ends the epoch. Validation and test run inline on the coordinator, over the whole
(plain, batched) dataset, so they are exact.

Step counts: Keras 3's `optimizer.iterations` lost increments under parameter servers (measured:
60 scheduled steps counted 52; the workers' read-then-write `assign_add`s interleave, which
`compat.fix_shared_variable_increments` now makes atomic). This loop still counts the steps
whose closures finished and writes that count back into `optimizer.iterations` after every epoch,
so the run's `steps_completed`, checkpoints and learning-rate schedule agree with it whatever the
variable says.

Callbacks see one batch per epoch (the scheduled steps run asynchronously on the workers):
`on_train_batch_begin(0)` before scheduling, `on_train_batch_end(steps - 1, logs)` after join.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import graph, optim
from tfrecipe.loops import objective as objectives
from tfrecipe.loops.objective import Objective
from tfrecipe.loops.options import LoopOptions


def own_batch(iterator, workers: int):
    """This worker's next batch of the training stream.

    `create_per_worker_dataset` gives every worker its own copy of one seeded stream: read
    plainly, all workers train the same batches, each one once per worker and nearly at once
    (measured: 12 steps on 2 workers trained 6 batches, each twice). Each worker instead reads
    `workers` batches per step and keeps the one at its index, so worker i trains batches
    i, i + n, i + 2n, ... of the stream and a step trains a batch no other step trains.
    """
    batches = [next(iterator) for _ in range(workers)]
    if workers == 1:
        return batches[0]
    index = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int32)
    return tf.switch_case(index, [functools.partial(_identity, batch) for batch in batches])


def _identity(batch):
    return batch


def connected_workers() -> int:
    """The worker tasks the coordinator is connected to (under parameter servers, TF 2.21's
    `strategy.cluster_resolver` is None: the strategy keeps its resolver privately)."""
    devices = tf.config.list_logical_devices()
    return max(1, len({d.name.split("/device:")[0] for d in devices if "/job:worker/" in d.name}))


def _make_train_step(
    model: keras.Model, objective: Objective
) -> tf.types.experimental.GenericFunction:
    strategy = model.distribute_strategy
    workers = connected_workers()

    def reduce(per_example: tf.Tensor, regularization: tf.Tensor) -> tf.Tensor:
        # Asynchronous training: each step is one worker's own batch, averaged over its
        # examples (there is no all-reduce to divide by the replicas).
        return tf.reduce_mean(per_example) + regularization

    def replica_step(batch):
        loss, gradients = objective.gradients(model, batch, reduce)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @graph.function
    def train_step(iterator):
        return strategy.run(replica_step, args=(own_batch(iterator, workers),))

    @graph.function
    def fed_step(batch):
        return strategy.run(replica_step, args=(batch,))

    return train_step, fed_step


def _scheduler(coordinator, model, objective, train_data):
    """A function that schedules one training step on whichever worker is free. Each worker
    reads its own copy of the data (`create_per_worker_dataset`), except for a plain dataset
    (a streamed table, read by Python, which a worker's tf.data graph cannot call): the
    coordinator reads it and sends each step its batch, so every batch trains once."""
    train_step, fed_step = _make_train_step(model, objective)
    if isinstance(train_data, tf.data.Dataset):
        batches = iter(train_data)
        return lambda: coordinator.schedule(fed_step, args=(next(batches),))
    iterator = iter(coordinator.create_per_worker_dataset(train_data))
    return lambda: coordinator.schedule(train_step, args=(iterator,))


def _train_epoch(coordinator, schedule, steps: int) -> int:
    """Schedules `steps` steps, waits for all; returns how many finished (join raises if one
    failed for good; a step lost with a worker is retried by the coordinator)."""
    results = [schedule() for _ in range(steps)]
    coordinator.join()
    return sum(1 for result in results if result.fetch() is not None)


def run(
    model: keras.Model, train_data, validation_data, *, options: LoopOptions, callbacks
) -> None:
    """`Loop.run` with a ClusterCoordinator (model compiled under a ParameterServerStrategy
    scope): training data distributed by the strategy, validation data a plain batched dataset
    (evaluated on the coordinator); the callbacks see one batch per epoch (module docstring)."""
    make = objectives.required(options.objective, "custom on parameter servers")
    coordinator = tf.distribute.coordinator.ClusterCoordinator(model.distribute_strategy)
    optim.build_optimizer_variables(model)
    objective = objectives.build(model, make)
    schedule = _scheduler(coordinator, model, objective, train_data)
    callbacks = keras.callbacks.CallbackList(
        callbacks, add_history=True, add_progbar=False, epochs=options.epochs, model=model
    )
    model.stop_training = False
    # A restored run: backups under parameter servers are taken at epoch ends only.
    steps_done = options.initial_step
    callbacks.on_train_begin()
    logs: dict[str, float] = {}
    for epoch in range(options.initial_step // options.steps_per_epoch, options.epochs):
        objective.reset()
        callbacks.on_epoch_begin(epoch)
        callbacks.on_train_batch_begin(0)
        steps_done += _train_epoch(coordinator, schedule, options.steps_per_epoch)
        model.optimizer.iterations.assign(steps_done)  # the exact count (see the docstring)
        logs = objective.float_results()
        callbacks.on_train_batch_end(options.steps_per_epoch - 1, logs)
        if validation_data is not None and (epoch + 1) % options.validation_freq == 0:
            logs |= {
                f"val_{k}": v for k, v in evaluate(model, validation_data, objective=make).items()
            }
        callbacks.on_epoch_end(epoch, logs)
        if options.verbose:
            print(f"epoch {epoch + 1}/{options.epochs}: {_format(logs)}", flush=True)
        if model.stop_training:
            break
    callbacks.on_train_end(logs=logs)


def evaluate(
    model: keras.Model, data: tf.data.Dataset, steps: int | None = None, *, objective: Any = None
) -> dict[str, Any]:
    """`objective`'s loss and metrics on `data`, computed inline on the coordinator."""
    evaluator = _EVALUATORS.get(model)
    if evaluator is None:
        make = objectives.required(objective, "custom on parameter servers")
        evaluator = _EVALUATORS[model] = _Evaluator(model, make)
    return evaluator(data.take(steps) if steps else data)


class _Evaluator:
    """The compiled loss and metrics (on the coordinator's own variables), with one traced step."""

    def __init__(self, model: keras.Model, make: objectives.MakeObjective):
        self.objective = objectives.build(model, make, distributed=False)
        self.model = weakref.ref(model)  # the cache must not keep the model alive
        self.step = graph.function(self._step, reduce_retracing=True)

    def _step(self, batch):
        self.objective.test_batch(self.model(), batch)

    def __call__(self, data: tf.data.Dataset) -> dict[str, float]:
        self.objective.reset()
        for batch in data:
            self.step(batch)
        return self.objective.float_results()


_EVALUATORS: weakref.WeakKeyDictionary[keras.Model, _Evaluator] = weakref.WeakKeyDictionary()


def _format(logs: dict[str, float]) -> str:
    return " - ".join(f"{name}: {value:.4f}" for name, value in logs.items())
