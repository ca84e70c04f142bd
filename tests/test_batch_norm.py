"""`batching.fused_batch_norm`: BatchNormalization trains on TensorFlow's fused kernel with Keras'
own results, and the exported model is Keras' own."""

from __future__ import annotations

import json

import numpy as np
import pytest


def _bn_model(**bn_kwargs):
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((6, 6, 5))
    layer = keras.layers.BatchNormalization(
        momentum=0.9,
        gamma_initializer="random_normal",
        beta_initializer="random_normal",
        **bn_kwargs,
    )
    return keras.Model(inputs, layer(inputs)), layer


def _train_step(model, x):
    """One training-mode call: outputs, the gradients of a loss that weighs every output
    differently, and the layer's moving statistics after it."""
    import tensorflow as tf

    weights = tf.constant(np.random.RandomState(2).rand(*x.shape).astype("float32"))
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.cast(model(x, training=True), "float32")
        loss = tf.reduce_sum(y**2 * weights)
    grads = tape.gradient(loss, [x, *model.trainable_variables])
    layer = model.layers[-1]
    return [y, *grads, layer.moving_mean, layer.moving_variance]


def _training_ops(model, x) -> set[str]:
    """The op types of the model's traced training-mode call."""
    import tensorflow as tf

    spec = tf.TensorSpec(x.shape, "float32")
    graph = tf.function(lambda t: model(t, training=True)).get_concrete_function(spec).graph
    return {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_fused_training_step_matches_keras_own(policy):
    """Outputs, input and weight gradients and the moving statistics (biased variance, the
    layer's momentum) as Keras computes them, within round-off of the dtype they pass through."""
    import keras

    from tfrecipe.models import batch_norm

    keras.mixed_precision.set_global_policy(policy)
    try:
        x = np.random.RandomState(0).randn(16, 6, 6, 5).astype("float32") * 3 + 1
        keras_model, _ = _bn_model()
        fused_model, _ = _bn_model()
        assert batch_norm.fuse(fused_model) == 1 and batch_norm.fused_layers(keras_model) == 0
        assert "FusedBatchNormV3" in _training_ops(fused_model, x)
        assert "FusedBatchNormV3" not in _training_ops(keras_model, x)
        expected = _train_step(keras_model, x)
        got = _train_step(fused_model, x)
        for name, a, b in zip(
            ["y", "dx", "dgamma", "dbeta", "mean", "var"], expected, got, strict=True
        ):
            a, b = np.asarray(a, "float32"), np.asarray(b, "float32")
            # y and dx pass through bfloat16 under mixed_bfloat16: one bfloat16 step apart is
            # round-off there (2**-7 relative; seen on a CPU without AVX-512)
            rtol = 2**-7 if policy == "mixed_bfloat16" and name in ("y", "dx") else 1e-5
            np.testing.assert_allclose(b, a, rtol=rtol, atol=1e-5 * np.abs(a).max(), err_msg=name)
        # inference (validation, test, export) is Keras' own code, to the bit
        fused_model.set_weights(keras_model.get_weights())
        np.testing.assert_array_equal(fused_model(x).numpy(), keras_model(x).numpy())
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_what_the_kernel_does_not_cover_stays_keras_own():
    """channels-first and 2-D inputs, renorm, a tiny epsilon and a subclass's own step are left
    alone, and a frozen layer (trainable=False) runs in inference mode: its moving statistics do not move."""
    import keras

    from tfrecipe.models import batch_norm

    for kwargs in ({"axis": 1}, {"renorm": True}, {"epsilon": 1e-6}):
        model, _ = _bn_model(**kwargs)
        assert batch_norm.fuse(model) == 0, kwargs
    dense = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
    assert batch_norm.fuse(dense) == 0

    class OwnStep(keras.layers.BatchNormalization):
        def call(self, inputs, training=None, mask=None):
            return super().call(inputs, training=training, mask=mask) * 2

    own = keras.Sequential([keras.Input((6, 6, 5)), OwnStep()])
    assert batch_norm.fuse(own) == 0
    # nested models are walked
    nested = keras.Sequential([keras.Input((6, 6, 5)), _bn_model()[0]])
    assert batch_norm.fuse(nested) == 1

    model, layer = _bn_model()
    batch_norm.fuse(model)
    layer.trainable = False
    before = layer.moving_variance.numpy().copy()
    _train_step(model, np.ones((4, 6, 6, 5), "float32"))
    np.testing.assert_array_equal(layer.moving_variance.numpy(), before)


def test_the_saved_model_names_keras_batch_normalization(tmp_path):
    """Only the instances change: model.keras loads without tfrecipe as Keras' own layer."""
    import zipfile

    import keras

    from tfrecipe.models import batch_norm

    model, _ = _bn_model()
    batch_norm.fuse(model)
    model.save(tmp_path / "m.keras")
    with zipfile.ZipFile(tmp_path / "m.keras") as archive:
        config = json.loads(archive.read("config.json"))
    layer = config["config"]["layers"][-1]
    assert (layer["module"], layer["class_name"]) == ("keras.layers", "BatchNormalization")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert type(loaded.layers[-1]) is keras.layers.BatchNormalization


@pytest.mark.parametrize(
    "where",
    [[], ["strategy=mirrored", "strategy.logical_cpus=2", "loop=custom"]],
    ids=["default-fit", "mirrored-custom"],
)
def test_a_resnet_run_trains_on_the_fused_kernel_and_says_so(train_run, where):
    """On two replicas too, where each replica updates the moving statistics as Keras' does."""
    overrides = ["model=resnet", "model.stage_filters=[4,8]", "model.blocks_per_stage=1", *where]
    summary, _ = train_run(*overrides)
    assert summary["status"] == "completed"
    # stem + 2 per block + the downsampling shortcut's
    assert summary["fused_batch_norm"] == 6
    off, _ = train_run(*overrides, "batching.fused_batch_norm=false")
    assert off["fused_batch_norm"] == 0
    # same steps on the same batches: the fused kernel's round-off only
    np.testing.assert_allclose(off["metrics"]["loss"], summary["metrics"]["loss"], rtol=1e-3)
    np.testing.assert_allclose(off["test"]["loss"], summary["test"]["loss"], rtol=1e-3)


def test_deterministic_resnet_runs_reproduce_to_the_bit(train_run):
    overrides = ["model=resnet", "model.stage_filters=[4,8]", "model.blocks_per_stage=1"]
    first, _ = train_run(*overrides, "deterministic=true")
    second, _ = train_run(*overrides, "deterministic=true")
    assert first["fused_batch_norm"] == 6
    assert first["metrics"] == second["metrics"] and first["test"] == second["test"]
