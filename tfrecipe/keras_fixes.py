"""A narrowly scoped fix for Keras 3 `Model.fit` across several workers (keras-team/keras#20585).

Under MultiWorkerMirroredStrategy with 2+ workers, two functions of Keras' TensorFlow trainer
(`keras/src/backend/tensorflow/trainer.py`) fail:

- `TensorFlowTrainer._maybe_symbolic_build` builds the model from one batch that it first
  "reduces" with `strategy.reduce("MEAN", batch, axis=None)`: a cross-worker all-reduce of the
  whole nested (features, labels) batch, which fails for the integer labels and is pointless
  (only shapes matter). The fix builds from this worker's first local replica batch instead.
- `reduce_per_replica(..., reduction="mean")` calls `strategy.reduce("MEAN", v, axis=0)` on each
  step's scalar metric values; a scalar has no axis 0. The fix reduces scalars with `axis=None`
  (the mean over replicas, which is what single-worker strategies compute).

Both replacements delegate to Keras' own functions unless the strategy is a MultiWorkerMirrored
strategy in multi-worker mode, and they are installed only for the Keras versions in
`BROKEN_KERAS`, checked against the installed version. tests/test_multi_worker.py trains with
`loop=fit` on two real workers, and fails if the fix stops working.
"""

from __future__ import annotations

import logging

import keras
import tensorflow as tf
from packaging.specifiers import SpecifierSet
from packaging.version import Version

log = logging.getLogger("tfrecipe")

# Keras versions in which Model.fit fails across workers: measured broken up to 3.15.1 (the
# newest this project was tested with). Extend this when a newer Keras is verified still broken;
# an unlisted version gets no fix and a warning, and the multi-worker fit test tells which.
BROKEN_KERAS = SpecifierSet(">=3.0,<3.16")

_original: dict[str, object] = {}


def needs_fix(version: str = keras.__version__) -> bool:
    return Version(version) in BROKEN_KERAS


def _is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode()
    )


def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    if iterator is None or not _is_multi_worker(self._distribute_strategy):
        return _original["_maybe_symbolic_build"](self, iterator=iterator, data_batch=data_batch)
    strategy = self.distribute_strategy
    for _, _, it in iterator:
        batch = next(it)
        # The first local replica's batch: shapes are all the build needs, no collective.
        data_batch = tf.nest.map_structure(
            lambda x: (
                strategy.experimental_local_results(x)[0]
                if isinstance(x, tf.distribute.DistributedValues)
                else x
            ),
            batch,
        )
        break
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def _reduce_per_replica(values, strategy, reduction):
    if reduction not in ("auto", "mean") or not _is_multi_worker(strategy):
        return _original["reduce_per_replica"](values, strategy, reduction)

    def reduce(value):
        rank = getattr(getattr(value, "shape", None), "rank", None)
        axis = 0 if rank else None  # scalars: the mean over replicas
        return strategy.reduce("MEAN", value, axis=axis)

    return tf.nest.map_structure(reduce, values)


def fix_multi_worker_fit(strategy: tf.distribute.Strategy) -> bool:
    """Installs the fix when `strategy` spans several workers and this Keras needs it.

    Idempotent. Returns whether the fix is installed.
    """
    if not _is_multi_worker(strategy):
        return False
    if not needs_fix():
        log.warning(
            "Keras %s is outside the versions known to break Model.fit across workers (%s): "
            "tfrecipe's fix for keras-team/keras#20585 is not installed; if loop=fit fails, "
            "verify and extend tfrecipe.keras_fixes.BROKEN_KERAS",
            keras.__version__,
            BROKEN_KERAS,
        )
        return False
    from keras.src.backend.tensorflow import trainer

    if not _original:
        _original["_maybe_symbolic_build"] = trainer.TensorFlowTrainer._maybe_symbolic_build
        _original["reduce_per_replica"] = trainer.reduce_per_replica
        trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
        trainer.reduce_per_replica = _reduce_per_replica
        log.info("installed the multi-worker Model.fit fix (keras-team/keras#20585)")
    return True


def is_installed() -> bool:
    return bool(_original)


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
