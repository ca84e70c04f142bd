"""A user's model builder that fails the way a too-large model does (TensorFlow's out-of-memory
error), for tests of failures before training starts."""

import tensorflow as tf


def out_of_memory(*, input_shape, num_outputs):
    raise tf.errors.ResourceExhaustedError(
        None, None, "OOM when allocating tensor with shape[100000,100000]"
    )
