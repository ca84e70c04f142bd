"""The user's images, one subfolder per class: `dataset=image_folder`.

    path/cat/0001.jpg  path/cat/0002.png  path/dog/0001.jpg  path/dog/2024/0002.jpg ...

Classes are the subfolder names in sorted order (label 0 = the first); a class's examples are
the images anywhere below its folder (hidden files and folders left out). Images are decoded and
resized to `image_size` by the input pipeline; with `verify_images` every image is decoded once
at start-up, so a corrupt file stops the run with its name instead of crashing training later
(about a millisecond per small image: turn it off for very large folders).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf

from tfrecipe import graph, reading
from tfrecipe.config.targets import config_target
from tfrecipe.data.listing import folder_files
from tfrecipe.data.splits import DatasetInfo, Splits, split_indices

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp")


@config_target
def load(
    *,
    path: str,
    image_size: Sequence[int] = (64, 64),
    channels: int = 3,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    split_seed: int = 0,
    verify_images: bool = True,
) -> Splits:
    """Lists `path/CLASS/**/IMAGE` files and splits them (seeded, stratified).

    Args:
      path: the folder holding one subfolder per class.
      image_size: [height, width] every image is resized to (aspect ratio not kept).
      channels: 1 (grey) or 3 (RGB); images are converted.
      validation_fraction, test_fraction, split_seed: the held-out fractions per class.
      verify_images: decode every image once at start-up.

    Raises:
      ValueError: the folder is missing, has fewer than two classes, a class without images,
        or (with `verify_images`) an image that cannot be decoded.
    """
    _check_image_shape(image_size, channels)
    files, labels, classes = _list(Path(path))
    if verify_images:
        _verify(files, channels)
    train, validation, test = split_indices(labels, validation_fraction, test_fraction, split_seed)
    datasets = [
        _images(files, labels, idx, image_size, channels) for idx in (train, validation, test)
    ]
    info = DatasetInfo(
        input_shape=(*image_size, channels),
        num_classes=len(classes),
        num_train=len(train),
        num_validation=len(validation),
        num_test=len(test),
        class_names=tuple(classes),  # the folders' names, for predictions (signature.json)
    )
    return Splits(*datasets, info)


def _check_image_shape(image_size: Sequence[int], channels: int) -> None:
    if len(image_size) != 2 or min(image_size) <= 0 or channels not in (1, 3):
        raise ValueError(
            f"image_size must be [height, width] > 0 and channels 1 or 3, received "
            f"image_size={list(image_size)}, channels={channels}"
        )


def _images(
    files: np.ndarray,
    labels: np.ndarray,
    indices: np.ndarray,
    image_size: Sequence[int],
    channels: int,
) -> tf.data.Dataset | None:
    """The images at `indices` with their labels, decoded and resized as they are read; None
    when there are none."""
    if len(indices) == 0:
        return None
    height, width = image_size
    dataset = tf.data.Dataset.from_tensor_slices((files[indices], labels[indices]))
    return dataset.map(
        graph.plain(lambda file, label: (_load_image(file, channels, height, width), label)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def _list(root: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(files, labels, class names) under `root`."""
    if not root.is_dir():
        raise ValueError(f"{root}: no such folder (path={str(root)!r})")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise ValueError(
            f"{root}: needs one subfolder per class (at least 2), found {classes or 'none'}"
        )
    files, labels = [], []
    for label, name in enumerate(classes):
        # every image below the class folder, in its subfolders too (as Keras'
        # image_dataset_from_directory and `tfrecipe predict` read a folder), hidden ones left
        # out as the fingerprint leaves them
        images = [str(p) for p in folder_files(root / name, IMAGE_SUFFIXES)]
        for image in images:
            _check_file(Path(image))
        if not images:
            raise ValueError(
                f"{root / name}: class folder holds no images ({', '.join(IMAGE_SUFFIXES)})"
            )
        files += images
        labels += [label] * len(images)
    return np.array(files), np.array(labels, dtype="int32"), classes


MAX_IMAGE_BYTES = reading.MAX_IMAGE_BYTES


def _check_file(path: Path) -> None:
    """Refuses what is not a regular file of a sensible size, before anything reads it: a link
    to /dev/zero or a FIFO would be read forever (until the OOM killer ends the run)."""
    reading.check_file(path, limit=MAX_IMAGE_BYTES, what="an image of a training set")


def _verify(files: np.ndarray, channels: int) -> None:
    """Decodes every image once: the first that cannot be decoded stops the run, named."""
    for file in files:
        try:
            decode(tf.io.read_file(file), channels)
        except tf.errors.OpError as error:
            reason = reading.op_reason(error)
            raise ValueError(f"{file}: not a readable image ({reason})") from None


def decode(data: tf.Tensor, channels: int) -> tf.Tensor:
    """An encoded image's pixels with `channels` channels (training's and predict's decoder).
    TensorFlow decodes a GIF to RGB only (channels=1 is refused): a GIF turns grey after."""
    if channels != 1:
        return tf.io.decode_image(data, channels=channels, expand_animations=False)
    return tf.cond(
        tf.strings.substr(data, 0, 3) == b"GIF",
        lambda: tf.image.rgb_to_grayscale(
            tf.io.decode_image(data, channels=3, expand_animations=False)
        ),
        lambda: tf.io.decode_image(data, channels=1, expand_animations=False),
    )


def _load_image(file: tf.Tensor, channels: int, height: int, width: int) -> tf.Tensor:
    image = decode(tf.io.read_file(file), channels)
    image = tf.image.resize(image, [height, width])
    # Back to uint8: the pipeline's `normalize` then scales it like any other image.
    return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
