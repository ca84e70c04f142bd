"""float16 loss scaling: a step skipped for overflowing gradients still counts as a step
(tfrecipe.optim.count_skipped_steps), on one device and under MirroredStrategy."""

from __future__ import annotations

import numpy as np
import pytest

from tfrecipe.config import schema
from tfrecipe.optim import build_optimizer

INF, ONE = [np.inf, 1.0, 1.0], [1.0, 1.0, 1.0]


@pytest.fixture
def tf_two_cpus():
    import tensorflow as tf

    return tf


def _loss_scaled_sgd():
    spec = schema.SGD(name="sgd", learning_rate=0.1)
    return build_optimizer(spec, learning_rate=0.1, loss_scaling=True)


def test_a_skipped_step_counts_as_a_step(tf_two_cpus):
    import keras

    weights = keras.Variable(np.ones(3, "float32"))
    optimizer = _loss_scaled_sgd()
    optimizer.build([weights])
    scale = float(optimizer.dynamic_scale)

    optimizer.apply_gradients([(tf_two_cpus.constant(INF, "float32"), weights)])

    assert int(optimizer.iterations) == 1  # Keras alone: 0
    np.testing.assert_array_equal(weights.numpy(), np.ones(3))  # nothing applied
    assert float(optimizer.dynamic_scale) == scale / 2

    optimizer.apply_gradients([(tf_two_cpus.constant(ONE, "float32"), weights)])

    assert int(optimizer.iterations) == 2
    # applied, unscaled: 1 - lr x gradient / scale
    np.testing.assert_allclose(weights.numpy(), np.full(3, 1 - 0.1 / (scale / 2)))


def test_a_skipped_step_counts_once_across_replicas(tf_two_cpus):
    import keras

    tf = tf_two_cpus
    from tfrecipe.distribute.strategy import (
        build_strategy,  # fresh collective keys for this process
    )

    strategy = build_strategy(
        schema.MirroredStrategy(name="mirrored", devices=["/cpu:0", "/cpu:1"])
    )
    with strategy.scope():
        weights = keras.Variable(np.ones(3, "float32"))
        optimizer = _loss_scaled_sgd()
        optimizer.build([weights])

    @tf.function
    def step(gradient):
        strategy.run(lambda: optimizer.apply_gradients([(gradient, weights)]))

    scale = float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
    step(np.array(INF, "float32"))
    step(np.array(ONE, "float32"))

    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 2  # Keras alone: 1
    # each replica's gradient, summed over both, unscaled: 1 - lr x 2 / scale
    expected = np.full(3, 1 - 0.1 * 2 / (scale / 2))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected, rtol=1e-6)
