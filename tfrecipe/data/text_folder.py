"""The user's texts, one subfolder per class: `dataset=text_folder`.

    path/neg/0001.txt  path/neg/0002.txt  path/pos/0001.txt ...

The layout of `keras.utils.text_dataset_from_directory`: classes are the subfolder names in
sorted order (label 0 = the first), each example is one `.txt` file anywhere below its class
folder. Examples are raw strings (scalar `tf.string`, `input_shape=()`): the model turns them into
tokens (`model=text`), so the exported model takes raw text too. Two classes give 0/1 labels
(`task=binary` or `classification`), more give class ids (`classification`).

The split is seeded and stratified by class, so every process and every resumed run reads the
same training texts (the text model's vocabulary is learnt from them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from tfrecipe import graph, reading
from tfrecipe.config.targets import config_target
from tfrecipe.data.listing import folder_files
from tfrecipe.data.splits import DatasetInfo, Splits, split_indices

TEXT_SUFFIX = ".txt"


@config_target
def load(
    *,
    path: str,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    split_seed: int = 0,
) -> Splits:
    """Lists `path/CLASS/**/*.txt` files and splits them (seeded, stratified).

    Args:
      path: the folder holding one subfolder per class.
      validation_fraction, test_fraction, split_seed: the held-out fractions per class.

    Raises:
      ValueError: the folder is missing, has fewer than two classes, a class without texts, a
        `.txt` entry that is not a regular file (or too large, or not UTF-8), or too few texts
        to hold the fractions out.
    """
    files, labels, classes = _list(Path(path))
    try:
        train, validation, test = split_indices(
            labels, validation_fraction, test_fraction, split_seed
        )
    except ValueError as error:  # e.g. too few texts in a class to hold some out
        raise ValueError(f"{path}: cannot split the texts ({error})") from None
    info = DatasetInfo(
        input_shape=(),
        num_classes=len(classes),
        num_train=len(train),
        num_validation=len(validation),
        num_test=len(test),
        class_names=tuple(classes),  # the folders' names, for predictions (signature.json)
        target_kind="binary" if len(classes) == 2 else "classes",
        targets=labels,
    )
    return Splits(*(_texts(files, labels, idx) for idx in (train, validation, test)), info)


def _texts(files: np.ndarray, labels: np.ndarray, indices: np.ndarray) -> tf.data.Dataset | None:
    """The texts at `indices` with their labels; None when there are none."""
    if len(indices) == 0:
        return None
    dataset = tf.data.Dataset.from_tensor_slices((files[indices], labels[indices]))
    # Read lazily (a corpus may be large); the pipeline's cache keeps what was read.
    return dataset.map(
        graph.plain(lambda file, label: (tf.io.read_file(file), label)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def _list(root: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(files, labels, class names) under `root`."""
    if not root.is_dir():
        raise ValueError(f"{root}: no such folder (dataset.path={str(root)!r})")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise ValueError(
            f"{root}: needs one subfolder of {TEXT_SUFFIX} files per class (at least 2), "
            f"found {classes or 'none'}"
        )
    files, labels = [], []
    for label, name in enumerate(classes):
        # every .txt entry but folders and hidden ones (the list the fingerprint takes too): a
        # link to /dev/zero, a FIFO or a device is refused, not skipped; each is read once as
        # UTF-8, as the vocabulary saved in model.keras must be (other bytes failed the export,
        # after the training)
        texts = [str(p) for p in folder_files(root / name, (TEXT_SUFFIX,))]
        for text in texts:
            reading.read_text(text, limit=reading.MAX_TEXT_BYTES, what="a text example")
        if not texts:
            raise ValueError(f"{root / name}: class folder holds no {TEXT_SUFFIX} files")
        files += texts
        labels += [label] * len(texts)
    return np.array(files), np.array(labels, dtype="int32"), classes
