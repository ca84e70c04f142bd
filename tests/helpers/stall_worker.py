"""A user callback that hangs one worker of a cluster after a given step (no error, no exit: the
hang of a worker stuck in a collective), for the progress watchdog's tests. The hang is injected
from the tests' side; the library has no hook for it.

    +callbacks.extra.stall._target_=tests.helpers.stall_worker.StallWorker
    +callbacks.extra.stall.worker=1 +callbacks.extra.stall.after_step=2
"""

from __future__ import annotations

import json
import os
import time

import keras

from tests.helpers.crash_worker import ATTEMPT_ENV


class StallWorker(keras.callbacks.Callback):
    """Sleeps for an hour on worker `worker` once `after_step` training steps are done, on the
    first `times` attempts of the cluster."""

    def __init__(self, worker: int, after_step: int, times: int = 1):
        super().__init__()
        self.worker, self.after_step, self.times = worker, after_step, times
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
        attempt = int(os.environ.get(ATTEMPT_ENV, "0"))
        mine = task == {"type": "worker", "index": self.worker}
        if mine and attempt < self.times and self.steps == self.after_step:
            print(f"stall_worker: worker {self.worker} hangs after step {self.steps}", flush=True)
            time.sleep(3600)
