"""Models: the `model` group's builders.

- `builders`: the small built-in networks (`mlp`, `cnn`, `resnet`), configured as
  `tfrecipe.models.mlp` etc.

Every builder takes the dataset's `input_shape` and the task's `num_outputs` (the head's width)
plus its own options and returns an uncompiled Keras model whose output is float32 with no
activation. A user's model is any function with this signature, named by `model._target_`.
"""

from tfrecipe.models.builders import cnn, mlp, resnet
from tfrecipe.models.keras_app import keras_app as keras_app  # re-exported

__all__ = ["cnn", "mlp", "resnet"]
