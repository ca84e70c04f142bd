"""A callback that holds a run at an epoch's end until the test lets it go: it writes
`reached` into `signal_dir` (with the run dir's name) and waits for a `release` file there, so
a test can kill the process while a sweep's trial is known to be mid-training, with its first
epochs backed up.

    +callbacks.extra.hold._target_=tests.helpers.hold_epoch.HoldAtEpoch
    +callbacks.extra.hold.epoch=2 +callbacks.extra.hold.signal_dir=DIR allowed_targets=[tests.helpers]
"""

from __future__ import annotations

import time
from pathlib import Path

import keras

RELEASE = "release"


class HoldAtEpoch(keras.callbacks.Callback):
    def __init__(self, epoch: int, signal_dir: str):
        super().__init__()
        self.epoch, self.signal_dir = epoch, Path(signal_dir)

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 != self.epoch or (self.signal_dir / RELEASE).exists():
            return
        (self.signal_dir / "reached").write_text(f"{epoch + 1}\n")
        while not (self.signal_dir / RELEASE).exists():  # the test kills this process meanwhile
            time.sleep(0.05)
