"""FLOPs of one training step, counted by TensorFlow's (v1) profiler on the step's graph.

The graph is `strategy.run(model.train_step, ...)` traced (not run) on one per-replica batch: the
forward pass, the loss, the gradients and the optimizer's update, on every replica. Measured: a
Keras 3 CNN's forward pass counts within 0.4% of 2·MACs; a step about 3x the forward pass.

Tracing the step costs about as long as tracing it for training (0.3-0.8 s on 2 cores), so the
count is kept per machine (tfrecipe.perf.cache) under the step's signature: the model's
architecture, loss, optimizer, batch spec, replicas and dtype policy.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import graph
from tfrecipe.perf.cache import remembered

log = logging.getLogger("tfrecipe")


def per_replica_spec(element_spec: Any, per_replica_batch: int) -> Any:
    """One replica's batch spec from a (distributed) dataset's element spec, with the batch
    dimension fixed (the profiler needs whole shapes)."""

    def fixed(spec):
        values = getattr(spec, "_value_specs", None)  # PerReplicaSpec: the first replica's
        spec = values[0] if values else spec
        shape = [per_replica_batch, *spec.shape[1:]]
        return tf.TensorSpec(shape, spec.dtype)

    return tf.nest.map_structure(fixed, element_spec)


def step_signature(model: keras.Model, batch_spec: Any) -> str:
    """What a step's FLOPs depend on, hashed: architecture, loss, optimizer, batch, replicas,
    dtype policy, TensorFlow."""
    optimizer = model.optimizer
    parts = [
        model.to_json(),
        keras.saving.serialize_keras_object(model.loss),
        type(optimizer).__name__,
        optimizer.get_config() if optimizer is not None else None,
        repr(batch_spec),
        model.distribute_strategy.num_replicas_in_sync,
        keras.mixed_precision.global_policy().name,
        tf.__version__,
    ]
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached_flops_per_step(model: keras.Model, batch_spec: Any) -> int | None:
    """`flops_per_step`, from the per-machine cache when this step's signature is in it."""
    count, _ = remembered(
        "flops", step_signature(model, batch_spec), lambda: flops_per_step(model, batch_spec)
    )
    return int(count) if count else None


def flops_per_step(model: keras.Model, batch_spec: Any) -> int | None:
    """The training step's FLOPs on all replicas (None where the profiler counts nothing: a
    model whose ops have no FLOPs statistics)."""
    from tensorflow.python.profiler import model_analyzer
    from tensorflow.python.profiler.option_builder import ProfileOptionBuilder
    from tensorflow.python.util import deprecation

    strategy = model.distribute_strategy
    step = getattr(model.train_step, "__wrapped_step__", model.train_step)

    @graph.function
    def train_step(data):
        return strategy.run(step, args=(data,))

    traced = train_step.get_concrete_function(batch_spec).graph
    options = ProfileOptionBuilder(ProfileOptionBuilder.float_operation()).with_empty_output()
    with deprecation.silence():
        counted = model_analyzer.profile(traced, options=options.build())
    return int(counted.total_float_ops) or None
