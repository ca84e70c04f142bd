"""BatchNormalization's training step on TensorFlow's fused kernel (`batching.fused_batch_norm`).

Keras 3 trains a BatchNormalization layer from separate ops: mean, squared difference,
broadcasts, the normalization, and under mixed precision a cast to float32 and back, each with
its own gradient (keras-team/keras-core#225, "BatchNorm is slow"). tf.keras used TensorFlow's one
fused kernel, `FusedBatchNormV3` (oneDNN's on x86), which also fuses with the following ReLU.
On this project's 2-core CPU the separate ops are ~30% of a small ResNet's step in float32 and
more in mixed_bfloat16, where the casts come on top (docs/benchmarks.md).

`fuse(model)` moves each eligible layer's training step onto the fused kernel with Keras'
semantics: batch statistics normalize, and the moving statistics follow the biased batch
variance at the layer's momentum. Everything else stays Keras' own code: inference
(validation, test, export), a frozen layer (it runs in inference mode), anything the kernel does
not cover (a mask, renorm, synchronized statistics, an axis other than the last of a 4-D or 5-D
input, float64) and a subclass that brings its own `call`. Only the instances change, not their
class, so model.keras still names `keras.layers.BatchNormalization` and loads anywhere.
"""

from __future__ import annotations

import types

# FusedBatchNormV3 raises epsilon to this minimum; a smaller one keeps Keras' ops.
_MIN_EPSILON = 1.001e-5
_FUSED_DTYPES = ("float16", "bfloat16", "float32")


def fuse(model) -> int:
    """Gives every eligible BatchNormalization layer in `model` (nested models included) the
    fused training step; returns how many. A no-op off the TensorFlow backend."""
    import keras

    from tfrecipe.models.freeze import all_layers

    if keras.backend.backend() != "tensorflow":
        return 0
    fused = 0
    for layer in all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization) and _eligible(layer):
            layer.call = types.MethodType(_call, layer)
            fused += 1
    return fused


def _eligible(layer) -> bool:
    import keras

    if type(layer).call is not keras.layers.BatchNormalization.call:
        return False  # a subclass with its own step: that step is the point of it
    if not layer.built or layer.input_spec is None or layer.input_spec.ndim not in (4, 5):
        return False
    rank = layer.input_spec.ndim
    return (
        layer.axis in (-1, rank - 1)
        and not layer.renorm
        and not layer.synchronized
        and layer.epsilon >= _MIN_EPSILON
    )


def _call(layer, inputs, training=None, mask=None):
    """BatchNormalization.call, with the training step of a trainable layer fused."""
    if not (training and layer.trainable) or mask is not None or inputs.dtype not in _FUSED_DTYPES:
        return type(layer).call(layer, inputs, training=training, mask=mask)
    import tensorflow as tf

    channels = inputs.shape[-1]
    scale = tf.cast(layer.gamma, "float32") if layer.scale else tf.ones([channels])
    offset = tf.cast(layer.beta, "float32") if layer.center else tf.zeros([channels])
    outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
        inputs,
        scale,
        offset,
        epsilon=layer.epsilon,
        data_format="NHWC" if len(inputs.shape) == 4 else "NDHWC",
        is_training=True,
    )
    # The kernel returns the unbiased (Bessel-corrected) batch variance; Keras' moving variance
    # follows the biased one.
    count = tf.cast(tf.size(inputs, out_type=tf.int64) // channels, "float32")
    variance = variance * ((count - 1.0) / tf.maximum(count, 1.0))
    momentum = layer.momentum
    layer.moving_mean.assign(layer.moving_mean * momentum + mean * (1.0 - momentum))
    layer.moving_variance.assign(layer.moving_variance * momentum + variance * (1.0 - momentum))
    return outputs


def fused_layers(model) -> int:
    """How many of `model`'s layers train on the fused kernel (summary.json)."""
    from tfrecipe.models.freeze import all_layers

    return sum(
        isinstance(layer.call, types.MethodType) and layer.call.__func__ is _call
        for layer in all_layers(model)
    )
