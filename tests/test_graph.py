"""tfrecipe's graph functions are plain TensorFlow (tfrecipe.graph): its loops are written-out
`tf.while_loop`s, and autograph, which cost a held run's first call 0.6-0.7 s of rewriting
source, converts none of tfrecipe's functions in training, validation, tests or input maps."""

from __future__ import annotations

import logging

import pytest
import tensorflow as tf
from tensorflow.python.autograph.impl import api as autograph_api

from tfrecipe import graph


def test_repeat_runs_its_body_count_times_with_the_index():
    @tf.function(autograph=False)
    def sums(count):
        return graph.repeat(count, lambda index, total: total + index, tf.constant(0))

    assert int(sums(tf.constant(5))) == 0 + 1 + 2 + 3 + 4
    assert int(sums(tf.constant(0))) == 0  # no iteration: the state as it came


def test_until_stops_when_the_body_says_done_or_at_count():
    data = tf.data.Dataset.range(3)

    @tf.function(autograph=False)
    def read(iterator, count):
        def one(total):
            item = iterator.get_next_as_optional()
            value = tf.cond(item.has_value(), item.get_value, lambda: tf.constant(-1, tf.int64))
            return value < 0, total + tf.maximum(value, 0)

        return graph.until(count, one, tf.constant(0, tf.int64))

    assert int(read(iter(data), tf.constant(10))) == 0 + 1 + 2  # the data ended first
    assert int(read(iter(data), tf.constant(2))) == 0 + 1  # the count did


@pytest.fixture
def converted(monkeypatch) -> list[str]:
    """The tfrecipe functions autograph converts while the test runs (a spy: each conversion
    still happens)."""
    names: list[str] = []
    convert = autograph_api._convert_actual

    def spied(entity, program_ctx):
        module = getattr(entity, "__module__", "") or ""
        if module.startswith("tfrecipe"):
            names.append(f"{module}.{getattr(entity, '__qualname__', entity)}")
        return convert(entity, program_ctx)

    monkeypatch.setattr(autograph_api, "_convert_actual", spied)
    return names


@pytest.mark.parametrize(
    "overrides",
    [
        ("model=mlp",),  # held, several epochs per call, held validation and test
        ("model=mlp", "batching.epochs_per_call=1"),  # held, one epoch a call
        ("loop=custom", "pipeline.augment_flip=true"),  # streamed, augmented
        ("model=mlp", "loop=custom"),  # held, the custom loop
    ],
    ids=["held-groups", "held", "custom-augmented", "custom-held"],
)
def test_no_tfrecipe_function_is_converted_by_autograph(train_run, converted, overrides):
    summary, _ = train_run(*overrides, "loop.epochs=3")
    assert summary["status"] == "completed"
    assert converted == []


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _plain_function():
    return tf.function(lambda x: x + 1, autograph=False)


def _tfrecipe_function():  # a qualname of its own: the quieted lines name it
    return graph.function(lambda x: x + 1)


@pytest.mark.parametrize("make", [_plain_function, _tfrecipe_function])
def test_functions_made_anew_for_each_run_do_not_warn_of_retracing(make):
    """A sweep's jobs in one process each make and trace their functions once: TensorFlow's
    retracing warning counts every function made from one piece of code together, so from the
    fifth short run on it named tfrecipe's own. A plain tf.function made the same way still
    gets it (the warning a user's own code needs)."""
    lines, tensorflow_log = _Lines(), logging.getLogger("tensorflow")
    tensorflow_log.addHandler(lines)
    try:
        for run in range(8):  # each run: a new function from the same code, called twice
            add = make()
            add(tf.constant(run))
            add(tf.constant(run + 1))
    finally:
        tensorflow_log.removeHandler(lines)
    warned = [line for line in lines.lines if "triggered tf.function retracing" in line]
    assert bool(warned) == (make is _plain_function), warned
