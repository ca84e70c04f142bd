"""A Keras callback that makes the weights NaN after a given step: an injected loss blow-up."""

from pathlib import Path

import keras


class PoisonWeightsAtStep(keras.callbacks.Callback):
    """Poisons the weights whenever `optimizer.iterations == step` (also when a rollback replays
    that step), or only the first time when `once_file` is given (created then)."""

    def __init__(self, step: int, once_file: str | None = None):
        super().__init__()
        self.step = step
        self.once_file = Path(once_file) if once_file else None

    def on_train_batch_end(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) != self.step:
            return
        if self.once_file is not None:
            if self.once_file.exists():
                return
            self.once_file.touch()
        for variable in self.model.trainable_variables:
            variable.assign(keras.ops.full(variable.shape, float("nan"), variable.dtype))
