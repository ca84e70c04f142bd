"""The one helper that batches a dataset and distributes it with the strategy (every loop uses it)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def distribute(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    *,
    global_batch_size: int,
    drop_remainder: bool = False,
    repeat: bool = False,
    auto_shard_policy: str = "auto",
    batch_map: Callable | None = None,
    skip: int = 0,
) -> tf.distribute.DistributedDataset:
    """Batches `dataset` by the global batch and splits each batch over the replicas.

    Every loop gets its data from here; shuffling, augmentation and normalization happen before
    (`tfrecipe.data.pipeline.prepare`). The replicas of one step together see one global batch,
    exactly as a single replica would, and the distributed dataset's cardinality counts global
    steps (which `Model.fit` relies on; `distribute_datasets_from_function` would count
    per-replica batches). `repeat` makes the data endless, for loops that count steps per epoch
    themselves. `batch_map` transforms each global batch (normalization, vectorized).

    On several workers TensorFlow shards the input by `auto_shard_policy` (docs/data.md):
    "file" gives each worker its own files (needs at least as many files as workers), "data"
    has every worker read everything and keep every N-th element, "auto" tries files and falls
    back to data, "off" gives every worker all the data.
    `skip` global batches are dropped from the start of the (endless) stream: a run restored at
    step N continues where the interrupted one stopped (the order is seeded, so the same).
    That order is the dataset's first iteration: every further `iter()` reshuffles (the seeded
    shuffle's generator belongs to the dataset), so loops train on the first one and never open
    another to peek (`tfrecipe.compat.fix_fit_under_strategy` keeps `fit` from it).
    """
    dataset = dataset.batch(global_batch_size, drop_remainder=drop_remainder)
    if batch_map is not None:
        dataset = dataset.map(batch_map, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if repeat:
        dataset = dataset.repeat()
    if skip:
        # Global batches, before the strategy splits them: every worker skips the same ones.
        dataset = dataset.skip(skip)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = _AUTO_SHARD[auto_shard_policy]
    dataset = dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
    if not repeat and isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return dataset  # the coordinator evaluates inline, on the plain batched dataset
    return strategy.experimental_distribute_dataset(dataset)


_AUTO_SHARD = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}
