"""tfrecipe.weights_file: the weights file `BestCheckpoint` writes beside training is the file
`keras.saving.save_weights` writes, holds the values of the moment it was asked for, and fails
where the training thread sees it. Real Keras models and files; no training (seconds)."""

from __future__ import annotations

import os
import sys
import threading

import h5py
import keras
import numpy as np
import pytest

from tfrecipe import files, weights_file
from tfrecipe.weights_file import WeightsWriter


def _model(lora: bool = False) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 1))
    h = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    h = keras.layers.BatchNormalization(name="norm")(h)
    inner = keras.Sequential([keras.layers.Dense(5, name="inner_dense")], name="inner")
    h = inner(keras.layers.Flatten()(h))
    dense = keras.layers.Dense(3, name="head")
    model = keras.Model(inputs, dense(h))
    if lora:
        dense.enable_lora(2)
        dense.lora_kernel_b.assign(np.full((2, 3), 0.5, "float32"))  # merged into the kernel
    model.compile("adam", "mse")
    model.fit(np.ones((4, 6, 6, 1)), np.ones((4, 3)), verbose=0)  # the optimizer has state
    return model


def _contents(path) -> dict:
    """Every group and dataset of an h5 file: its attributes and its values."""
    found = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, o: found.setdefault(name, (dict(o.attrs), _value(o))))
    return found


def _value(item):
    return item[()].tolist() if isinstance(item, h5py.Dataset) else None


@pytest.mark.parametrize("lora", [False, True], ids=["variables", "lora-merged-kernel"])
def test_the_written_file_is_the_one_keras_writes_and_loads_back(tmp_path, lora):
    model = _model(lora)
    keras.saving.save_weights(
        model, tmp_path / "keras.weights.h5", objects_to_skip=[model.optimizer]
    )
    writer = WeightsWriter(model, tmp_path / "ours.weights.h5")
    writer.save()
    writer.wait()
    assert _contents(tmp_path / "ours.weights.h5") == _contents(tmp_path / "keras.weights.h5")
    if lora:  # Keras loads a merged kernel as the kernel itself
        return
    again = _model()
    for weight in again.weights:
        weight.assign(np.zeros(weight.shape, weight.dtype))
    again.load_weights(tmp_path / "ours.weights.h5")
    for ours, theirs in zip(again.weights, model.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("lora", [False, True], ids=["variables", "lora-merged-kernel"])
def test_held_values_are_written_in_place_of_the_weights_they_stand_for(tmp_path, lora):
    model = _model(lora)
    before = [w.numpy() for w in model.weights]
    held = {id(w): keras.Variable(np.full(w.shape, 7.0, w.dtype)) for w in model.weights}
    writer = WeightsWriter(model, tmp_path / "best.weights.h5")
    writer.save(held)
    writer.wait()
    for weight, value in zip(model.weights, before, strict=True):  # the model's own are back
        np.testing.assert_array_equal(weight.numpy(), value)
    for weight in model.weights:
        weight.assign(np.full(weight.shape, 7.0, weight.dtype))
    keras.saving.save_weights(
        model, tmp_path / "keras.weights.h5", objects_to_skip=[model.optimizer]
    )
    assert _contents(tmp_path / "best.weights.h5") == _contents(tmp_path / "keras.weights.h5")


def test_the_file_holds_the_values_of_the_save_not_of_the_write(tmp_path, monkeypatch):
    """Training goes on while the thread writes: the save returns before the file is written, and
    what the model learns meanwhile is not in it."""
    gate, write = threading.Event(), weights_file._write
    monkeypatch.setattr(weights_file, "_write", lambda *a: (gate.wait(), write(*a)))
    model, path = _model(), tmp_path / "best.weights.h5"
    saved = [w.numpy() for w in model.weights]
    writer = WeightsWriter(model, path)
    writer.save()
    assert not path.exists()  # the save did not wait for the disk
    for weight in model.weights:  # the next epoch's training
        weight.assign(weight.numpy() + 1)
    gate.set()
    writer.wait()
    written = keras.models.clone_model(model)
    written.load_weights(path)
    for weight, value in zip(written.weights, saved, strict=True):
        np.testing.assert_array_equal(weight.numpy(), value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own priority")
def test_the_file_is_written_behind_training_at_the_lowest_priority(tmp_path, monkeypatch):
    """The writer thread takes the cores only where training leaves them idle (nice 19); the
    training thread keeps its priority."""
    seen, write = [], weights_file._write

    def recorded(*args):
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        write(*args)

    monkeypatch.setattr(weights_file, "_write", recorded)
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    writer = WeightsWriter(_model(), tmp_path / "best.weights.h5")
    writer.save()
    writer.wait()
    assert seen == [19] and (tmp_path / "best.weights.h5").exists()
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_a_run_dir_is_released_once_its_last_write_has_landed_and_is_listed(tmp_path, monkeypatch):
    """A run that fails while its best weights are being written gives its dir back only once
    the file is there and in its manifest: its resume may replace the file."""
    gate, write = threading.Event(), weights_file._write
    monkeypatch.setattr(weights_file, "_write", lambda *a: (gate.wait(), write(*a)))
    manifest, path = files.Manifest.of(tmp_path), tmp_path / "best.weights.h5"
    manifest.own()
    writer = WeightsWriter(_model(), path)
    writer.save()  # the thread waits at the gate: the write is still to come
    releasing = threading.Thread(target=manifest.release)  # the failed run's end
    releasing.start()
    gate.set()
    releasing.join()
    assert path.exists() and manifest.owns(path)
    writer.wait()


def test_a_runs_end_clears_partial_files_only_once_its_last_write_has_landed(tmp_path, monkeypatch):
    """A preempted run ends (summary.json "preempted", the partial files of interrupted writes
    removed) while its best weights may still be on their way: their scratch folder is the
    writer's until the file is in its place (removed under it, the run's best.weights.h5 was
    lost and a resume kept no best epoch's weights)."""
    from tfrecipe.fault import disk

    written, gate, put = threading.Event(), threading.Event(), files.put
    monkeypatch.setattr(files, "put", lambda *a: (written.set(), gate.wait(), put(*a)))
    manifest, path = files.Manifest.of(tmp_path), tmp_path / "best.weights.h5"
    manifest.own()
    writer = WeightsWriter(_model(), path)
    writer.save()
    assert written.wait(30)  # the file is in its scratch folder, to be put in place
    ending = threading.Thread(target=disk.settle, args=(tmp_path,))  # the run's summary
    ending.start()
    ending.join(1)  # it waits for the write
    gate.set()
    ending.join()
    writer.wait()
    assert path.is_file() and manifest.owns(path)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_link_in_the_files_place_is_refused_at_the_save(tmp_path):
    target = tmp_path / "elsewhere.h5"
    target.write_bytes(b"not yours")
    (tmp_path / "best.weights.h5").symlink_to(target)
    with pytest.raises(files.NotOurs, match="symbolic link"):
        WeightsWriter(_model(), tmp_path / "best.weights.h5").save()
    assert target.read_bytes() == b"not yours"


def test_a_write_that_fails_on_the_thread_fails_the_next_save_or_wait(tmp_path):
    (tmp_path / "a_file").write_text("")
    writer = WeightsWriter(_model(), tmp_path / "a_file" / "best.weights.h5")
    writer.save()  # its folder cannot be made: a file is in the way
    with pytest.raises(OSError):
        writer.wait()
    writer.wait()  # reported once
