"""Canary for tfrecipe.compat: every private Keras, TensorFlow and Hydra name tfrecipe relies on is
still there, with the shape compat expects, in the installed versions. No training: seconds.

When one fails after an upgrade, the failing name says which compat function to revisit (its
docstring says what the name is for); the behaviour tests named there say whether the fix is still
needed.

Hydra's private API (`hydra._internal`, Hydra 1.3.8, pyproject.toml: >=1.3.2,<1.4) stays at its
call sites: the command line imports it without TensorFlow, and this module imports TensorFlow.
tests/test_compat.py checks those names too:
- `hydra._internal.utils.get_args_parser` (cli/precheck.py, cli/train_command.py,
  cli/commands.py): Hydra's own argv parser, so the CLI answers `--help` and validates a run
  before Hydra starts it.
- `hydra._internal.hydra.Hydra.create_main_hydra2`, `.compose_config`,
  `hydra._internal.utils.create_automatic_config_search_path`,
  `.detect_calling_file_or_module_from_task_function` (cli/sweeps.py `_hydra`): composes
  a user's `--config-dir`/`--config-name` exactly as Hydra will.
- `Hydra.format_args_help` (cli/commands.py `help_text`): Hydra's flags in `--help`.
- the package `hydra._internal.core_plugins` (config/instantiate.py): Hydra's own plugins,
  allowed as `hydra.*` targets.
"""

from __future__ import annotations

import importlib
import inspect

import keras
import pytest
import tensorflow as tf

from tfrecipe import compat

TRAINER = "keras.src.backend.tensorflow.trainer"

# (module, attribute path, the parameters compat calls it with or replaces it by; None: not called)
PRIVATE_NAMES = [
    (TRAINER, "TensorFlowTrainer._maybe_symbolic_build", ["self", "iterator", "data_batch"]),
    (TRAINER, "TensorFlowTrainer._symbolic_build", ["self", "iterator", "data_batch"]),
    (TRAINER, "TensorFlowTrainer.train_step", ["self", "data"]),
    (
        TRAINER,
        "TensorFlowTrainer._compute_loss",
        ["self", "x", "y", "y_pred", "sample_weight", "training"],
    ),
    (TRAINER, "reduce_per_replica", ["values", "strategy", "reduction"]),
    ("keras.src.tree", "flatten", ["structure"]),
    ("keras.src.saving.saving_lib", "get_attr_skipset", None),  # cached: obj_type -> a set
    # keras.saving.save_weights passes objects_to_skip on to it (files.write_weights: no optimizer)
    (
        "keras.src.saving.saving_lib",
        "save_weights_only",
        ["model", "filepath", "max_shard_size", "objects_to_skip"],
    ),
    ("keras.src.losses.loss", "unscale_loss_for_distribution", ["value"]),
    # weights_file: Keras' own walk of save_weights, into its own stores
    (
        "keras.src.saving.saving_lib",
        "_save_state",
        ["saveable", "weights_store", "assets_store", "inner_path", "visited_saveables"],
    ),
    ("keras.src.saving.saving_lib", "H5IOStore", ["path_or_io", "archive", "mode"]),
    ("keras.src.saving.saving_lib", "H5IOStore.make", ["self", "path", "metadata"]),
    ("keras.src.saving.saving_lib", "NpzIOStore.make", ["self", "path", "metadata"]),
    (
        "keras.src.trainers.data_adapters.data_adapter_utils",
        "unpack_x_y_sample_weight",
        ["data"],
    ),
    ("keras.src.backend.tensorflow.core", "Variable.assign_add", ["self", "value"]),
    ("keras.src.backend.tensorflow.core", "Variable.assign_sub", ["self", "value"]),
    (
        "keras.src.backend.tensorflow.core",
        "Variable._convert_to_tensor",
        ["self", "value", "dtype"],
    ),
    ("keras.src.backend.common.stateless_scope", "in_stateless_scope", []),
    ("keras", "Layer._flatten_layers", ["self", "include_self", "recursive"]),
    ("keras.optimizers", "LossScaleOptimizer._stateful_handle_non_finite_grads", ["self"]),
    ("tensorflow.python.distribute.values", "PerReplicaSpec", None),
    ("tensorflow.python.distribute.ps_values", "AggregatingVariable", None),
    ("tensorflow.python.distribute.ps_values", "CachingVariable", None),
    ("tensorflow.python.framework.config", "disable_op_determinism", []),
    (
        "tensorflow.python.eager.polymorphic_function.tracing_compilation",
        "_graph_building_time_counter",
        None,
    ),
    # tests/test_custom_loop.py's without_op_determinism fixture reads it (no public getter).
    ("tensorflow.python.framework.config", "is_op_determinism_enabled", []),
    (
        "tensorflow.python.distribute.collective_all_reduce_strategy",
        "CollectiveAllReduceExtended._in_multi_worker_mode",
        ["self"],
    ),
    (
        "tensorflow",
        "distribute.experimental.PreemptionCheckpointHandler._stop_poll_termination_signal_thread",
        ["self"],
    ),
    (
        "tensorflow",
        "distribute.experimental.PreemptionCheckpointHandler._stop_cluster_wise_termination_watcher_thread",
        ["self"],
    ),
    # Hydra's, used at the command line's call sites (see compat's docstring).
    ("hydra._internal.utils", "get_args_parser", []),
    (
        "hydra._internal.utils",
        "create_automatic_config_search_path",
        ["calling_file", "calling_module", "config_path"],
    ),
    (
        "hydra._internal.utils",
        "detect_calling_file_or_module_from_task_function",
        ["task_function"],
    ),
    ("hydra._internal.hydra", "Hydra.create_main_hydra2", ["task_name", "config_search_path"]),
    (
        "hydra._internal.hydra",
        "Hydra.compose_config",
        ["self", "config_name", "overrides", "run_mode", "with_log_configuration"],
    ),
    ("hydra._internal.hydra", "Hydra.format_args_help", ["args_parser"]),
    # Python's, in cli/main.py `_exit_fast`: the interpreter's own first step of an exit.
    ("threading", "_shutdown", []),
]


def _resolve(module: str, path: str):
    value = importlib.import_module(module)
    for name in path.split("."):
        value = getattr(value, name)
    return value


@pytest.mark.parametrize(("module", "path", "parameters"), PRIVATE_NAMES)
def test_private_name_exists_with_the_expected_parameters(module, path, parameters):
    value = _resolve(module, path)
    if parameters is not None:
        found = list(inspect.signature(value).parameters)
        assert found[: len(parameters)] == parameters, f"{module}.{path}{found}"


def test_hydra_core_plugins_package_exists():
    # config/instantiate.py allows `hydra.*` targets from this package (Hydra's own plugins).
    assert importlib.import_module("hydra._internal.core_plugins").__path__


# Names compat replaces or sets: harmless to set, so a version that stopped reading them would
# lose the fix silently. Each must still be read by the code that calls it.
READ_BY = [
    (TRAINER, "self._maybe_symbolic_build("),
    (TRAINER, "reduce_per_replica("),
    (TRAINER, "self.train_step"),
    ("keras.src.optimizers.loss_scale_optimizer", "self._stateful_handle_non_finite_grads"),
    ("tensorflow.python.distribute.mirrored_strategy", "container_strategy._collective_key_base"),
    ("keras.src.saving.saving_lib", "attr_skipset = get_attr_skipset(obj_type)"),
]


@pytest.mark.parametrize(("module", "code"), READ_BY)
def test_replaced_name_is_still_read(module, code):
    assert code in inspect.getsource(importlib.import_module(module))


def test_mirrored_strategy_has_a_collective_key_base():
    assert isinstance(tf.distribute.MirroredStrategy._collective_key_base, int)


def _model() -> keras.Model:
    inputs = keras.Input((4,))
    hidden = keras.layers.Dropout(0.5, name="drop")(keras.layers.Dense(3, name="dense")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_layers_and_their_seed_generators():
    model = _model()
    layers = {layer.name: layer for layer in compat.flatten_layers(model)}
    assert {"dense", "drop", "out", model.name} <= set(layers)
    (generator,) = compat.seed_generators(layers["drop"])
    assert isinstance(generator, keras.random.SeedGenerator)
    assert compat.seed_generators(layers["dense"]) == []


def test_the_private_attributes_the_fit_fixes_read():
    model = _model()
    assert compat._built_under_default_strategy(model)
    assert isinstance(model._call_has_training_arg, bool)
    assert isinstance(model._loss_tracker, keras.metrics.Mean)
    variable = model.trainable_variables[0]
    assert isinstance(variable._value, tf.Variable) and variable._dtype == "float32"
    trainer = importlib.import_module(TRAINER)
    dataset = tf.data.Dataset.from_tensor_slices((tf.zeros((4, 4)), tf.zeros((4, 2)))).batch(2)
    iterator = trainer.TFEpochIterator(
        distribute_strategy=tf.distribute.get_strategy(), x=dataset, steps_per_epoch=1
    )
    spec = compat._replica_spec(
        compat._private(iterator, "_distributed_dataset", user="t").element_spec
    )
    assert spec == (tf.TensorSpec((None, 4)), tf.TensorSpec((None, 2)))


def test_metrics_that_build_on_their_first_update_are_built_ahead():
    lazy = [
        keras.metrics.R2Score(),
        keras.metrics.F1Score(average="macro"),
        keras.metrics.AUC(multi_label=True),
    ]
    for metric in [*lazy, keras.metrics.MeanAbsoluteError()]:
        compat.build_metric(metric, (None, 3))
    assert all(metric.variables for metric in lazy)
    assert (3,) in [tuple(v.shape) for v in lazy[0].variables]  # one R2 per output


def test_learning_rate_setting_is_the_schedule_itself():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    assert compat.learning_rate_setting(keras.optimizers.SGD(schedule)) is schedule
    setting = compat.learning_rate_setting(keras.optimizers.SGD(0.25))
    assert float(keras.ops.convert_to_numpy(setting)) == 0.25


def test_after_skipped_step_runs_when_float16_gradients_overflow():
    variable = keras.Variable([1.0, 2.0])
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    optimizer.build([variable])
    skipped = []
    compat.after_skipped_step(optimizer, lambda: skipped.append(1))
    optimizer.apply_gradients([(tf.constant([float("inf"), 1.0]), variable)])
    assert skipped == [1]
    assert variable.numpy().tolist() == [1.0, 2.0]  # the step applied nothing
    optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
    assert skipped == [1]  # a finite step is not a skipped one


def test_a_moved_name_fails_loudly_naming_the_compat_function_and_the_versions():
    with pytest.raises(compat.PrivateAPIMoved) as raised:
        compat.flatten_layers(object())
    message = str(raised.value)
    assert message.startswith("tfrecipe.compat.flatten_layers: object._flatten_layers ")
    assert f"Keras {keras.__version__}, TensorFlow {tf.__version__}" in message
    with pytest.raises(compat.PrivateAPIMoved, match=r"keras\.src\.gone\.f does not exist"):
        compat._private_import("keras.src.gone", "f", user="x")


def test_weights_saved_with_cached_skip_sets_load_back_the_same(tmp_path):
    """cache_saving_skipsets keeps Keras' save and load exact: every variable of a trained model
    (its optimizer's too) comes back, and a cached skip set is the one Keras builds."""
    import numpy as np

    saving_lib = importlib.import_module("keras.src.saving.saving_lib")
    built_by_keras = saving_lib.get_attr_skipset("Layer")
    compat.cache_saving_skipsets()
    assert saving_lib.get_attr_skipset("Layer") == built_by_keras
    assert saving_lib.get_attr_skipset("Layer") is saving_lib.get_attr_skipset("Layer")

    def trained():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        model.fit(np.random.default_rng(0).normal(size=(8, 3)), np.ones((8, 2)), verbose=0)
        return model

    model, other = trained(), trained()
    other.set_weights([w + 1 for w in other.get_weights()])
    model.save_weights(tmp_path / "m.weights.h5")
    other.load_weights(tmp_path / "m.weights.h5")
    for saved, loaded in zip(
        model.weights + model.optimizer.variables,
        other.weights + other.optimizer.variables,
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(loaded))
