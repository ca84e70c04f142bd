"""tfrecipe's graph functions are plain TensorFlow: traced with `autograph=False`, their loops
`tf.while_loop`s written out (`repeat`, `until`), their branches `tf.cond`s.

Autograph rewrites every Python function a `tf.function` calls, from its source, before tracing
it: 20-120 ms a function on the 2-core Xeon of docs/benchmarks.md, 0.6-0.7 s of a held or
custom-loop run's first call, more than the digits MLP's training epochs after it (a fifteenth
pass). Keras' own steps are not converted (autograph leaves the `keras` package alone), nor are
tf.data's maps here (`plain`). tests/test_graph.py holds every loop and map to it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

from tfrecipe import printed

State = TypeVar("State")


def plain(function: Callable) -> Callable:
    """`function` traced as it is where TensorFlow would convert it (a tf.data map's)."""
    return tf.autograph.experimental.do_not_convert(function)


def function(python_function: Callable | None = None, **options: Any) -> Any:
    """`tf.function(python_function, autograph=False, **options)`, or a decorator as
    `tf.function(...)` is: the way tfrecipe makes its graph functions, each anew for its run.

    TensorFlow warns of "excessive retracing" where 5 of the last 10 calls of the tf.functions
    made from one piece of code traced. Runs in one process (a sweep's jobs, a notebook's
    `tfrecipe.train` calls) each trace their own functions once, by design: from the fifth
    short run on, that warning named tfrecipe's group, step and test functions. Its lines
    naming a function made here are dropped; a user's own functions keep the warning."""
    if python_function is None:
        return functools.partial(function, **options)
    named = getattr(python_function, "__qualname__", None)
    if named is not None:
        bound = hasattr(python_function, "__self__")
        printed.quiet(
            "tensorflow",
            f"calls to <bound method {named} of" if bound else f"calls to <function {named} at",
        )
    return tf.function(python_function, autograph=False, **options)


def repeat(count: Any, body: Callable[[tf.Tensor, State], State], state: State) -> State:
    """`state = body(index, state)` for each index in [0, count) in a graph loop (`count` a
    tensor or an int), as autograph stages `for index in tf.range(count)`; the last state."""
    count = tf.cast(count, tf.int32)
    _, state = tf.while_loop(
        lambda index, _: index < count,
        lambda index, state: (index + 1, body(index, state)),
        (tf.constant(0), state),
    )
    return state


def blank_outputs(function: Callable[..., Any], *args: Any) -> Any:
    """Zeros shaped as the outputs of `function` on `args`, traced without a call (a plain
    function in a scratch trace; the tf.functions it calls keep theirs): a loop's state before
    its first call, where the loop calls it at one site, in its body. Each site of a call is a
    copy of the function to trace and instantiate (the held CNN's train step: 35-45 ms each),
    where carrying its outputs costs 3-4 us a step (docs/benchmarks.md, "A twentieth pass")."""
    if not hasattr(function, "get_concrete_function"):
        function = tf.function(function, autograph=False)  # a scratch trace, no call
    outputs = function.get_concrete_function(*args).structured_outputs
    return tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype), outputs)


def until(count: Any, body: Callable[[State], tuple[tf.Tensor, State]], state: State) -> State:
    """`done, state = body(state)` up to `count` times, stopping once `done` is true (a
    finite iterator's end); the last state."""

    def step(index, done, state):
        done, state = body(state)
        return index + 1, done, state

    count = tf.cast(count, tf.int32)
    _, _, state = tf.while_loop(
        lambda index, done, _: (index < count) & tf.logical_not(done),
        step,
        (tf.constant(0), tf.constant(False), state),
    )
    return state
