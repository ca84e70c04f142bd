"""A model's `.weights.h5` written beside training: the values read at once, the file by a thread.

`keras.saving.save_weights` walks the model, then writes each weight into an HDF5 file on the
calling thread: 11-15 ms a save for the digits MLP and CNN on the 2-core Xeon, where
`BestCheckpoint` saves after most epochs (10-16% of their steady epochs' wall time, beside the
steps; docs/performance.md).
`WeightsWriter` walks the model once, with Keras' own walk (`compat.saved_weights_walk`), and keeps
where each variable goes. A save reads the values the file should hold, then a writer thread
writes them in that layout through Keras' own store (`H5IOStore`), so the file is the one
`save_weights` writes (tests/test_weights_file.py compares them). The thread writes through
`files.replace_with`: the previous file stays whole until the new one is complete, and a link
planted in its place is refused at the save, on the training thread.

A model whose walk stores values that are not its variables (a LoRA layer stores its merged kernel)
is walked at each save instead, the values read during the walk.

The writer thread runs at the lowest CPU priority (`_behind_training`): on a machine whose cores
the steps keep busy, a write of 5-9 ms beside a call of 20-30 ms (the wine recipe's groups of
epochs) slowed that call; behind it, the wine recipe trained at 84.0k examples/s against 73.4k
(medians of 8 alternated runs; docs/benchmarks.md, "A twenty-second pass").
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np

from tfrecipe import compat, files

# (the walk's inner path, the saveable's metadata, {key: a variable, or its value})
Entry = tuple[str, dict | None, dict[str, Any]]


class _Recording:
    """What the walk stores, in its order (built as a subclass of Keras' in-memory store, the
    only kind the walk accepts)."""

    def __init__(self):
        self.mode, self.entries = "w", []

    def make(self, path: str, metadata: dict | None = None) -> dict[str, Any]:
        self.entries.append((path, metadata, {}))
        return self.entries[-1][2]


def _walk(model: keras.Model) -> list[Entry]:
    store_class = type("Recording", (_Recording, compat.saving_private("NpzIOStore")), {})
    store = store_class()
    optimizer = getattr(model, "optimizer", None)
    compat.saved_weights_walk(model, store, [optimizer] if optimizer is not None else [])
    return store.entries


class WeightsWriter:
    """Writes `model`'s weights to `path`, each file on a thread of its own, one at a time.

    `save` returns once the values are read; `wait` until the file is on disk (a write's error is
    raised at the next `save` or `wait`). The thread is not a daemon: a process that exits
    finishes the write first."""

    def __init__(self, model: keras.Model, path: Path):
        self.model, self.path = model, path
        self._layout: list[Entry] | None = None  # where each variable goes: walked once
        self._by_variable = True  # False: the walk stores other values; walked at each save
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, held: Mapping[int, Any] | None = None) -> None:
        """Saves the model's weights, each variable `v` as `held[id(v)]` where given (the best
        epoch's copy, a moving average), as the model holds it otherwise."""
        self.wait()
        run_dir = files.check_writable(self.path)  # a planted link: refused here, not on the thread
        entries = self._read(held or {})
        self._thread = threading.Thread(
            target=self._write, args=(entries,), name="tfrecipe-weights"
        )
        files.start_writer(self._thread, run_dir)  # the run dir's release waits for it

    def wait(self) -> None:
        """Until the last save is written; its error, if it failed, is raised here."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _write(self, entries: list[Entry]) -> None:
        _behind_training()
        try:
            _write(self.path, entries)
        except BaseException as error:  # raised on the training thread, at `wait`
            self._error = error

    def _read(self, held: Mapping[int, Any]) -> list[Entry]:
        if self._layout is None:
            self._layout = _walk(self.model)
            self._by_variable = all(
                isinstance(value, keras.Variable)
                for _, _, values in self._layout
                for value in values.values()
            )
        if not self._by_variable:
            with _holding(self.model, held):
                return _values(_walk(self.model), {})
        return _values(self._layout, held)


def _behind_training() -> None:
    """Gives the calling thread the lowest CPU priority (nice 19), where a thread has its own
    (Linux); the training threads then take the cores first. Elsewhere, as it is."""
    if sys.platform.startswith("linux"):  # elsewhere a thread's id may name another process
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _values(layout: list[Entry], held: Mapping[int, Any]) -> list[Entry]:
    def read(value):
        return keras.ops.convert_to_numpy(held.get(id(value), value))

    return [(path, meta, {k: read(v) for k, v in values.items()}) for path, meta, values in layout]


@contextlib.contextmanager
def _holding(model: keras.Model, held: Mapping[int, Any]) -> Iterator[None]:
    """The model's variables hold `held`'s values meanwhile, their own afterwards."""
    swapped = [w for w in model.weights if id(w) in held]
    kept = [np.array(keras.ops.convert_to_numpy(w)) for w in swapped]
    for weight in swapped:
        weight.assign(held[id(weight)])
    try:
        yield
    finally:
        for weight, value in zip(swapped, kept, strict=True):
            weight.assign(value)


def _write(path: Path, entries: list[Entry]) -> None:
    with files.replace_with(path) as scratch:
        store = compat.saving_private("H5IOStore")(str(scratch), mode="w")
        try:
            for inner_path, metadata, values in entries:
                entry = store.make(inner_path, metadata=metadata)
                for key, value in values.items():
                    entry[key] = value
        finally:  # the file closed before replace_with removes a failed one
            store.close()
