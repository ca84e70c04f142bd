"""A user's Keras callback that breaks training, for failure-path tests."""

import keras

# A run's overrides that make it fail after its first epoch (PYTHONPATH holds tests/).
FAILING = [
    "+callbacks.extra.boom._target_=helpers.failing_callback.FailAfterFirstEpoch",
    "allowed_targets=[helpers]",
]


def fail_after_first_epoch(compose_cfg, run_dir, overrides: list[str]) -> None:
    """Trains `overrides` into `run_dir` with FailAfterFirstEpoch (`compose_cfg`: the fixture);
    returns once train() failed as it should, its backups and summary.json left behind."""
    import pytest

    from tfrecipe.config.trust import Trust
    from tfrecipe.train import TrainingError, train

    args = [*overrides, *FAILING]
    with pytest.raises(TrainingError, match="deliberate failure"):
        train(compose_cfg(*args), run_dir=run_dir, trust=Trust.from_command_line(args))


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
