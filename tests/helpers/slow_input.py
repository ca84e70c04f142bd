"""The bundled digits read slowly: every training example waits `seconds_per_example` in a
Python map (the input-bound run of tests/test_perf.py).

    dataset._target_=tests.helpers.slow_input.slow_digits +dataset.seconds_per_example=0.002
    pipeline.cache=null allowed_targets=[tests.helpers]
"""

from __future__ import annotations

import dataclasses
import time

import tensorflow as tf

from tfrecipe.data.bundled import digits


def slow_digits(*, seconds_per_example: float, **options):
    splits = digits(**options)

    def wait(features):
        time.sleep(seconds_per_example)
        return features

    def slow(features, label):
        waited = tf.py_function(wait, [features], features.dtype)
        return tf.ensure_shape(waited, features.shape), label

    return dataclasses.replace(splits, train=splits.train.map(slow))
