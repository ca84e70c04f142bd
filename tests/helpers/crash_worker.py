"""A user callback that kills one worker of a local cluster as training starts, for the launcher's
restart tests: the crash is injected from the tests' side, the library has no hook for it."""

from __future__ import annotations

import json
import os

import keras

# Set by the launcher on every task it starts: 0 for the first attempt, 1 after one restart, ...
ATTEMPT_ENV = "TFRECIPE_CLUSTER_ATTEMPT"
EXIT_CODE = 3


class CrashWorker(keras.callbacks.Callback):
    """Exits worker `worker` with EXIT_CODE on the first `times` attempts of the cluster."""

    def __init__(self, worker: int, times: int = 1):
        super().__init__()
        self.worker, self.times = worker, times

    def on_train_begin(self, logs=None):
        task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
        attempt = int(os.environ.get(ATTEMPT_ENV, "0"))
        if task == {"type": "worker", "index": self.worker} and attempt < self.times:
            print(f"crash_worker: worker {self.worker} exits on attempt {attempt}", flush=True)
            os._exit(EXIT_CODE)  # no clean-up, like a crash
