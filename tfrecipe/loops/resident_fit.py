"""`Model.fit` on a resident training split (tfrecipe.data.resident): one call, one graph loop.

Keras' TF trainer calls its iterator's `get_next` once per step, also inside a
`steps_per_execution` loop, and the Python around each call costs as much as a small model's
step. With a held split fit gets a stand-in dataset (the stream's first batch, repeated: fit
builds from its spec and never reads it) and `model.train_function` is ours: each call runs
`model.steps_per_execution` steps of Keras' own `model.train_step` (the clocked one, where the
input clock wraps it) in a graph loop, each on the next batch gathered from the held split
in the graph. Everything else is fit's: epochs, callbacks at each call's edges, metrics, logs,
validation; the step counter the gather reads is the stream's (`ResidentTrain.start`: a restored
run continues at its step).

A held evaluation split (`HeldEval`: validation, test) is evaluated the same way: `evaluate` (and
fit's validation) gets a one-batch stand-in, and `model.test_function` runs Keras' own
`model.test_step` on every batch of the split in order in one graph loop: one call, every
example once, the last batch short; the metrics' states sum as the streamed batches' do.

Where the model compiles with XLA on one device (`compiles_loop`), a call is one XLA program:
its steps and their gathers, or the whole evaluation (docs/performance.md, "XLA around a held
loop").
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import graph
from tfrecipe.data.resident import HeldEval, HeldSplit, ResidentIterator, ResidentTrain, StepReads
from tfrecipe.perf.clock import Reads


def attach(model: keras.Model, data: Any) -> tuple[Any, Callable[[], None]]:
    """(what fit is given, `detach`): for resident `data` a stand-in dataset, with
    `model.train_function` running the held split's steps until `detach()`; other data as
    they are."""
    if not isinstance(data, ResidentTrain):
        return data, lambda: None
    model.train_function = _train_function(model, iter(data))
    stand_in = tf.data.Dataset.from_tensors(data.first_batch()).repeat()

    def detach() -> None:
        model.train_function = None  # another fit (streamed, or a new stream) traces its own

    return stand_in, detach


def attach_evaluation(model: keras.Model, data: Any) -> tuple[Any, Callable[[], None]]:
    """(what `evaluate` is given, `detach`): for a held evaluation split a one-batch stand-in,
    with `model.test_function` evaluating the whole split in one call until `detach()`; other
    data as they are."""
    if not isinstance(data, HeldEval):
        return data, lambda: None
    model.test_function = _test_function(model, data.held)
    stand_in = tf.data.Dataset.from_tensors(data.first_batch())

    def detach() -> None:
        model.test_function = None  # another evaluation (streamed, another split) traces its own

    return stand_in, detach


def _test_function(model: keras.Model, held: HeldSplit) -> Callable[[Any], Any]:
    """`evaluate`'s `test_function(iterator)`: `model.test_step` on each batch of `held` in
    order (the stand-in's iterator is not read), the last step's logs (evaluate reads the
    metrics' totals after it)."""
    evaluate_all = graph.function(evaluation(model, held, test_step(model)))
    return lambda _unused_iterator: evaluate_all()


def in_order(held: HeldSplit, step: Callable[[Any], Any]) -> Any:
    """In a graph: `step` on every batch of `held` in order, in a loop (none for 1 batch: an
    empty loop cost 0.2 ms a call on wine); the last batch's outputs. The step is traced once,
    and called at one site (`graph.blank_outputs`; `batch_in_order`: batch 0's size is as open as
    the loop's where the last is short)."""
    first = held.batch_in_order(tf.constant(0))
    if held.layout.steps_per_pass == 1:
        return step(first)
    return graph.repeat(
        held.layout.steps_per_pass,
        lambda index, _: step(held.batch_in_order(index)),
        graph.blank_outputs(step, first),
    )


# Per model, its evaluation step (Keras' test_step on every replica) and the loss tracker of
# the compile it was made for, traced once: the test split's evaluation then reuses the
# validation's trace. A compile makes new metrics (fine-tuning's second phase recompiles): a
# trace of the old ones would read deleted variables.
_TEST_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def test_step(model: keras.Model) -> Callable[[Any], Any]:
    """`model.test_step` on each replica's share of a batch, the logs' mean over replicas."""
    compiled = getattr(model, "_loss_tracker", None)  # Keras' Trainer.compile makes a new one
    if model not in _TEST_STEPS or _TEST_STEPS[model][0] is not compiled:
        _TEST_STEPS[model] = (compiled, on_replicas(model, model.test_step))
    return _TEST_STEPS[model][1]


def on_replicas(model: keras.Model, step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`step` on each replica's share of a batch, the logs' mean over replicas: a function of
    its own, as fit's (a step inlined into a loop's body ran 1.6-1.9x slower)."""
    strategy = model.distribute_strategy

    def one_step(batch):
        outputs = strategy.run(step, args=(batch,))
        return tf.nest.map_structure(lambda value: _mean_over_replicas(value, strategy), outputs)

    return graph.function(one_step, jit_compile=bool(model.jit_compile), reduce_retracing=True)


def _train_function(model: keras.Model, iterator: ResidentIterator) -> Callable[[Any], Any]:
    """fit's `train_function(iterator)`: `model.steps_per_execution` steps on `iterator`'s
    batches (fit's own iterator, the stand-in's, is not read), the last step's logs. Each batch
    is gathered while the step before it runs (`Reads.steps`): the held split is read-only, and
    a call moves the stream's counter past its batches at once."""
    steps = int(model.steps_per_execution)
    train_steps, build = held_loop(model, iterator)

    @graph.function
    def run_steps(count):  # every step inside the loop: one beside it cost 6 ms a call (tables)
        return train_steps(count)

    def train_function(_unused_iterator):
        if not run_steps.experimental_get_tracing_count():
            build()
        return run_steps(tf.constant(steps))

    train_function.traces = run_steps.experimental_get_tracing_count  # the loop's, for tests
    return train_function


def compiles_loop(model: keras.Model, held: HeldSplit) -> bool:
    """Whether `model`'s loops on `held` are one XLA program a call (`HeldSplit.compiles_whole`:
    `batching.jit_compile`, or Keras' `auto` on an accelerator). docs/performance.md, "XLA
    around a held loop"."""
    return bool(model.jit_compile) and held.compiles_whole(convolves=_convolves(model))


def _convolves(layer: keras.layers.Layer) -> bool:
    """Whether `layer` or a layer inside it is a convolution (Conv1D-3D, their transposes,
    separable and depthwise ones)."""
    if "Conv" in type(layer).__name__:
        return True
    return any(_convolves(inner) for inner in getattr(layer, "layers", ()))


def held_loop(
    model: keras.Model, iterator: ResidentIterator
) -> tuple[Callable[[Any], Any], Callable[[], None]]:
    """(`steps(count)`, `build()`): in a graph, the stream's next `count` steps of Keras'
    `train_step`, the last step's logs (`Reads.steps`, or one XLA program where
    `compiles_loop`); `build()` builds the metrics before the loop's first trace."""
    reads, read, one_step = held_steps(model, iterator)

    def build() -> None:
        build_metrics(iterator.held, one_step)

    if not compiles_loop(model, iterator.held):
        return (lambda count: reads.steps(read, one_step, count)), build
    return compiled_call(iterator, one_step, int(model.steps_per_execution), reads), build


def compiled_call(
    iterator: ResidentIterator, one_step: Callable, most: int, reads: Reads
) -> Callable:
    """`steps(count)` for a `count` up to `most`, in a graph: the stream's next `count` steps
    of `one_step` as one XLA program (`compiled_steps`), the last step's outputs; its input
    wait stamped by `reads` (`timed_take`)."""
    body = compiled_steps(iterator.held, one_step)
    loop = graph.function(lambda cut, count: body(cut, 0, count), jit_compile=True)
    return lambda count: loop(timed_take(reads, iterator, count, most), count)


def timed_take(reads: Reads, iterator: ResidentIterator, count: Any, most: int) -> tuple:
    """`take`, its time added to `reads`' input wait: an XLA program has no clock op, and it
    waits for its batches' orders, drawn before it (no XLA kernel shuffles); its gathers run
    inside it, beside its steps, as a plain loop's reads ahead do (`Reads.steps`)."""
    began = reads.now()
    cut = take(iterator, count, most)
    reads.waited(reads.now(after=cut), began)
    return cut


def take(iterator: ResidentIterator, count: Any, most: int) -> tuple[tf.Tensor, ...]:
    """The cut (`HeldSplit.cut`) of the stream's next `most` micro-batches at shapes that
    do not change (one XLA program), the counter moved past `count` of them."""
    count = tf.cast(count, tf.int64)
    # past `most`, XLA would clamp the slices: the same rows again, silently
    checked = tf.debugging.assert_less_equal(count, tf.constant(most, tf.int64))
    with tf.control_dependencies([checked]):
        start = iterator.position.assign_add(count) - count
    return iterator.held.cut(start, most, static=True)


def compiled_steps(held: HeldSplit, one_step: Callable) -> Callable[..., Any]:
    """`steps(cut, first, count)`, inside an XLA program: `one_step` on micro-batches `first`
    to `first + count` of `cut` (`HeldSplit.cut`: the passes' orders are drawn before the
    program, their shuffle has no XLA kernel), each step's rows a slice of them at a size the
    program knows (a pass's short last batch in a branch of its own); the last step's logs."""
    whole, last = held.layout.global_batch, held.last_batch

    def steps(cut, first, count):
        orders, begins, short = cut

        def one(index):
            def step(size):
                return lambda: one_step(held.rows(tf.slice(orders, [begins[index]], [size])))

            if last == whole:
                return step(whole)()
            return tf.cond(short[index], step(last), step(whole))

        first = tf.cast(first, tf.int32)
        return graph.repeat(count - 1, lambda index, _: one(first + index + 1), one(first))

    return steps


def evaluation(model: keras.Model, held: HeldSplit, step: Callable[[Any], Any]) -> Callable:
    """`evaluate()`, in a graph: `step` on every batch of `held` in order (`in_order`), as one
    XLA program where `compiles_loop` (`compiled_in_order`); the last batch's outputs."""
    if not compiles_loop(model, held):
        return lambda: in_order(held, step)
    return graph.function(lambda: compiled_in_order(held, step), jit_compile=True)


def compiled_in_order(held: HeldSplit, step: Callable[[Any], Any]) -> Any:
    """`in_order` inside an XLA program: each batch's rows a range at a size it knows, the
    last batch's (short) its own."""
    whole, last, count = held.layout.global_batch, held.last_batch, held.layout.steps_per_pass

    def batch(first, size):
        return held.rows(first + tf.range(size))

    if count > 1:
        outputs = step(batch(0, whole))
        graph.repeat(count - 2, lambda index, _: step(batch((index + 1) * whole, whole)), outputs)
    return step(batch((count - 1) * whole, last))


def held_steps(
    model: keras.Model, iterator: ResidentIterator
) -> tuple[Reads, Callable[[Any], Callable], Callable[[Any], Any]]:
    """(reads, read, one_step) for Keras' own `train_step` on `iterator`'s batches: the step on
    every replica, `read` a call's reader of the batches (`StepReads`), and the reads stamped
    where the input clock wraps the step (it then stamps the reads itself, not the step's
    edges)."""
    step = model.train_step
    clock = getattr(step, "_tfrecipe_clock", None)
    if clock is not None:
        step = step.__wrapped_step__
    return Reads(clock), StepReads(iterator), on_replicas(model, step)


def build_metrics(held: HeldSplit, one_step: Callable[[Any], Any]) -> None:
    """Traces a step on a batch of `held`, without running it: Keras builds the compiled
    metrics' variables in the step's first trace, which a loop's body cannot hold; the loop
    then reuses the step's trace. Batch 0 in order has the spec of a training batch at no
    permutation's cost (the stream's reads traced for it cost the held CNN's first call 60-80
    ms; a step run alone for it, 0.17 s)."""
    one = graph.function(lambda: one_step(held.batch_in_order(tf.constant(0))))
    one.get_concrete_function()


def _mean_over_replicas(value: Any, strategy: tf.distribute.Strategy) -> Any:
    """Keras' `reduce_per_replica(..., "auto")` off TPUs: a per-replica value's mean."""
    if not isinstance(value, tf.distribute.DistributedValues):
        return value
    return tf.reduce_mean(strategy.experimental_local_results(value), axis=0)
