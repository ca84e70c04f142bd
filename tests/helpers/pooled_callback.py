"""A user's callback that hands each epoch's logs to a module's thread pool that nobody shuts
down (an uploader's, say; joblib keeps one too): its idle worker thread is alive when the run
ends.

    +callbacks.extra.pool._target_=tests.helpers.pooled_callback.PooledCallback
    +callbacks.extra.pool.path=/tmp/epochs.jsonl  allowed_targets=[tests.helpers]
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import keras

UPLOADS = ThreadPoolExecutor(max_workers=1)


class PooledCallback(keras.callbacks.Callback):
    def __init__(self, path: str):
        super().__init__()
        self.path = Path(path)

    def on_epoch_end(self, epoch, logs=None):
        line = json.dumps({"epoch": epoch, "loss": float(logs["loss"])})
        UPLOADS.submit(self._append, line)

    def _append(self, line: str) -> None:
        with self.path.open("a") as file:
            file.write(line + "\n")
