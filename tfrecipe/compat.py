"""Narrowly scoped fixes for Keras 3 `Model.fit` under a distribution strategy.

Under any explicit strategy, `TensorFlowTrainer._maybe_symbolic_build`
(`keras/src/backend/tensorflow/trainer.py`) builds the model from one batch that it reads from a
throwaway iterator of the training data, then trains on a second iterator. tfrecipe's training
data reshuffle on every iteration (`shuffle(seed=..., reshuffle_each_iteration=True)`: the
shuffle's seed generator belongs to the dataset and advances with each `iter()`), so `fit` under
one_device, mirrored or multi-worker trained on another order than the default strategy (which
builds when it traces, from the one iterator it trains on) and than the custom loop: a training
loss of 2.20722 instead of 2.10956 after 20 steps of digits. The fix builds the model from the
data's element spec: shapes and dtypes are all a build needs, and no iterator is opened.

With several replicas, Keras' `train_step` averages each replica's loss over that replica's
examples and divides by the number of replicas: every replica weighs the same. The last batch of
a pass is short (1,257 digits = 19 x 64 + 41) and splits unevenly (21 + 20), so its gradient was
not the mean over its examples, as on one replica and in the custom loop (the weights differed by
3e-4 after 20 steps, the test loss by 6.4e-4 relative). The fix weighs each replica's loss by its
share of the step's examples, for the gradient only (the reported loss already is a mean over
examples).

Under MultiWorkerMirroredStrategy with 2+ workers, two functions fail outright
(keras-team/keras#20585):

- the same `_maybe_symbolic_build` "reduces" its batch with `strategy.reduce("MEAN", batch,
  axis=None)`: a cross-worker all-reduce of the whole nested (features, labels) batch, which fails
  for the integer labels and is pointless (only shapes matter). The build from the element spec
  has no collective either (where the spec is not plain tensors, it builds from this worker's
  first local replica batch).
- `reduce_per_replica(..., reduction="mean")` calls `strategy.reduce("MEAN", v, axis=0)` on each
  step's scalar metric values; a scalar has no axis 0. The fix reduces scalars with `axis=None`
  (the mean over replicas, which is what single-worker strategies compute).

The replacements delegate to Keras' own functions outside the cases they fix, and they are
installed only for the Keras versions in `BROKEN_KERAS`, checked against the installed version.
tests/test_strategy_equivalence.py fails if the build fix stops working, and
tests/test_multi_worker.py (`loop=fit` on two real workers) if the multi-worker fix does.
"""

from __future__ import annotations

import logging

import keras
import tensorflow as tf
from packaging.specifiers import SpecifierSet
from packaging.version import Version

log = logging.getLogger("tfrecipe")

# Keras versions in which Model.fit fails across workers and builds from a throwaway batch under a
# strategy: measured broken up to 3.15.1 (the newest this project was tested with). Extend this
# when a newer Keras is verified still broken; an unlisted version gets no fix and a warning, and
# the equivalence and multi-worker fit tests tell which fix it still needs.
BROKEN_KERAS = SpecifierSet(">=3.0,<3.16")

_original: dict[str, object] = {}


def needs_fix(version: str = keras.__version__) -> bool:
    return Version(version) in BROKEN_KERAS


def _is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode()
    )


def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    if iterator is None or self._distribute_strategy is None:
        return _original["_maybe_symbolic_build"](self, iterator=iterator, data_batch=data_batch)
    strategy = self.distribute_strategy
    data_batch = _replica_spec(iterator._distributed_dataset.element_spec)
    if data_batch is None:
        if not _is_multi_worker(strategy):
            return _original["_maybe_symbolic_build"](self, iterator=iterator)
        data_batch = _first_local_batch(iterator, strategy)
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def _replica_spec(element_spec):
    """One replica's batch as `tf.TensorSpec`s (what `_symbolic_build` reads: shape and dtype),
    or None where an element is not a plain tensor (ragged, sparse: Keras' own build handles it).
    """

    def replica(spec):
        from tensorflow.python.distribute.values import PerReplicaSpec

        if isinstance(spec, tf.TensorSpec):
            return spec
        parts = tf.nest.flatten(spec, expand_composites=True)  # a PerReplicaSpec's replicas
        if isinstance(spec, PerReplicaSpec) and all(isinstance(p, tf.TensorSpec) for p in parts):
            return parts[0]
        raise TypeError(spec)

    try:
        return tf.nest.map_structure(replica, element_spec)
    except TypeError:
        return None


def _first_local_batch(iterator, strategy):
    """This worker's first local replica batch: no collective (Keras reduces it across workers)."""
    for _, _, it in iterator:
        batch = next(it)
        return tf.nest.map_structure(
            lambda x: (
                strategy.experimental_local_results(x)[0]
                if isinstance(x, tf.distribute.DistributedValues)
                else x
            ),
            batch,
        )
    return None


def _train_step(self, data):
    """Keras' `TensorFlowTrainer.train_step`, but with several replicas each replica's loss is
    weighed by its share of the step's examples before the gradient."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas == 1 or self.optimizer is None or not self.trainable_weights:
        return _original["train_step"](self, data)
    from keras.src import tree
    from keras.src.losses.loss import unscale_loss_for_distribution
    from keras.src.trainers.data_adapters.data_adapter_utils import unpack_x_y_sample_weight

    x, y, sample_weight = unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        y_pred = self(x, training=True) if self._call_has_training_arg else self(x)
        loss = self._compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
        )
        examples = tf.shape(next(i for i in tree.flatten(x) if i is not None))[0]
        self._loss_tracker.update_state(unscale_loss_for_distribution(loss), sample_weight=examples)
        loss = self.optimizer.scale_loss(loss * _share_of_step(examples, replicas, loss.dtype))
    gradients = tape.gradient(loss, self.trainable_weights)
    self.optimizer.apply_gradients(zip(gradients, self.trainable_weights, strict=True))
    return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _share_of_step(examples: tf.Tensor, replicas: int, dtype) -> tf.Tensor:
    """replicas x this replica's examples / the step's examples on all replicas: 1 when the
    replicas hold equal shares (the loss is a per-replica mean, divided by `replicas`)."""
    local = tf.cast(examples, tf.float32)
    total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)
    return tf.cast(replicas * local / total, dtype)


def _reduce_per_replica(values, strategy, reduction):
    if reduction not in ("auto", "mean") or not _is_multi_worker(strategy):
        return _original["reduce_per_replica"](values, strategy, reduction)

    def reduce(value):
        rank = getattr(getattr(value, "shape", None), "rank", None)
        axis = 0 if rank else None  # scalars: the mean over replicas
        return strategy.reduce("MEAN", value, axis=axis)

    return tf.nest.map_structure(reduce, values)


def fix_fit_under_strategy(model: keras.Model) -> bool:
    """Makes `model.fit` under the strategy `model` was built in train as under the default
    strategy: on the first iteration of its data (the model is built from the data's spec, not
    from a batch), with every example of a step weighing the same however the replicas split it.

    Idempotent. Returns whether the fix is installed.
    """
    if model._distribute_strategy is None:
        return False  # built under the default strategy: Keras builds from the batches it trains on
    if not _keras_is_known():
        return False
    _install("_maybe_symbolic_build", _maybe_symbolic_build)
    _install("train_step", _train_step)
    return True


def fix_multi_worker_fit(strategy: tf.distribute.Strategy) -> bool:
    """Installs the fix when `strategy` spans several workers and this Keras needs it.

    Idempotent. Returns whether the fix is installed.
    """
    if not _is_multi_worker(strategy) or not _keras_is_known():
        return False
    _install("_maybe_symbolic_build", _maybe_symbolic_build)
    _install("reduce_per_replica", _reduce_per_replica)
    return True


def _keras_is_known() -> bool:
    """Whether this Keras is one the fixes were verified for (else a warning: verify, extend)."""
    if needs_fix():
        return True
    log.warning(
        "Keras %s is outside the versions whose Model.fit tfrecipe fixes under a strategy (%s): "
        "the fixes (keras-team/keras#20585, the model built from a throwaway batch) are not "
        "installed; if loop=fit fails or trains unlike the default strategy, verify and extend "
        "tfrecipe.compat.BROKEN_KERAS",
        keras.__version__,
        BROKEN_KERAS,
    )
    return False


def _install(name: str, replacement) -> None:
    from keras.src.backend.tensorflow import trainer

    if name in _original:
        return
    owner = trainer if name == "reduce_per_replica" else trainer.TensorFlowTrainer
    _original[name] = getattr(owner, name)
    setattr(owner, name, replacement)
    log.info("installed tfrecipe's fix of Keras' %s", name)


# --- Variables shared by replicas: Keras' assign_add is not an increment ---------------------
#
# Keras 3 implements `Variable.assign_add(v)` as `assign(self + v)`, a read then a write. Where one
# variable is shared by several replicas that is wrong:
# - CentralStorageStrategy keeps variables on one device as `AggregatingVariable`s, and an assign
#   in a replica context is aggregated over the replicas: with two replicas a metric total becomes
#   2*old + v0 + v1 instead of old + v0 + v1 (a Mean's count over 100 examples read 620).
# - ParameterServerStrategy keeps them on the parameter servers (`CachingVariable`), where the
#   workers' steps run concurrently: two read-then-writes interleave and one increment is lost (a
#   Mean of ones over 400 scheduled steps counted 16640 of 25600 examples, its total 16320: the
#   training accuracy read 1.047; `optimizer.iterations` loses steps the same way).
# Training itself is unaffected (gradients go through the optimizer), but every reported metric,
# `loss` included, was wrong. TensorFlow's own `assign_add` aggregates the increments (central
# storage) and is one atomic op on the parameter server, which is what a metric update means.

_increment_original: dict[str, object] = {}

_SHARED_STRATEGIES = (
    tf.distribute.experimental.CentralStorageStrategy,
    tf.distribute.experimental.ParameterServerStrategy,
)


def _shared(variable) -> bool:
    from tensorflow.python.distribute.ps_values import AggregatingVariable, CachingVariable

    return isinstance(getattr(variable, "_value", None), AggregatingVariable | CachingVariable)


def _make_increment(name: str):
    def increment(self, value):
        from keras.src.backend.common.stateless_scope import in_stateless_scope

        if in_stateless_scope() or not _shared(self):
            return _increment_original[name](self, value)
        value = self._convert_to_tensor(value, dtype=self._dtype)
        getattr(self._value, name)(tf.cast(value, self._value.dtype))
        return value

    increment.__name__ = name
    return increment


def fix_shared_variable_increments(strategy: tf.distribute.Strategy) -> bool:
    """Makes Keras variables shared by replicas (central storage, parameter servers) add with
    TensorFlow's `assign_add`.

    Idempotent; other variables keep Keras' own code. Returns whether the fix is installed.
    tests/test_strategy_equivalence.py fails for central_storage if it stops working, and
    tests/test_parameter_server.py's training metrics for parameter servers.
    """
    if not isinstance(strategy, _SHARED_STRATEGIES):
        return False
    from keras.src.backend.tensorflow.core import Variable

    if not _increment_original:
        for name in ("assign_add", "assign_sub"):
            _increment_original[name] = getattr(Variable, name)
            setattr(Variable, name, _make_increment(name))
    return True
