"""The user's TFRecord files of `tf.train.Example`s: `dataset=tfrecord`.

Each example holds the input under `feature_key` — encoded image bytes (PNG, JPEG, GIF, BMP;
decoded) or a fixed-shape float or int tensor — and an integer class label under `label_key`.

The files are checked when the dataset is built, so that a bad file stops the run with a config
error naming it instead of crashing training later: every record of every file is read and
parsed (this catches missing, truncated or corrupt files, wrong keys, wrong tensor sizes and
labels out of range, and counts the examples, which the epoch length needs anyway), and the
first `images_checked_per_file` images of each file are decoded (a wrong image format shows on
the first). Decoding every image would double the start-up cost on large data; a corrupt image
beyond the first ones still fails, later, with TensorFlow's message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import tensorflow as tf

from tfrecipe import graph, reading
from tfrecipe.config.targets import config_target
from tfrecipe.data import image_folder
from tfrecipe.data.splits import DatasetInfo, Splits
from tfrecipe.data.values import check_finite_array

FeatureKind = Literal["image", "float", "int"]


@config_target
def load(
    *,
    train_files: str | Sequence[str],
    validation_files: str | Sequence[str] | None = None,
    test_files: str | Sequence[str] | None = None,
    feature_key: str = "image",
    feature_kind: FeatureKind = "image",
    feature_shape: Sequence[int],
    label_key: str = "label",
    num_classes: int,
    images_checked_per_file: int = 8,
) -> Splits:
    """Reads TFRecord files, one glob (or list of globs) per split.

    Args:
      train_files, validation_files, test_files: glob patterns (`data/train-*.tfrecord`);
        validation and test are optional.
      feature_key, feature_kind, feature_shape: the input feature: "image" (encoded bytes
        decoded to `feature_shape` = [height, width, channels]) or a "float"/"int" tensor of
        `feature_shape` (stored flat, as `tf.train.FloatList`/`Int64List`).
      label_key, num_classes: the int64 class label, in [0, num_classes).
      images_checked_per_file: images decoded per file while checking the files.

    Raises:
      ValueError: a glob matches nothing, or a file is unreadable or does not match the spec.
    """
    spec = _Spec(feature_key, feature_kind, tuple(feature_shape), label_key, num_classes)
    spec.check()
    globs = {"train": train_files, "validation": validation_files, "test": test_files}
    splits = {
        s: _checked_split(s, glob, spec, images_checked_per_file) for s, glob in globs.items()
    }
    info = DatasetInfo(
        input_shape=spec.shape,
        num_classes=num_classes,
        num_train=splits["train"][1],
        num_validation=splits["validation"][1],
        num_test=splits["test"][1],
    )
    return Splits(*(dataset for dataset, _ in splits.values()), info)


def _checked_split(
    split: str, pattern: str | Sequence[str] | None, spec: _Spec, images_checked_per_file: int
) -> tuple[tf.data.Dataset | None, int]:
    """(dataset, number of examples) of one split's files, every record checked first; (None, 0)
    for a validation or test split without files."""
    if pattern is None and split != "train":
        return None, 0
    files = _glob(f"{split}_files", pattern)
    compression = _compression(f"{split}_files", pattern, files)
    count = sum(_check_file(path, spec, images_checked_per_file, compression) for path in files)
    return _read(files, spec, count, compression), count


def compression_of(file: str) -> str:
    """TFRecordDataset's compression_type for `file`: GZIP for `.gz`, none otherwise."""
    return "GZIP" if file.lower().endswith(".gz") else ""


def _compression(key: str, pattern: str | Sequence[str], files: list[str]) -> str:
    """GZIP for `.gz` files (as TFX and Beam write them), none otherwise: one for all of a
    split's files, which one reader reads."""
    kinds = {compression_of(file) for file in files}
    if len(kinds) > 1:
        raise ValueError(
            f"{key}={pattern!r}: mixes .gz files with uncompressed ones; one split's files are "
            "all gzipped (.gz) or none"
        )
    return kinds.pop()


class _Spec:
    """How to parse and decode one example."""

    def __init__(
        self, key: str, kind: str, shape: tuple[int, ...], label_key: str, num_classes: int
    ):
        self.key, self.kind, self.shape = key, kind, shape
        self.label_key, self.num_classes = label_key, num_classes

    def check(self) -> None:
        if self.kind not in ("image", "float", "int"):
            raise ValueError(f"feature_kind must be image, float or int, received {self.kind!r}")
        if not self.shape or min(self.shape) <= 0:
            raise ValueError(f"feature_shape must be positive, received {list(self.shape)}")
        if self.kind == "image" and (len(self.shape) != 3 or self.shape[2] not in (1, 3, 4)):
            raise ValueError(
                "feature_kind=image needs feature_shape=[height, width, channels] with 1, 3 or "
                f"4 channels, received {list(self.shape)}"
            )
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, received {self.num_classes}")

    def parse(self, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Record -> (raw feature: image bytes or tensor, label); checks label range."""
        feature = {
            "image": tf.io.FixedLenFeature([], tf.string),
            "float": tf.io.FixedLenFeature(self.shape, tf.float32),
            "int": tf.io.FixedLenFeature(self.shape, tf.int64),
        }[self.kind]
        example = tf.io.parse_single_example(
            record,
            {self.key: feature, self.label_key: tf.io.FixedLenFeature([], tf.int64)},
        )
        label = example[self.label_key]
        tf.debugging.assert_non_negative(label, message=f"{self.label_key} is negative")
        tf.debugging.assert_less(
            label,
            tf.constant(self.num_classes, tf.int64),
            message=f"{self.label_key} is not below num_classes={self.num_classes}",
        )
        return example[self.key], label

    def decode(self, feature: tf.Tensor) -> tf.Tensor:
        if self.kind != "image":
            return feature
        image = image_folder.decode(feature, self.shape[2])  # a GIF turned grey too
        # Images of another size fail clearly here; a silent resize could hide a wrong file.
        return tf.ensure_shape(image, self.shape)


def _glob(key: str, pattern: str | Sequence[str]) -> list[str]:
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    files = sorted({path for p in patterns for path in tf.io.gfile.glob(p)})
    if not files:
        raise ValueError(f"{key}={pattern!r}: matches no files; check the path and the glob")
    for file in files:
        if "://" not in file:  # a local file (gs://, hdfs:// are the filesystem's to check)
            reading.check_file(file, what=f"a TFRecord file of {key}")
    return files


def _check_file(path: str, spec: _Spec, images_to_decode: int, compression: str) -> int:
    """Reads and parses every record of `path`; returns how many there are."""
    records = tf.data.TFRecordDataset(path, compression_type=compression).map(
        graph.plain(spec.parse), num_parallel_calls=tf.data.AUTOTUNE
    )
    count = 0
    try:
        for batch in records.batch(4096):
            if spec.kind == "float":  # refused as a CSV's or an .npz's (and predict's) are
                check_finite_array(path, spec.key, batch[0].numpy(), first_row=count)
            count += int(tf.shape(batch[1])[0])
        for feature, _ in records.take(images_to_decode if spec.kind == "image" else 0):
            spec.decode(feature)
    except tf.errors.OpError as error:
        reason = reading.op_reason(error)
        raise ValueError(
            f"{path}: cannot use this TFRecord file (after {count} good records): {reason}; "
            f"expected tf.train.Examples with {spec.key!r} ({spec.kind}, shape "
            f"{list(spec.shape)}) and {spec.label_key!r} (int label < {spec.num_classes})"
        ) from None
    if count == 0:
        raise ValueError(f"{path}: holds no records")
    return count


def _read(files: list[str], spec: _Spec, count: int, compression: str) -> tf.data.Dataset:
    # A dataset of file names read by TFRecordDataset: what `auto_shard_policy=file` shards.
    records = tf.data.TFRecordDataset(
        files,
        compression_type=compression,
        num_parallel_reads=tf.data.AUTOTUNE if len(files) > 1 else None,
    )

    def example(record):
        feature, label = spec.parse(record)
        return spec.decode(feature), label

    # The count the check read: a reader's cardinality is unknown, and Keras, finding the end of
    # a validation set it cannot count, warns "Your input ran out of data" every run. (Sharding
    # across workers drops this assertion with the files it leaves out.)
    examples = records.map(graph.plain(example), num_parallel_calls=tf.data.AUTOTUNE)
    return examples.apply(tf.data.experimental.assert_cardinality(count))
