"""A user's Keras callback that breaks training, for failure-path tests."""

import keras


class FailAfterFirstEpoch(keras.callbacks.Callback):
    def __init__(self, **options):  # accepts any options (tests pass secrets through them)
        super().__init__()
        self.options = options

    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("deliberate failure after the first epoch")


class Quiet(keras.callbacks.Callback):
    def __init__(self, **options):
        super().__init__()
        self.options = options
