"""A Keras model as an ONNX file: converted by tf2onnx's Keras converter, then checked by
onnx's own checker.

Not Keras' `model.export(format="onnx")`: that hands tf2onnx `from_function`, which makes each
tensor the model's graph captures (a Normalization layer's mean and variance: the first layer
of every table's model) another graph input, and onnxruntime then refuses to run the file
without them being fed. `from_keras` freezes them into the file; the input names are the Keras
inputs' own, as Keras' exporter names them.
"""

from __future__ import annotations

import warnings
from pathlib import Path


class InvalidFile(ValueError):
    """The file onnx's checker refuses (`full_check=True`)."""


def write(model, path: Path) -> None:
    """`model` as an ONNX file at `path`, checked.

    Raises:
      InvalidFile: the converter wrote a file the checker refuses (its first line).
    """
    import keras
    import onnx
    import tensorflow as tf
    import tf2onnx

    def spec(x):
        return tf.TensorSpec(x.shape, x.dtype, name=x.name)

    # one argument, the inputs' structure (one array, or a dict of named columns), as the model
    # is called
    signature = [keras.tree.map_structure(spec, model.input)]
    with warnings.catch_warnings():  # tf2onnx probes np.object, gone in NumPy 2
        warnings.filterwarnings("ignore", "In the future `np.object`", FutureWarning)
        tf2onnx.convert.from_keras(model, input_signature=signature, output_path=str(path))
    try:
        onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    except onnx.checker.ValidationError as error:
        raise InvalidFile(str(error).strip().splitlines()[0]) from None
