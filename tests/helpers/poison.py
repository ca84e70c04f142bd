"""A Keras callback that makes the weights NaN after a given step: an injected loss blow-up."""

import keras


class PoisonWeightsAtStep(keras.callbacks.Callback):
    def __init__(self, step: int):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == self.step:
            for variable in self.model.trainable_variables:
                variable.assign(keras.ops.full(variable.shape, float("nan"), variable.dtype))
