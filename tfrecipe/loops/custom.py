"""`loop=custom`: our own training loop on `strategy.run`, driven like `Model.fit`.

One optimizer step, on each replica (the TensorFlow guide's custom loop):
  forward pass -> per-example loss -> `tf.nn.compute_average_loss` over the examples the step
  really has on all replicas (+ `tf.nn.scale_regularization_loss`) -> `optimizer.scale_loss`
  -> gradients -> `optimizer.apply_gradients` (all-reduce, unscaling, clipping, weight decay,
  learning-rate schedule, `iterations`: the Keras optimizer's own code, as in fit).

How it matches `Model.fit`:
- Training data is one endless iterator; an epoch is `steps_per_epoch` optimizer steps of it.
- `steps_per_loop` steps run in one `tf.function` call; the callbacks' batch hooks run once per
  call, `on_train_batch_begin(first step)` / `on_train_batch_end(last step, logs)`, as fit does
  with `steps_per_execution`. Logs are the metrics' running values over the epoch (`loss` is the
  mean per-example loss so far, as fit's loss tracker gives), validation adds `val_*`.
- `model.stop_training` (EarlyStopping, TerminateOnNaN) ends training after the current call.
- With `model.jit_compile` (Keras' choice on a GPU without a strategy) each step is compiled by
  XLA, as in fit.

Where it deliberately differs:
- An epoch runs exactly `steps_per_epoch` steps; when that is not a multiple of `steps_per_loop`
  the epoch's last call runs fewer steps (fit runs whole executions and so runs extra steps), and
  so does the first call of a run restored off a multiple. Batch-end indices are those of the
  last step or batch actually run. So `steps_per_loop=auto` need not divide the epoch, only the
  step hooks' intervals: a 422-step epoch runs in calls of 10 where fit's auto takes 2.
- With several replicas, a partial global batch (the end of a pass) is averaged over its real
  number of examples; fit averages each replica's own mean.
- Gradient accumulation (`gradient_accumulation_steps` = N): each optimizer step reads N
  micro-batches of one global batch each and averages the loss over all their examples, so the
  update equals one step on an N-times larger batch. `steps_per_epoch`, `steps_per_loop`, the
  batch hooks, `iterations` and the learning-rate schedule all count optimizer steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import graph, optim
from tfrecipe.data.resident import HeldEval, HeldSplit, ResidentIterator, StepReads
from tfrecipe.fault import backup
from tfrecipe.loops import objective as objectives
from tfrecipe.loops import resident_fit
from tfrecipe.loops.objective import Objective
from tfrecipe.loops.options import LoopOptions
from tfrecipe.perf.clock import Reads

Logs = dict[str, Any]
Evaluator = Callable[..., dict[str, float]]


def _global_examples(strategy: tf.distribute.Strategy, micro_batches: Sequence[Any]) -> tf.Tensor:
    """How many examples these micro-batches hold on all replicas together.

    Less than N x the global batch at the end of a pass; the loss is averaged over this number.
    """
    local = strategy.run(
        lambda batches: tf.add_n([tf.shape(batch[1])[0] for batch in batches]),
        args=(micro_batches,),
    )
    return strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None)


def _train_replica_step(
    model: keras.Model,
    objective: Objective,
    micro_batches: Sequence[objectives.Batch],
    global_examples: tf.Tensor,
) -> None:
    """One optimizer step on this replica's share of the step's micro-batches (replica context).

    Each micro-batch's loss is its summed per-example loss over `global_examples`, so the sum over
    micro-batches and (through the optimizer's all-reduce) over replicas is the gradient of the
    mean loss of all the step's examples.
    """

    def reduce(per_example: tf.Tensor, regularization: tf.Tensor) -> tf.Tensor:
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_examples)
        # Regularization counts once per step: split over micro-batches and replicas.
        return loss + tf.nn.scale_regularization_loss(regularization) / len(micro_batches)

    gradients: list[tf.Tensor | None] = []
    for batch in micro_batches:
        # The next micro-batch starts once this one's gradients exist: one set of activations at
        # a time, which is what accumulation is for.
        with tf.control_dependencies([g for g in gradients if g is not None]):
            _, step_gradients = objective.gradients(model, batch, reduce)
        gradients = step_gradients if not gradients else list(map(_add, gradients, step_gradients))
    model.optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))


def _add(a: tf.Tensor | None, b: tf.Tensor | None) -> tf.Tensor | None:
    return b if a is None else a if b is None else a + b


def _own_function(model: keras.Model) -> Callable[[Callable], Callable]:
    """A step as a function of its own, called from the loop around it (inlined into a loop's
    body, a step ran 1.6-1.9x slower: tfrecipe.loops.resident_fit); with `model.jit_compile`
    (Keras turns it on for a model on a GPU without a strategy) XLA compiles it, as in fit, and
    the loop around it stays a plain graph."""
    return lambda step: graph.function(
        step, jit_compile=bool(model.jit_compile), reduce_retracing=True
    )


def _make_train_function(
    model: keras.Model, objective: Objective, options: LoopOptions
) -> Callable[[Any, int], dict[str, tf.Tensor]]:
    """`train(iterator, num_steps) -> metric results`: `num_steps` optimizer steps in one
    `tf.function` call (a graph loop, so Python runs once per call, not once per step; a
    single step without a loop at `steps_per_loop=1`, and in a profiler's window, where xprof
    finds no step inside a loop), each of `gradient_accumulation_steps` micro-batches; with an
    `input_clock`, the reads are stamped in the graph (`Reads.steps`, outside XLA's step). Each
    step's batch is read while the step before it runs."""
    strategy = model.distribute_strategy
    reads, accumulation = Reads(options.input_clock), options.gradient_accumulation_steps

    def replica_step(batches, global_examples):
        _train_replica_step(model, objective, batches, global_examples)

    @_own_function(model)
    def step(batches):
        global_examples = _global_examples(strategy, batches)
        strategy.run(replica_step, args=(batches, global_examples))
        return global_examples  # an output: the end stamp waits for the call, and all it did

    @graph.function  # traced with a tensor (the loop), and None (a step alone)
    def run_steps(iterator, num_steps: tf.Tensor | None):
        reads.steps(StepReads(iterator, accumulation), step, num_steps)
        return objective.results()

    loopless = options.steps_per_loop == 1 or options.call_steps is not None
    compiled: dict[ResidentIterator, Callable | None] = {}  # per held stream, at its first call

    def train(iterator, num_steps: int):
        if isinstance(iterator, ResidentIterator):
            if iterator not in compiled:  # its calls as one XLA program each, or None
                compiled[iterator] = _compiled_calls(model, iterator, step, objective, options)
            if compiled[iterator] is not None:
                return compiled[iterator](tf.constant(num_steps))
        if num_steps == 1 and loopless:
            return run_steps(iterator, None)
        return run_steps(iterator, tf.constant(num_steps))

    return train


def _compiled_calls(
    model: keras.Model, iterator: ResidentIterator, step, objective: Objective, options
) -> Callable | None:
    """`call(num_steps) -> metric results`: the held stream's next steps as one XLA program,
    as fit's (resident_fit.compiles_loop: one batch a step here; its input wait stamped around
    the program, `timed_take`), or None where its calls do not compile whole."""
    accumulates = options.gradient_accumulation_steps > 1
    if accumulates or not resident_fit.compiles_loop(model, iterator.held):
        return None
    steps = resident_fit.compiled_call(
        iterator, lambda batch: step([batch]), options.steps_per_loop, Reads(options.input_clock)
    )

    @graph.function
    def call(num_steps):
        steps(num_steps)
        return objective.results()

    return call


def _test_step(model: keras.Model, objective: Objective) -> Callable[[Any], None]:
    """One evaluation batch on every replica, into `objective`'s metrics."""
    strategy = model.distribute_strategy

    def replica_step(batch):
        objective.test_batch(model, batch)

    @_own_function(model)
    def step(batch):
        strategy.run(replica_step, args=(batch,))

    return step


def _make_test_function(
    step: Callable[[Any], None], objective: Objective
) -> Callable[[Any, tf.Tensor], tuple[tf.Tensor, dict[str, tf.Tensor]]]:
    """`test_steps(iterator, num_steps) -> (batches run, metric results)`: up to `num_steps`
    batches in one call; fewer when the (finite) data ends."""

    @graph.function
    def test_steps(iterator, num_steps):
        def one(batches):  # the next batch, if the data have one: (ended, batches run)
            batch = iterator.get_next_as_optional()
            ran = tf.cond(
                batch.has_value(), lambda: _ran(step(batch.get_value())), lambda: tf.constant(0)
            )
            return ran == 0, batches + ran

        return graph.until(num_steps, one, tf.constant(0)), objective.results()

    return test_steps


def _held_test_function(
    model: keras.Model, step: Callable[[Any], None], objective: Objective, held: HeldSplit
) -> Callable[[], dict[str, tf.Tensor]]:
    """`test_all() -> metric results`: every batch of a held split, in order, in one call (one
    XLA program where the loop compiles whole: resident_fit.evaluation)."""
    evaluation = resident_fit.evaluation(model, held, lambda batch: _ran(step(batch)))

    @graph.function
    def test_all():
        evaluation()
        return objective.results()

    return test_all


def _ran(outputs: Any) -> tf.Tensor:
    """1, once a step's `outputs` (none: its call) are done."""
    done = [t for t in tf.nest.flatten(outputs, expand_composites=True) if t is not None]
    with tf.control_dependencies(done):
        return tf.constant(1)


def _num_batches(data: Any) -> int | None:
    """The number of batches in finite `data`, or None when unknown (as Keras' adapter reads it:
    a tf.data cardinality is a method, a distributed dataset's a value)."""
    cardinality = getattr(data, "cardinality", None)
    if cardinality is None:
        return None
    count = int(cardinality() if callable(cardinality) else cardinality)
    return count if count >= 0 else None


def _evaluator(
    model: keras.Model, make: objectives.MakeObjective, *, steps_per_loop: int
) -> Evaluator:
    """`evaluate(data, *, steps=None, callbacks) -> metrics`, built once (metrics, traced graph)
    and reused for every validation."""
    objective = objectives.build(model, make)
    step = _test_step(model, objective)
    test_steps = _make_test_function(step, objective)
    held: dict[HeldSplit, Callable] = {}  # a held split's one-call evaluation, traced once

    def evaluate(
        data: Any, *, steps: int | None = None, callbacks: keras.callbacks.CallbackList
    ) -> dict[str, float]:
        objective.reset()
        model.stop_evaluating = False
        callbacks.on_test_begin()
        if isinstance(data, HeldEval):  # the whole split in one call (`steps` does not apply)
            if data.held not in held:
                held[data.held] = _held_test_function(model, step, objective, data.held)
            callbacks.on_test_batch_begin(0)
            callbacks.on_test_batch_end(data.num_batches - 1, held[data.held]())
        else:
            _evaluate_stream(model, test_steps, data, steps, callbacks, steps_per_loop)
        results = objective.float_results()
        callbacks.on_test_end(results)
        return results

    return evaluate


def _evaluate_stream(
    model: keras.Model,
    test_steps: Callable,
    data: Any,
    steps: int | None,
    callbacks: keras.callbacks.CallbackList,
    steps_per_loop: int,
) -> None:
    """`data`'s batches (all, or `steps`), `steps_per_loop` per call, batch hooks around each."""
    total = steps or _num_batches(data)
    iterator, batch = iter(data), 0
    while total is None or batch < total:
        num_steps = steps_per_loop if total is None else min(steps_per_loop, total - batch)
        callbacks.on_test_batch_begin(batch)
        ran, logs = test_steps(iterator, tf.constant(num_steps))
        ran = int(ran)
        if ran == 0:  # data of unknown length ended with the previous call (fit alike)
            break
        batch += ran
        callbacks.on_test_batch_end(batch - 1, logs)
        if ran < num_steps or model.stop_evaluating:
            break


def evaluate(
    model: keras.Model, data: Any, steps: int | None = None, *, objective: Any = None
) -> dict[str, float]:
    """`objective`'s loss and metrics of `model` on `data` (all of it, or `steps` batches)."""
    callbacks = keras.callbacks.CallbackList([], model=model)
    make = objectives.required(objective, "custom")
    return _evaluator(model, make, steps_per_loop=1)(data, steps=steps, callbacks=callbacks)


def _train_epoch(
    model: keras.Model,
    train_steps: Callable[[Any, int], dict[str, tf.Tensor]],
    iterator: Any,
    callbacks: keras.callbacks.CallbackList,
    options: LoopOptions,
    start: int = 0,
) -> None:
    """`options.steps_per_epoch` steps (from step `start` of a restored epoch), batch hooks around
    each call. Calls end where the epoch's multiples of `steps_per_loop` do (there the step
    hooks fire, as in an epoch run from its start) and at the epoch's end, and where
    `options.call_steps` shortens them (a profiler's window)."""
    first, per_call = start, options.steps_per_loop
    while first < options.steps_per_epoch:
        num_steps = min(per_call - first % per_call, options.steps_per_epoch - first)
        if options.call_steps is not None:
            num_steps = options.call_steps(num_steps)
        callbacks.on_train_batch_begin(first)
        logs = train_steps(iterator, num_steps)
        first += num_steps
        callbacks.on_train_batch_end(first - 1, logs)
        if model.stop_training:
            break


def callback_list(
    callbacks: Sequence[keras.callbacks.Callback], model: keras.Model, options: LoopOptions
) -> keras.callbacks.CallbackList:
    """The run's callbacks with a History, and a progress bar unless `options.verbose` is 0
    (fit's list, for a loop that runs fit's epochs itself: this one, epoch_groups')."""
    return keras.callbacks.CallbackList(
        callbacks,
        add_history=True,
        add_progbar=options.verbose != 0,
        verbose=options.verbose,
        epochs=options.epochs,
        steps=options.steps_per_epoch,
        model=model,
    )


def run(
    model: keras.Model, train_data, validation_data, *, options: LoopOptions, callbacks
) -> None:
    """`Loop.run` on `strategy.run` (see the module docstring): distributed data, one global batch
    per element, validation data finite; `options.gradient_accumulation_steps` micro-batches per
    optimizer step and `options.steps_per_loop` steps per `tf.function` call."""
    make = objectives.required(options.objective, "custom")
    optim.build_optimizer_variables(model)
    objective = objectives.build(model, make)
    backup.training_metrics(model, (objective.loss, *objective.metrics))  # backed up mid-epoch
    train_steps = _make_train_function(model, objective, options)
    validate = None
    if validation_data is not None:
        validate = _evaluator(model, make, steps_per_loop=options.steps_per_loop)
    callbacks = callback_list(callbacks, model, options)
    model.stop_training = False
    iterator = iter(train_data)  # one iterator for the whole run: epochs continue the stream
    callbacks.on_train_begin()
    training_logs = None
    # A restored run continues mid-epoch; `train_data` already starts at that step.
    start_epoch, start = divmod(options.initial_step, options.steps_per_epoch)
    for epoch in range(start_epoch, options.epochs):
        objective.reset()
        callbacks.on_epoch_begin(epoch)
        _train_epoch(model, train_steps, iterator, callbacks, options, start)
        start = 0
        epoch_logs: Logs = objective.float_results()
        if validate and (epoch + 1) % options.validation_freq == 0:
            val_logs = validate(validation_data, callbacks=callbacks)
            epoch_logs |= {f"val_{name}": value for name, value in val_logs.items()}
        callbacks.on_epoch_end(epoch, epoch_logs)
        training_logs = epoch_logs
        if model.stop_training:
            break
    if options.epochs > start_epoch:
        model.optimizer.finalize_variable_values(model.trainable_variables)  # e.g. EMA weights
    callbacks.on_train_end(logs=training_logs)
