"""Tiny data files written by tests: TFRecord, NPZ and image folders (real formats, few examples)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def images(
    n: int, size: int = 8, channels: int = 1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """n uint8 images whose mean brightness tells the class (2 classes: learnable)."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) % 2).astype("int64")
    base = np.where(labels[:, None, None, None] == 1, 200, 40)
    noise = rng.integers(-30, 30, size=(n, size, size, channels))
    return (base + noise).clip(0, 255).astype("uint8"), labels


def write_tfrecord(
    path: Path,
    n: int,
    *,
    kind: str = "image",
    size: int = 8,
    channels: int = 1,
    first_id: int = 0,
    label_offset: int = 0,
    feature_key: str = "image",
) -> Path:
    """n tf.train.Examples: PNG images (kind="image") or float vectors [id, ...] (kind="float";
    the first value is the example's id, for tests that track examples)."""
    import tensorflow as tf

    pixels, labels = images(n, size, channels, seed=first_id)
    gzip = str(path).endswith(".gz")  # as TFX and Beam write them
    with tf.io.TFRecordWriter(str(path), options="GZIP" if gzip else None) as writer:
        for i in range(n):
            if kind == "image":
                png = tf.io.encode_png(pixels[i]).numpy()
                feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[png]))
            else:
                values = [float(first_id + i), float(labels[i])]
                feature = tf.train.Feature(float_list=tf.train.FloatList(value=values))
            label = tf.train.Feature(
                int64_list=tf.train.Int64List(value=[labels[i] + label_offset])
            )
            example = tf.train.Example(
                features=tf.train.Features(feature={feature_key: feature, "label": label})
            )
            writer.write(example.SerializeToString())
    return path


def write_npz(path: Path, n: int, *, x_key: str = "x", y_key: str = "y", label_offset: int = 0):
    pixels, labels = images(n)
    np.savez(path, **{x_key: pixels, y_key: labels + label_offset})
    return path


def write_image_folder(root: Path, per_class: int = 6, size: int = 12) -> Path:
    """root/dark/*.png and root/light/*.png (+ one JPEG each)."""
    import tensorflow as tf

    pixels, labels = images(2 * per_class, size, channels=3)
    for i, (image, label) in enumerate(zip(pixels, labels, strict=True)):
        folder = root / ("light" if label else "dark")
        folder.mkdir(parents=True, exist_ok=True)
        encode = tf.io.encode_jpeg if i < 2 else tf.io.encode_png
        (folder / f"{i:03d}.{'jpg' if i < 2 else 'png'}").write_bytes(encode(image).numpy())
    return root
