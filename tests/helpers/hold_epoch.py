"""A callback that holds a run at an epoch's end until the test lets it go: it writes
`reached` into `signal_dir` (with the run dir's name) and waits for a `release` file there, so
a test can kill the process while a sweep's trial is known to be mid-training, with its first
epochs backed up. With `first_only=true` only the first run to get there is held (several
workers of one sweep: the others go on).

    +callbacks.extra.hold._target_=tests.helpers.hold_epoch.HoldAtEpoch
    +callbacks.extra.hold.epoch=2 +callbacks.extra.hold.signal_dir=DIR allowed_targets=[tests.helpers]
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import keras

RELEASE = "release"


class HoldAtEpoch(keras.callbacks.Callback):
    def __init__(self, epoch: int, signal_dir: str, first_only: bool = False):
        super().__init__()
        self.epoch, self.signal_dir, self.first_only = epoch, Path(signal_dir), first_only

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 != self.epoch or (self.signal_dir / RELEASE).exists():
            return
        reached = self.signal_dir / "reached"
        if self.first_only:
            try:  # one run claims it: the others are not held
                os.close(os.open(reached, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
        reached.write_text(f"{epoch + 1}\n")
        while not (self.signal_dir / RELEASE).exists():  # the test kills this process meanwhile
            time.sleep(0.05)
