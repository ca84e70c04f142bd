"""The input pipeline between a dataset builder and the strategy: cache, shuffle, augment, normalize.

Builders (tfrecipe.data.bundled, .tfds, .npz, ...) return unbatched `(features, label)` datasets,
already read and decoded; `prepare` turns one split into what the model eats, in the order the
tf.data performance guide recommends::

    decoded split -> cache -> shuffle (training) -> augment (training) -> [distribute: batch ->
    normalize (batch_transform) -> repeat -> prefetch, sharded across workers]

(Under `cache=memory` the normalization moves before the cache, where that is safe:
`tfrecipe.training.inputs._placement`.)

Importing this module does not import TensorFlow (the schema validates `PipelineOptions` before
TensorFlow starts).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from tfrecipe.errors import ConfigError


class PipelineOptions(BaseModel):
    """The `pipeline` config group (conf/pipeline/default.yaml documents each knob): a small
    frozen record, validated with the rest of the schema."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # scale: integer images -> float32 in [0, 1] (floats unchanged); per_example: zero mean and
    # unit variance per example; none: as the builder gives them.
    normalize: Literal["scale", "per_example", "none"] = "scale"
    augment_flip: bool = False
    augment_crop_padding: Annotated[int, Field(ge=0)] = 0
    shuffle_buffer: Annotated[int, Field(ge=0)] = 10_000
    # "memory", a file path prefix, or None.
    cache: str | None = "memory"
    num_parallel_calls: Literal["autotune"] | Annotated[int, Field(gt=0)] = "autotune"
    auto_shard_policy: Literal["auto", "file", "data", "off"] = "auto"
    # The training split held on the device and gathered in the graph (tfrecipe.data.residency):
    # "auto" where it fits under the cap, True always, False never.
    resident: Literal["auto"] | bool = "auto"

    @property
    def augments(self) -> bool:
        """Training examples are flipped or cropped (as read, before normalization)."""
        return bool(self.augment_flip or self.augment_crop_padding)


def prepare(
    dataset,
    options: PipelineOptions,
    *,
    split: str,
    training: bool,
    seed: int,
    chunks: bool = False,
):
    """Caches, shuffles and augments one unbatched split (`batch_transform` normalizes).

    Args:
      dataset: unbatched `(features, label)` `tf.data.Dataset` from a builder.
      options: the pipeline options.
      split: "train", "validation" or "test" (names the cache file of a file cache).
      training: shuffle and augment (evaluation data are only cached).
      seed: seeds the shuffle and the augmentation. Every worker must use the same seed: with
        `auto_shard_policy=data` each worker keeps every N-th element of the same order.
      chunks: elements are chunks of rows (a streamed table, `Splits.batched`): cached in a
        file cache only (`cache=memory` would hold the table streaming keeps out of memory),
        shuffled by `shuffle_rows`.

    Raises:
      ConfigError: augmentation asked for data that are not images.
    """
    if chunks:
        return _prepare_chunks(dataset, options, split=split, training=training, seed=seed)
    if options.cache == "memory":
        dataset = dataset.cache()
    elif options.cache:
        dataset = dataset.cache(f"{options.cache}.{split}")
    if training and options.shuffle_buffer:
        dataset = dataset.shuffle(options.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if not (training and options.augments):
        return dataset
    return _augmented(dataset, options, seed=seed)


def _prepare_chunks(dataset, options: PipelineOptions, *, split: str, training: bool, seed: int):
    """`prepare` for chunks of rows: a file cache only, and `shuffle_rows`."""
    if options.cache and options.cache != "memory":  # on disk: memory stays bounded
        dataset = dataset.cache(f"{options.cache}.{split}")
    if training and options.shuffle_buffer:
        return shuffle_rows(dataset, options.shuffle_buffer, seed=seed)
    return dataset


def _augmented(dataset, options: PipelineOptions, *, seed: int):
    """Images flipped and cropped as `options` asks, each with its own seed."""
    import tensorflow as tf

    _require_images(dataset.element_spec[0].shape, options)
    # Per-example seeds from a seeded stream: stateless ops stay reproducible under a parallel
    # map, and differ on every epoch.
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    parallel = (
        tf.data.AUTOTUNE
        if options.num_parallel_calls == "autotune"
        else (options.num_parallel_calls)
    )
    from tfrecipe.graph import plain

    return tf.data.Dataset.zip(dataset, seeds).map(
        plain(lambda example, seed: (augment_image(example[0], seed, options), example[1])),
        num_parallel_calls=parallel,
        deterministic=True,
    )


def shuffle_rows(chunks, window: int, *, seed: int):
    """Chunks of rows shuffled vectorized: regrouped into windows of `window` rows, each
    permuted with its own seed from a seeded stream (new each epoch). A window plays the part of
    tf.data's shuffle buffer, without its cost per row (a streamed table's rows never pass
    tf.data one by one: 55k rows/s shuffled that way, against ~800k in chunks)."""
    import tensorflow as tf

    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)

    def permute(rows, window_seed):
        order = tf.random.experimental.stateless_shuffle(
            tf.range(tf.shape(rows[1])[0]), seed=window_seed
        )
        return tf.nest.map_structure(lambda column: tf.gather(column, order), rows)

    from tfrecipe.graph import plain

    return tf.data.Dataset.zip(chunks.rebatch(window), seeds).map(
        plain(permute), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )


def batch_transform(options: PipelineOptions):
    """The per-batch map `data.distribute.distribute` applies after batching: normalization and int32
    class ids (float targets unchanged). Vectorized over the batch: a per-example map costs tens of microseconds of tf.data
    overhead per example, more than a small model's training step per example."""
    import tensorflow as tf

    def normalize(x):
        # Raw columns (a dict) and raw text go to the model as they are: it encodes them itself.
        if options.normalize == "none" or isinstance(x, dict) or x.dtype == tf.string:
            return x
        # Integers (images) scale by their dtype's range; floats are taken as they are.
        scale = 1.0 / x.dtype.max if x.dtype.is_integer else 1.0
        x = tf.cast(x, tf.float32) * scale
        if options.normalize == "per_example":
            axes = list(range(1, x.shape.rank))
            mean, variance = tf.nn.moments(x, axes=axes, keepdims=True)
            # The floor keeps constant examples finite (as tf.image.per_image_standardization).
            size = tf.cast(tf.reduce_prod(tf.shape(x)[1:]), tf.float32)
            x = (x - mean) / tf.maximum(tf.sqrt(variance), tf.math.rsqrt(size))
        return x

    def labels(y):
        # Class ids as int32; float targets (regression, multi-hot) keep their values.
        return tf.cast(y, tf.int32) if y.dtype.is_integer or y.dtype.is_bool else y

    from tfrecipe.graph import plain

    return plain(lambda x, y: (normalize(x), labels(y)))


def _require_images(shape, options: PipelineOptions) -> None:
    if shape.rank != 3:
        raise ConfigError(
            f"pipeline.augment_flip={options.augment_flip}, pipeline.augment_crop_padding="
            f"{options.augment_crop_padding}: augmentation needs images [height, width, channels], "
            f"received examples of shape {shape.as_list()}; turn augmentation off"
        )


def augment_image(image, seed, options: PipelineOptions):
    """One image flipped and cropped as `options` ask, from its own stateless `seed`."""
    import tensorflow as tf

    flip_seed, crop_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if options.augment_flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    if options.augment_crop_padding:
        # Pad by N pixels, crop back at a random offset (the CIFAR recipe: N=4).
        pad = options.augment_crop_padding
        height, width, _ = image.shape
        padded = tf.image.resize_with_crop_or_pad(image, height + 2 * pad, width + 2 * pad)
        image = tf.image.stateless_random_crop(padded, tf.shape(image), crop_seed)
    return image
