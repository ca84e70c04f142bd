"""A user's own Keras callback that records every hook call, to compare what the loops call.

Configured like any user callback:
    +callbacks.extra.rec._target_=helpers.recording_callback.RecordingCallback
    +callbacks.extra.rec.path=/tmp/calls.jsonl  allowed_targets=[helpers]
"""

from __future__ import annotations

import json
from pathlib import Path

import keras


class RecordingCallback(keras.callbacks.Callback):
    """Appends one JSON line per hook call to `path`: the hook, its batch or epoch index (None
    for begin/end of training and evaluation) and its logs; `on_train_begin` also records the
    params the loop gave the callbacks."""

    def __init__(self, path: str):
        super().__init__()
        self.path = Path(path)

    def _record(self, hook: str, index: int | None = None, logs: dict | None = None, **extra):
        with self.path.open("a") as file:
            file.write(json.dumps({"hook": hook, "index": index, "logs": logs or {}, **extra}))
            file.write("\n")

    def on_train_begin(self, logs=None):
        self._record("on_train_begin", logs=logs, params=dict(self.params))

    def on_train_end(self, logs=None):
        self._record("on_train_end", logs=logs)

    def on_epoch_begin(self, epoch, logs=None):
        self._record("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._record("on_epoch_end", epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self._record("on_train_batch_begin", batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._record("on_train_batch_end", batch, logs)

    def on_test_begin(self, logs=None):
        self._record("on_test_begin", logs=logs)

    def on_test_end(self, logs=None):
        self._record("on_test_end", logs=logs)

    def on_test_batch_begin(self, batch, logs=None):
        self._record("on_test_batch_begin", batch, logs)

    def on_test_batch_end(self, batch, logs=None):
        self._record("on_test_batch_end", batch, logs)


def read_calls(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
