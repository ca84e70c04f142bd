"""Datasets and the input pipeline through the real loading code, offline: TFDS under
`tfds.testing.mock_data`, and TFRecord / NPZ / image-folder files written by the tests."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers.datafiles import write_image_folder, write_npz, write_tfrecord


@pytest.fixture
def mock_tfds():
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=48):
        yield


def _first(dataset):
    return next(iter(dataset.as_numpy_iterator()))


# --- the pipeline -------------------------------------------------------------------------------
def _images(n=32):
    import tensorflow as tf

    pixels = np.arange(n * 4 * 4 * 3, dtype="uint32").reshape(n, 4, 4, 3) % 256
    return tf.data.Dataset.from_tensor_slices((pixels.astype("uint8"), np.arange(n)))


def _prepare(dataset, *, training=True, seed=1, **options):
    """prepare() and the batch transform that distribute() applies, unbatched again."""
    from tfrecipe.data.pipeline import PipelineOptions, batch_transform, prepare

    options = PipelineOptions(**options)
    dataset = prepare(dataset, options, split="train", training=training, seed=seed)
    return dataset.batch(3).map(batch_transform(options)).unbatch()


def test_scale_normalizes_integer_images_to_unit_range_and_labels_to_int32():
    x, y = _first(_prepare(_images(), training=False))
    assert x.dtype == np.float32 and y.dtype == np.int32
    assert x.min() >= 0 and x.max() <= 1 and x.max() > 0.01


def test_per_example_normalization_has_zero_mean_unit_variance():
    import tensorflow as tf

    pixels = np.random.default_rng(0).integers(0, 256, size=(2, 8, 8, 3), dtype="uint8")
    dataset = tf.data.Dataset.from_tensor_slices((pixels, np.zeros(2)))
    x, _ = _first(_prepare(dataset, training=False, normalize="per_example"))
    assert abs(x.mean()) < 1e-5 and abs(x.std() - 1) < 1e-3


def test_shuffle_is_seeded_and_evaluation_data_keep_their_order():
    def labels(**kw):
        return [int(y) for _, y in _prepare(_images(), **kw).as_numpy_iterator()]

    assert labels(seed=3) == labels(seed=3) != list(range(32))
    assert labels(seed=3) != labels(seed=4)
    assert labels(training=False) == list(range(32))
    assert labels(shuffle_buffer=0) == list(range(32))


def test_augmentation_flips_and_crops_reproducibly_and_differs_each_epoch():
    dataset = _prepare(_images(), shuffle_buffer=0, augment_flip=True, augment_crop_padding=2)
    first, again = list(dataset.as_numpy_iterator()), list(dataset.as_numpy_iterator())
    plain = list(_prepare(_images(), shuffle_buffer=0).as_numpy_iterator())
    assert first[0][0].shape == (4, 4, 3)
    assert any(not np.array_equal(a[0], p[0]) for a, p in zip(first, plain, strict=True))
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    rerun = list(
        _prepare(
            _images(), shuffle_buffer=0, augment_flip=True, augment_crop_padding=2
        ).as_numpy_iterator()
    )
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first, rerun, strict=True))


def test_a_memory_cached_training_split_is_mapped_once_unless_it_must_not_be():
    """Under cache=memory the training split is normalized before its cache, so that its epochs
    only shuffle and batch; augmentation (it works on the rows as read), a split that would pass
    PREMAP_MAX_BYTES as float32, a file cache or none map each batch; evaluation splits are
    cached as mapped batches."""
    from types import SimpleNamespace

    from tfrecipe.data.pipeline import PipelineOptions, batch_transform
    from tfrecipe.training import inputs

    def placed(rows=32, *, training=True, **options):
        options = PipelineOptions(**options)
        splits = SimpleNamespace(batched=False, info=SimpleNamespace(num_train=rows))
        return inputs._placement(
            options, batch_transform(options), _images(), training=training, splits=splits
        )

    once = placed()
    assert once.premap is not None and once.batch_map is None and not once.cache_batches
    x, y = _first(once.rows_mapped(_images()))  # mapped as a batch would be
    assert x.dtype == np.float32 and y.dtype == np.int32 and x.max() <= 1
    too_large = inputs.PREMAP_MAX_BYTES // (4 * 4 * 3 * 4) + 1  # rows of 4x4x3 float32
    for each_batch in (
        placed(augment_flip=True),
        placed(too_large),
        placed(cache=None),
        placed(cache="/c"),
    ):
        assert each_batch.premap is None and each_batch.batch_map is not None
    validation = placed(training=False)
    assert validation.cache_batches and validation.premap is None and validation.rows.cache is None


def test_mapping_the_training_split_before_its_cache_trains_exactly_as_each_batch(train_run):
    """Both streamed (on a CPU `pipeline.resident=auto` holds the MLP's split where it is
    cached in memory, which draws another order)."""
    streamed = ("model=mlp", "pipeline.resident=false")
    mapped_once, _ = train_run(*streamed, "pipeline.cache=memory")
    each_batch, _ = train_run(*streamed, "pipeline.cache=null")
    assert mapped_once["metrics"] == each_batch["metrics"]
    assert mapped_once["test"] == each_batch["test"]


def test_augmenting_vectors_is_a_config_error():
    import tensorflow as tf

    from tfrecipe.errors import ConfigError

    vectors = tf.data.Dataset.from_tensor_slices((np.zeros((4, 3)), np.zeros(4)))
    with pytest.raises(ConfigError, match="augmentation needs images"):
        _prepare(vectors, augment_flip=True)


def test_file_cache_writes_the_split_to_the_given_prefix(tmp_path):
    dataset = _prepare(_images(), training=False, cache=str(tmp_path / "cache"))
    assert len(list(dataset.as_numpy_iterator())) == 32
    assert any(p.name.startswith("cache.train") for p in tmp_path.iterdir())


# --- builders -----------------------------------------------------------------------------------
def test_tfrecord_reads_decoded_images_and_counts_every_file(tmp_path):
    from tfrecipe.data.tfrecord import load

    for i in range(3):
        write_tfrecord(tmp_path / f"train-{i}.tfrecord", 5, first_id=10 * i)
    write_tfrecord(tmp_path / "test.tfrecord", 4)
    splits = load(
        train_files=str(tmp_path / "train-*.tfrecord"),
        test_files=str(tmp_path / "test.tfrecord"),
        feature_shape=[8, 8, 1],
        num_classes=2,
    )
    assert (splits.info.num_train, splits.info.num_validation, splits.info.num_test) == (15, 0, 4)
    assert splits.validation is None
    image, label = _first(splits.train)
    assert image.shape == (8, 8, 1) and image.dtype == np.uint8 and label in (0, 1)
    assert len(list(splits.train.as_numpy_iterator())) == 15


def test_tfrecord_reads_float_tensors(tmp_path):
    from tfrecipe.data.tfrecord import load

    write_tfrecord(tmp_path / "t.tfrecord", 6, kind="float", feature_key="features")
    splits = load(
        train_files=[str(tmp_path / "t.tfrecord")],
        feature_key="features",
        feature_kind="float",
        feature_shape=[2],
        num_classes=2,
    )
    features, label = _first(splits.train)
    assert features.tolist() == [0.0, float(label)] and splits.info.input_shape == (2,)


def test_tfrecord_reads_gzipped_files_by_their_suffix(tmp_path):
    from tfrecipe.data.tfrecord import load

    for i in range(2):
        write_tfrecord(tmp_path / f"train-{i}.tfrecord.gz", 5, first_id=10 * i)
    write_tfrecord(tmp_path / "test.tfrecord", 4)
    splits = load(
        train_files=str(tmp_path / "train-*.gz"),
        test_files=str(tmp_path / "test.tfrecord"),
        feature_shape=[8, 8, 1],
        num_classes=2,
    )
    assert (splits.info.num_train, splits.info.num_test) == (10, 4)
    assert len(list(splits.train.as_numpy_iterator())) == 10
    with pytest.raises(ValueError, match=r"train_files=.*mixes"):
        load(train_files=str(tmp_path / "*"), feature_shape=[8, 8, 1], num_classes=2)


def test_npz_splits_one_file_or_reads_separate_ones(tmp_path):
    from tfrecipe.data.npz import load

    write_npz(tmp_path / "train.npz", 40, x_key="images", y_key="labels")
    write_npz(tmp_path / "test.npz", 6, x_key="images", y_key="labels")
    splits = load(
        path=str(tmp_path / "train.npz"),
        x_key="images",
        y_key="labels",
        test_path=str(tmp_path / "test.npz"),
        validation_fraction=0.25,
        test_fraction=0.5,  # not used: the test split has its own file
    )
    info = splits.info
    assert (info.num_train, info.num_validation, info.num_test) == (30, 10, 6)
    assert info.input_shape == (8, 8, 1) and info.num_classes == 2
    assert _first(splits.train)[0].dtype == np.uint8


def test_image_folder_labels_by_sorted_subfolder_and_resizes(tmp_path):
    from tfrecipe.data.image_folder import load

    write_image_folder(tmp_path / "pics")
    splits = load(
        path=str(tmp_path / "pics"), image_size=[6, 5], validation_fraction=0.34, test_fraction=0
    )
    assert splits.info.num_classes == 2 and splits.info.input_shape == (6, 5, 3)
    assert (splits.info.num_train, splits.info.num_validation) == (7, 5)
    pairs = list(splits.train.as_numpy_iterator())
    assert all(x.shape == (6, 5, 3) and x.dtype == np.uint8 for x, _ in pairs)
    # "dark" sorts first: label 0 is the dark class.
    assert all((x.mean() < 128) == (y == 0) for x, y in pairs)


def test_image_folder_trains_on_the_images_predict_scores_in_subfolders(tmp_path):
    """An image in a subfolder of a class folder is an example of that class, as predict scores
    it; hidden files and folders are left out by both."""
    from tfrecipe.data.image_folder import IMAGE_SUFFIXES, load
    from tfrecipe.data.readers import open_sources

    root = write_image_folder(tmp_path / "pics")  # 6 dark and 6 light images
    image = next((root / "dark").glob("*.png")).read_bytes()
    for name in ("2024/a.png", "2024/b/c.png", ".cache/d.png", ".e.png", "2024/.f.png"):
        (root / "dark" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "dark" / name).write_bytes(image)
    splits = load(path=str(root), validation_fraction=0, test_fraction=0)
    assert splits.info.num_train == 14
    labels = [y for _, y in splits.train.as_numpy_iterator()]
    assert (labels.count(0), labels.count(1)) == (8, 6)
    inputs = {"kind": "array", "shape": [64, 64, 3]}
    source = open_sources([root], {"inputs": inputs}, dataset={})
    assert source.num_rows() == 14 and all(f.suffix in IMAGE_SUFFIXES for f in source.files)


def test_tfds_reads_mocked_mnist_with_configured_splits(mock_tfds):
    from tfrecipe.data.tfds import load

    splits = load(name="mnist", train_split="train[:90%]", validation_split="train[90%:]")
    assert splits.info.input_shape == (28, 28, 1) and splits.info.num_classes == 10
    assert splits.info.num_train == 48 and splits.validation is not None
    image, label = _first(splits.train)
    assert image.shape == (28, 28, 1) and 0 <= label < 10


def test_tfds_without_prepared_data_says_how_to_prepare_it(tmp_path):
    from tfrecipe.data.tfds import load

    with pytest.raises(ValueError) as error:
        load(name="cifar10", data_dir=str(tmp_path))
    message = str(error.value)
    assert "'cifar10'" in message and str(tmp_path) in message and "tfds build cifar10" in message


def test_tfds_unknown_name_or_key_is_a_value_error(mock_tfds):
    from tfrecipe.data.tfds import load

    with pytest.raises(ValueError, match="not a TensorFlow Datasets dataset"):
        load(name="no_such_dataset_anywhere")
    with pytest.raises(ValueError, match=r"feature_key='features'.*\['image', 'label'\]"):
        load(name="mnist", feature_key="features")


# --- every dataset option trains, through the real config ----------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [
        ["dataset=mnist", "model=mlp"],
        ["dataset=fashion_mnist", "model=mlp"],
        [
            "dataset=cifar10",
            "model=cnn",
            "pipeline.augment_flip=true",
            "pipeline.augment_crop_padding=4",
        ],
        ["dataset=tfds", "dataset.name=cifar10", "dataset.validation_split='train[:10%]'"],
    ],
    ids=["mnist", "fashion_mnist", "cifar10", "tfds"],
)
def test_tfds_options_train(overrides, train_run, mock_tfds):
    summary, _ = train_run(*overrides)
    assert summary["status"] == "completed" and "val_loss" in summary["metrics"]
    assert summary["test"]


def test_user_file_options_train(tmp_path, train_run):
    write_tfrecord(tmp_path / "a.tfrecord", 20)
    write_tfrecord(tmp_path / "b.tfrecord", 20, first_id=20)
    write_npz(tmp_path / "d.npz", 40)
    write_image_folder(tmp_path / "pics", per_class=10)
    runs = {
        "tfrecord": [
            "dataset=tfrecord",
            f"dataset.train_files={tmp_path}/*.tfrecord",
            f"dataset.validation_files=[{tmp_path}/a.tfrecord]",
            "dataset.feature_shape=[8,8,1]",
            "dataset.num_classes=2",
            "pipeline.cache=null",
        ],
        "npz": ["dataset=npz", f"dataset.path={tmp_path}/d.npz", "dataset.test_fraction=0.2"],
        "image_folder": [
            "dataset=image_folder",
            f"dataset.path={tmp_path}/pics",
            "dataset.image_size=[8,8]",
            "pipeline.augment_flip=true",
        ],
    }
    for name, overrides in runs.items():
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            summary, _ = train_run(*overrides, "model=mlp")
        assert summary["status"] == "completed", name
        # Keras warned at the end of a validation set it could not count (a TFRecord reader's).
        assert not [w for w in warned if "ran out of data" in str(w.message)], name
        assert summary["dataset"] == f"tfrecipe.data.{name}.load"


def test_fractions_too_small_for_the_classes_name_the_keys_and_the_smallest_class(tmp_path):
    from tfrecipe.data import image_folder, npz

    write_image_folder(tmp_path / "pics")  # 12 images, two classes
    with pytest.raises(ValueError) as error:  # 1 of 12 to test: fewer than the classes
        image_folder.load(path=str(tmp_path / "pics"), validation_fraction=0, test_fraction=0.05)
    message = str(error.value)
    assert "test_fraction=0.05" in message and "2 classes" in message, message
    np.savez(tmp_path / "one.npz", x=np.zeros((20, 3)), y=np.array([0] * 19 + [1]))
    with pytest.raises(ValueError) as error:  # class 1 has a single example: none to hold out
        npz.load(path=str(tmp_path / "one.npz"))
    message = str(error.value)
    assert "validation_fraction=0.1" in message and "smallest: 1 example" in message, message


def test_npz_labels_beyond_int32_are_refused_not_wrapped_to_another_class(tmp_path):
    from tfrecipe.data.npz import load

    y = np.array([0, 1] * 10, dtype="int64")
    y[5] = 2**32 + 1  # as int32: 1, a real class
    np.savez(tmp_path / "wide.npz", x=np.zeros((20, 3), "float32"), y=y)
    with pytest.raises(ValueError, match=r"label y\[5\]=4294967297 is out of range"):
        load(path=str(tmp_path / "wide.npz"))


def test_a_corrupt_record_or_image_is_named_without_tensorflows_plumbing(tmp_path):
    from tfrecipe.data import image_folder, tfrecord

    bad = write_tfrecord(tmp_path / "bad.tfrecord", 4)
    bad.write_bytes(bad.read_bytes()[:-7])
    root = write_image_folder(tmp_path / "pics")
    (root / "light" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    for load in (
        lambda: tfrecord.load(train_files=str(bad), feature_shape=[8, 8, 1], num_classes=2),
        lambda: image_folder.load(path=str(root)),
    ):
        with pytest.raises(ValueError) as error:
            load()
        message = str(error.value)
        assert "function_node" not in message and "[Op:" not in message, message


def test_grey_images_from_a_folder_with_gifs_decode_to_one_channel(tmp_path):
    from PIL import Image

    from tfrecipe.data.image_folder import load

    root = write_image_folder(tmp_path / "pics")
    for name, value in (("dark", 20), ("light", 230)):  # GIFs decode to RGB only
        Image.new("RGB", (12, 12), (value,) * 3).save(root / name / "flat.gif")
    splits = load(
        path=str(root), image_size=[6, 6], channels=1, validation_fraction=0, test_fraction=0
    )
    pairs = list(splits.train.as_numpy_iterator())
    assert len(pairs) == 14 and all(x.shape == (6, 6, 1) for x, _ in pairs)
    assert all((x.mean() < 128) == (y == 0) for x, y in pairs)


def test_tfrecord_grey_gifs_decode_to_one_channel(tmp_path):
    import io

    import tensorflow as tf
    from PIL import Image

    from tfrecipe.data.tfrecord import load

    with tf.io.TFRecordWriter(str(tmp_path / "gifs.tfrecord")) as writer:
        for label in (0, 1, 0, 1):
            gif = io.BytesIO()
            Image.new("RGB", (8, 8), (200 * label,) * 3).save(gif, format="GIF")
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[gif.getvalue()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
            writer.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    splits = load(
        train_files=str(tmp_path / "gifs.tfrecord"), feature_shape=[8, 8, 1], num_classes=2
    )
    pairs = list(splits.train.as_numpy_iterator())
    assert [x.shape for x, _ in pairs] == [(8, 8, 1)] * 4
    assert all((x.mean() > 100) == (y == 1) for x, y in pairs)
