"""Every private Keras and TensorFlow API tfrecipe touches, one function each, in one place.

Keras and TensorFlow have no public way to do a few things tfrecipe needs. Each use of a private
name is a function here that says what it is for and the versions it was checked on; nothing else
in the package reads a private Keras/TensorFlow attribute or imports `keras.src` or
`tensorflow.python`. A name that moved fails loudly (`PrivateAPIMoved`: the function here, the
name, the installed versions), never silently, and tests/test_compat.py checks every name this
module relies on in seconds, so an upgrade says at once what to revisit.

Checked on Keras 3.15.1 and TensorFlow 2.21.0 (pyproject.toml allows TensorFlow >=2.21,<2.22 and
Keras >=3.10,<4; the `Model.fit` fixes are installed only for `BROKEN_KERAS`, >=3.0,<3.16).

Each function's docstring says what it is for and who calls it.

Hydra's private names stay at their call sites (the command line imports them without
TensorFlow); tests/test_compat.py lists and checks them too.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

import keras
import tensorflow as tf
from packaging.specifiers import SpecifierSet
from packaging.version import Version

log = logging.getLogger("tfrecipe")

CHECKED_ON = "Keras 3.15.1, TensorFlow 2.21.0"


class PrivateAPIMoved(RuntimeError):
    """A private Keras/TensorFlow name tfrecipe relies on is not where the checked versions had it."""


def installed_versions() -> str:
    return f"Keras {keras.__version__}, TensorFlow {tf.__version__}"


def _moved(name: str, user: str) -> PrivateAPIMoved:
    return PrivateAPIMoved(
        f"tfrecipe.compat.{user}: {name} does not exist in {installed_versions()} (checked on "
        f"{CHECKED_ON}); tfrecipe.compat needs updating for this version"
    )


def _private(owner: object, name: str, *, user: str) -> Any:
    """`owner.<name>`, or `PrivateAPIMoved` naming `user` (the function here that needs it)."""
    try:
        return getattr(owner, name)
    except AttributeError:
        label = owner.__name__ if isinstance(owner, type) else type(owner).__name__
        raise _moved(f"{label}.{name}", user) from None


def _private_import(module: str, name: str, *, user: str) -> Any:
    """`module.<name>` (a private module), or `PrivateAPIMoved` naming `user`."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise _moved(f"{module}.{name}", user) from None


# --- Model.fit under a distribution strategy (Keras >=3.0,<3.16) ------------------------------
#
# Under any explicit strategy, `TensorFlowTrainer._maybe_symbolic_build`
# (`keras/src/backend/tensorflow/trainer.py`) builds the model from one batch that it reads from a
# throwaway iterator of the training data, then trains on a second iterator. tfrecipe's training
# data reshuffle on every iteration (`shuffle(seed=..., reshuffle_each_iteration=True)`: the
# shuffle's seed generator belongs to the dataset and advances with each `iter()`), so `fit` under
# one_device, mirrored or multi-worker trained on another order than the default strategy (which
# builds when it traces, from the one iterator it trains on) and than the custom loop: a training
# loss of 2.20722 instead of 2.10956 after 20 steps of digits. The fix builds the model from the
# data's element spec: shapes and dtypes are all a build needs, and no iterator is opened.
#
# With several replicas, Keras' `train_step` averages each replica's loss over that replica's
# examples and divides by the number of replicas: every replica weighs the same. The last batch of
# a pass is short (1,257 digits = 19 x 64 + 41) and splits unevenly (21 + 20), so its gradient was
# not the mean over its examples, as on one replica and in the custom loop (the weights differed by
# 3e-4 after 20 steps, the test loss by 6.4e-4 relative). The fix weighs each replica's loss by its
# share of the step's examples, for the gradient only (the reported loss already is a mean over
# examples).
#
# Under MultiWorkerMirroredStrategy with 2+ workers, two functions fail outright
# (keras-team/keras#20585):
#
# - the same `_maybe_symbolic_build` "reduces" its batch with `strategy.reduce("MEAN", batch,
#   axis=None)`: a cross-worker all-reduce of the whole nested (features, labels) batch, which fails
#   for the integer labels and is pointless (only shapes matter). The build from the element spec
#   has no collective either (where the spec is not plain tensors, it builds from this worker's
#   first local replica batch).
# - `reduce_per_replica(..., reduction="mean")` calls `strategy.reduce("MEAN", v, axis=0)` on each
#   step's scalar metric values; a scalar has no axis 0. The fix reduces scalars with `axis=None`
#   (the mean over replicas, which is what single-worker strategies compute).
#
# The replacements delegate to Keras' own functions outside the cases they fix, and they are
# installed only for the Keras versions in `BROKEN_KERAS`, checked against the installed version.
# tests/test_strategy_equivalence.py fails if the build fix stops working, and
# tests/test_multi_worker.py (`loop=fit` on two real workers) if the multi-worker fix does.

# Keras versions in which Model.fit fails across workers and builds from a throwaway batch under a
# strategy: measured broken up to 3.15.1 (the newest this project was tested with). Extend this
# when a newer Keras is verified still broken; an unlisted version gets no fix and a warning, and
# the equivalence and multi-worker fit tests tell which fix it still needs.
BROKEN_KERAS = SpecifierSet(">=3.0,<3.16")

_original: dict[str, object] = {}


def needs_fix(version: str = keras.__version__) -> bool:
    return Version(version) in BROKEN_KERAS


def _is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    # A MultiWorkerMirroredStrategy of one task is single-worker; TF 2.4-2.21 say which privately.
    return _private(strategy.extended, "_in_multi_worker_mode", user="fix_multi_worker_fit")()


def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    if iterator is None or _built_under_default_strategy(self):
        return _original["_maybe_symbolic_build"](self, iterator=iterator, data_batch=data_batch)
    strategy = self.distribute_strategy
    # Keras' TFEpochIterator keeps the distributed dataset it iterates (Keras 3.0-3.15).
    dataset = _private(iterator, "_distributed_dataset", user="fix_fit_under_strategy")
    data_batch = _replica_spec(dataset.element_spec)
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

    per_replica_spec = _private_import(
        "tensorflow.python.distribute.values", "PerReplicaSpec", user="fix_fit_under_strategy"
    )  # the spec of a distributed dataset's element: one TensorSpec per replica (TF 2.4-2.21)

    def replica(spec):
        if isinstance(spec, tf.TensorSpec):
            return spec
        parts = tf.nest.flatten(spec, expand_composites=True)  # a PerReplicaSpec's replicas
        if isinstance(spec, per_replica_spec) and all(isinstance(p, tf.TensorSpec) for p in parts):
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
    tree = importlib.import_module("keras.src.tree")  # the install checked these (_KERAS_HELPERS)
    unscale_loss_for_distribution = _keras_helper("unscale_loss_for_distribution")
    unpack_x_y_sample_weight = _keras_helper("unpack_x_y_sample_weight")

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


# What `_train_step` (Keras' own train_step, changed) uses of `keras.src` (Keras 3.0-3.15).
_KERAS_HELPERS = {
    "flatten": "keras.src.tree",
    "unscale_loss_for_distribution": "keras.src.losses.loss",
    "unpack_x_y_sample_weight": "keras.src.trainers.data_adapters.data_adapter_utils",
}


def _keras_helper(name: str) -> Any:
    return _private_import(_KERAS_HELPERS[name], name, user="fix_fit_under_strategy")


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
    if _built_under_default_strategy(model):
        return False  # Keras builds from the batches it trains on
    if not _keras_is_known():
        return False
    for name in _KERAS_HELPERS:
        _keras_helper(name)  # fails here, before training, where one has moved
    _install("_maybe_symbolic_build", _maybe_symbolic_build)
    _install("train_step", _train_step)
    return True


def _built_under_default_strategy(model: keras.Model) -> bool:
    """Whether `model` was built outside any strategy's scope: the public `distribute_strategy`
    falls back to the default strategy; Keras 3.0-3.15 keep the one it was built in privately."""
    return _private(model, "_distribute_strategy", user="fix_fit_under_strategy") is None


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
    """Replaces Keras' `TensorFlowTrainer.<name>` (or the trainer module's function)."""
    if name in _original:
        return
    user = "fix_multi_worker_fit" if name == "reduce_per_replica" else "fix_fit_under_strategy"
    trainer = _private_import("keras.src.backend.tensorflow", "trainer", user=user)
    owner = trainer if name == "reduce_per_replica" else trainer.TensorFlowTrainer
    _original[name] = _private(owner, name, user=user)
    setattr(owner, name, replacement)
    log.debug("installed tfrecipe's fix of Keras' %s", name)


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
    """Whether the TensorFlow variable inside a Keras one (`_value`, Keras 3.0-3.15) is shared."""
    return isinstance(
        _private(variable, "_value", user="fix_shared_variable_increments"), _shared_classes()
    )


def _shared_classes() -> tuple[type, ...]:
    """TensorFlow's variables of central storage and parameter servers (TF 2.4-2.21)."""
    return tuple(
        _private_import(
            "tensorflow.python.distribute.ps_values", name, user="fix_shared_variable_increments"
        )
        for name in ("AggregatingVariable", "CachingVariable")
    )


def _make_increment(name: str):
    def increment(self, value):
        in_stateless_scope = _private_import(
            "keras.src.backend.common.stateless_scope",
            "in_stateless_scope",
            user="fix_shared_variable_increments",
        )
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
    variable = _private_import(
        "keras.src.backend.tensorflow.core", "Variable", user="fix_shared_variable_increments"
    )
    _shared_classes()  # fails here, before training, where one has moved
    if not _increment_original:
        for name in ("assign_add", "assign_sub"):
            _increment_original[name] = getattr(variable, name)
            setattr(variable, name, _make_increment(name))
    return True


# --- Layers and optimizers: no public walk, hook or getter ------------------------------------


def flatten_layers(model: keras.Model) -> list[keras.Layer]:
    """`model` and every layer inside it, nested ones included (`Model.layers` lists only the top
    level). Keras 3.0-3.15: `Layer._flatten_layers(include_self, recursive)`."""
    return _private(model, "_flatten_layers", user="flatten_layers")(include_self=True)


def ema_pairs(optimizer: keras.optimizers.Optimizer) -> list[tuple[Any, Any]]:
    """(model variable, its moving average) for each variable an optimizer with `use_ema` trains.
    Keras 3.0-3.15: `Optimizer._trainable_variables`, `._model_variables_moving_average` (what
    `keras.callbacks.SwapEMAWeights` swaps)."""
    variables = _private(optimizer, "_trainable_variables", user="ema_pairs")
    averages = _private(optimizer, "_model_variables_moving_average", user="ema_pairs")
    return [(v, a) for v, a in zip(variables, averages, strict=True) if a is not None]


def seed_generators(layer: keras.Layer) -> list[keras.random.SeedGenerator]:
    """The seed generators `layer` owns (dropout, random augmentation), whose state a checkpoint
    of the model does not track. Keras 3.0-3.15: `Layer._seed_generators` (every layer has it)."""
    return list(_private(layer, "_seed_generators", user="seed_generators"))


def after_skipped_step(optimizer: keras.optimizers.LossScaleOptimizer, then) -> None:
    """Calls `then()` whenever `optimizer` skips a step because its float16 gradients overflowed.
    Keras has no hook for it: its LossScaleOptimizer calls `self._stateful_handle_non_finite_grads()`
    (Keras 3.0-3.15) when it traces the step; an instance attribute replaces it for this one."""
    skip = _private(optimizer, "_stateful_handle_non_finite_grads", user="after_skipped_step")

    def skip_then():
        skip()
        then()

    optimizer._stateful_handle_non_finite_grads = skip_then


def build_metric(metric: keras.metrics.Metric, output_shape: tuple) -> None:
    """Creates the variables of a metric that makes them on its first update (R2Score, F1Score):
    a custom loop needs them before its `tf.function` runs (made while a distributed loop traces,
    they fail: "You must feed a value for placeholder tensor"); fit makes them in its symbolic
    build. Keras 3.0-3.15: `_built`, `_build(y_true_shape, y_pred_shape)`; AUC `_build(shape)`."""
    if getattr(metric, "_built", True):
        return
    shape = (None, *output_shape[1:])
    build = _private(metric, "_build", user="build_metric")
    build(shape) if isinstance(metric, keras.metrics.AUC) else build(shape, shape)


def learning_rate_setting(optimizer: keras.optimizers.Optimizer):
    """The learning rate `optimizer` was given: the schedule itself, or the variable of a float
    (the public `learning_rate` gives only a schedule's current value). Keras 3.0-3.15:
    `BaseOptimizer._learning_rate`."""
    return _private(optimizer, "_learning_rate", user="learning_rate_setting")


# --- TensorFlow: determinism, collective keys, the preemption handler ---------------------------


def disable_op_determinism() -> None:
    """Turns op determinism off (an earlier run in this process may have turned it on): TF 2.21
    exports only `enable_op_determinism`; this half is `tensorflow.python.framework.config`."""
    module, name = "tensorflow.python.framework.config", "disable_op_determinism"
    _private_import(module, name, user="disable_op_determinism")()


def set_collective_key_base(strategy_class: type[tf.distribute.Strategy], base: int) -> None:
    """Where the next strategy of `strategy_class` starts its collective keys: each new
    MirroredStrategy's extended reads its class's `_collective_key_base` (TF 2.4-2.21; TF's own
    tests set it). Checked to exist first: setting a gone attribute would change nothing."""
    _private(strategy_class, "_collective_key_base", user="set_collective_key_base")
    strategy_class._collective_key_base = base


def stop_preemption_watchers(
    handler: tf.distribute.experimental.PreemptionCheckpointHandler,
) -> None:
    """Stops the threads `handler` started (the poll of this task's own SIGTERM, the watcher of
    the cluster's): it has no public close, and a run that ended must not leave them watching.
    TF 2.12-2.21; each is a no-op where its thread never started, and ignores the errors it
    expects from a cluster whose peers have gone."""
    user = "stop_preemption_watchers"
    _private(handler, "_stop_poll_termination_signal_thread", user=user)()
    _private(handler, "_stop_cluster_wise_termination_watcher_thread", user=user)()


def gpu_memory_bytes(device: str) -> int:
    """What TensorFlow's allocator may take on GPU `device` (the resident split's cap is a share;
    data/resident.py): no public API says; `device_lib.list_local_devices()` does (TF 2.0-2.21)."""
    lib, index = "tensorflow.python.client.device_lib", device.rsplit(":", 1)[-1]
    listed = _private_import(lib, "list_local_devices", user="gpu_memory_bytes")()
    gpus = [d for d in listed if d.device_type == "GPU" and d.name.rsplit(":", 1)[-1] == index]
    return int(gpus[0].memory_limit)


# --- Saving: `saving_lib.get_attr_skipset`, asked per layer/metric/optimizer by each save and load,
# rebuilds its set every call (~1 ms): Keras stores `saving_attr_skipset_T`, reads `..._skiplist_T`.
def cache_saving_skipsets() -> None:
    """Caches Keras' `saving_lib.get_attr_skipset` per object type, as Keras meant."""
    lib = _private_import("keras.src.saving", "saving_lib", user="cache_saving_skipsets")
    original = _private(lib, "get_attr_skipset", user="cache_saving_skipsets")
    lib.get_attr_skipset = functools.cache(getattr(original, "__wrapped__", original))


def tracing_seconds() -> float:
    """Seconds tf.function spent tracing Python into graphs in this process (nested functions
    counted once): TensorFlow's own counter `/tensorflow/core/tf_function/graph_building_time_usecs`
    (TF 2.12-2.21), which no public API reads."""
    module = "tensorflow.python.eager.polymorphic_function.tracing_compilation"
    counter = _private_import(module, "_graph_building_time_counter", user="tracing_seconds")
    return counter.get_cell().value() / 1e6


# --- A weights file written off the training thread (tfrecipe/weights_file.py): the walk of
# `keras.saving.save_weights` into Keras' own stores (`keras.src.saving.saving_lib`, Keras 3.x).
def saved_weights_walk(model: keras.Model, store: Any, skip: list[Any]) -> None:
    """`saving_lib._save_state`: each saveable's `save_own_variables` into
    `store.make(inner_path, metadata=...)`, `store` a `saving_private("NpzIOStore")`."""
    walk, visited = saving_private("_save_state"), {id(o) for o in skip}
    walk(model, weights_store=store, assets_store=None, inner_path="", visited_saveables=visited)


def saving_private(name: str) -> Any:
    """`saving_lib.<name>`: the walk, `H5IOStore` (the `.weights.h5` writer), `NpzIOStore`."""
    lib = _private_import("keras.src.saving", "saving_lib", user="saving_private")
    return _private(lib, name, user=f"saving_private({name!r})")
