"""Models: the `model` group's builders.

- `builders`: the small built-in networks (`linear`, `mlp`, `cnn`, `resnet`), configured as
  `tfrecipe.models.mlp` etc.
- `keras_app`: any `keras.applications` network as a backbone under the task's head.
- `text`: a text classifier on raw strings (`model=text`; its vectorizer is part of the model).
- `freeze`: `model.freeze` and fine-tuning's unfreeze; `warm_start`: `model.init_from`.

Every builder takes the dataset's `input_shape` and the task's `num_outputs` (the head's width)
plus its own options and returns an uncompiled Keras model whose output is float32 with no
activation. A user's model is any function with this signature, named by `model._target_`.
"""

from tfrecipe.models import ensemble as ensemble  # registers MeanOfMembers
from tfrecipe.models.builders import cnn, linear, mlp, resnet
from tfrecipe.models.keras_app import keras_app
from tfrecipe.models.text import text

__all__ = ["cnn", "keras_app", "linear", "mlp", "resnet", "text"]
