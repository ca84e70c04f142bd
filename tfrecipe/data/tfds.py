"""TensorFlow Datasets: `dataset=mnist|fashion_mnist|cifar10`, or any catalog dataset with
`dataset=tfds dataset.name=NAME`.

Only data prepared beforehand are read: this never downloads (many training machines have no
network, and a download that cannot finish would hang the run). Without prepared data the user
gets one line saying how to prepare them elsewhere and where to copy them.

Images, feature vectors and text alike: examples are passed on as TFDS decodes them (uint8
images, which the pipeline scales; raw strings for a text feature such as imdb_reviews' "text",
which `model=text` tokenizes inside the model).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfrecipe.config.targets import config_target
from tfrecipe.data.splits import DatasetInfo, Splits


@config_target
def load(
    *,
    name: str,
    data_dir: str | None = None,
    train_split: str = "train",
    validation_split: str | None = None,
    test_split: str | None = "test",
    feature_key: str = "image",
    label_key: str = "label",
) -> Splits:
    """Reads prepared TFDS splits (split strings as in TFDS, e.g. "train[:90%]").

    Args:
      name: a TFDS catalog name, optionally with config and version ("mnist", "cifar10:3.0.2").
      data_dir: where the prepared data are; None: TFDS' default ($TFDS_DATA_DIR or
        ~/tensorflow_datasets).
      train_split, validation_split, test_split: TFDS split strings; None or "" for none.
      feature_key, label_key: the features and the integer class label in each example
        ("image"/"label" for image datasets; "features"/"label" for tabular ones;
        "text"/"label" for text ones such as imdb_reviews).

    Raises:
      ValueError: unknown dataset, data not prepared in `data_dir`, missing keys or splits.
    """
    import tensorflow_datasets as tfds

    builder = _builder(tfds, name, data_dir)
    label = _class_label(name, builder.info.features, feature_key, label_key)
    train, validation, test = _read_splits(
        builder, name, (train_split, validation_split, test_split), data_dir, feature_key, label_key
    )
    info = DatasetInfo(
        input_shape=tuple(builder.info.features[feature_key].shape),
        num_classes=int(label.num_classes),
        num_train=_count(train),
        num_validation=_count(validation),
        num_test=_count(test),
        target_kind="binary" if label.num_classes == 2 else "classes",
    )
    return Splits(train, validation, test, info)


def _class_label(name: str, features, feature_key: str, label_key: str):
    """The dataset's `label_key` feature, once both keys are known and it is a class label."""
    for key, value in (("feature_key", feature_key), ("label_key", label_key)):
        if value not in features:
            raise ValueError(
                f"dataset {name!r} has no feature {key}={value!r}; its features are "
                f"{sorted(features.keys())}"
            )
    label = features[label_key]
    if not hasattr(label, "num_classes"):
        raise ValueError(
            f"dataset {name!r}: label_key={label_key!r} is not a class label "
            f"({type(label).__name__}); name an integer class label"
        )
    return label


def _builder(tfds, name: str, data_dir: str | None):
    foreign = _foreign_feature(tfds, data_dir)
    if foreign is not None:
        path, class_name = foreign
        raise ValueError(
            f"data_dir={_data_dir(data_dir)}: {path} names the feature class {class_name!r}, "
            "which TFDS would import by its module's name to read the data; a prepared "
            "dataset's features are TFDS' own classes (tfds.features)"
        )
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(
            f"name={name!r} is not a TensorFlow Datasets dataset; see "
            "https://www.tensorflow.org/datasets/catalog (e.g. mnist, cifar10)"
        ) from None


def _read_splits(
    builder,
    name: str,
    splits: tuple[str | None, str | None, str | None],
    data_dir: str | None,
    feature_key: str,
    label_key: str,
):
    """The train, validation and test splits (None for an empty name but the training one's)."""
    if not splits[0]:
        raise ValueError(f"dataset {name!r}: train_split is empty; name a TFDS split (train)")
    return tuple(
        _read(builder, name, split, data_dir, feature_key, label_key) if split else None
        for split in splits
    )


def _read(builder, name: str, split: str, data_dir: str | None, feature_key: str, label_key: str):
    """One split as unbatched (features, label); never downloads."""
    try:
        dataset = builder.as_dataset(split=split, shuffle_files=False)
    except AssertionError:  # TFDS' way of saying "not prepared" (as_dataset never downloads)
        raise ValueError(_not_prepared(name, data_dir)) from None
    except (ValueError, KeyError) as error:  # an unknown split or bad slice
        raise ValueError(f"dataset {name!r}: cannot read split={split!r} ({error})") from None
    from tfrecipe.graph import plain

    return dataset.map(plain(lambda example: (example[feature_key], example[label_key])))


# Where TFDS keeps a prepared dataset's description of its features, which it reads to decode a
# dataset it has no code for: DATA_DIR/NAME[/CONFIG]/VERSION/features.json.
_FEATURES = ("*/*/features.json", "*/*/*/features.json")


def _foreign_feature(tfds, data_dir: str | None) -> tuple[Path, str] | None:
    """(features.json, class name) of the first feature class in a prepared dataset under
    `data_dir` that TFDS does not know: TFDS imports such a class's module by name
    (FeatureConnector.cls_from_name), and a data folder is data, not code. None: none."""
    from tfrecipe import reading

    known = set(tfds.features.FeatureConnector._registered_features)
    root = Path(_data_dir(data_dir)).expanduser()
    for path in sorted(p for pattern in _FEATURES for p in root.glob(pattern)):
        # a FIFO, a link to /dev/zero or a damaged file: UnreadableFile, one line (a ValueError)
        described = reading.read_json(path, limit=reading.MAX_CONFIG_BYTES, what="features")
        for class_name in _feature_classes(described):
            if class_name not in known:
                return path, class_name
    return None


def _feature_classes(node: Any) -> Iterator[Any]:
    """The feature class names anywhere in a features.json: `pythonClassName` (TFDS' proto
    layout) and a legacy feature's `type` (beside its `content`)."""
    if isinstance(node, dict):
        if "pythonClassName" in node:
            yield node["pythonClassName"]
        if "type" in node and "content" in node:
            yield node["type"]
        for value in node.values():
            yield from _feature_classes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _feature_classes(value)


def _data_dir(data_dir: str | None) -> str:
    """Where TFDS looks for prepared data: `data_dir`, else its default."""
    return data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"


def _not_prepared(name: str, data_dir: str | None) -> str:
    where = _data_dir(data_dir)
    return (
        f"TFDS dataset {name!r} is not prepared in data_dir={where} and tfrecipe never "
        f"downloads. On a machine with network run `tfds build {name.split(':')[0]} "
        f"--data_dir=DIR`, copy DIR here and set dataset.data_dir=DIR"
    )


def _count(dataset) -> int:
    if dataset is None:
        return 0
    count = int(dataset.cardinality())
    if count < 0:  # unknown: count once (TFDS knows its split sizes, so rarely needed)
        count = int(dataset.reduce(0, lambda n, _: n + 1))
    return count
