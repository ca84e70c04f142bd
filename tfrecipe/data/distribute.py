"""The one helper that batches a dataset and distributes it with the strategy (every loop uses it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from tfrecipe import graph


def input_shard(strategy: tf.distribute.Strategy) -> tuple[int, int]:
    """(this worker's index, number of workers) among those that read input: the chief first
    when the cluster has one (TensorFlow's order), 0 of 1 without a cluster or under parameter
    servers (the coordinator reads)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return 0, 1
    tasks = resolver.cluster_spec().as_dict()
    chiefs, workers = len(tasks.get("chief", ())), len(tasks.get("worker", ()))
    if chiefs + workers <= 1:
        return 0, 1
    offset = chiefs if resolver.task_type == "worker" else 0
    return offset + int(resolver.task_id or 0), chiefs + workers


@dataclasses.dataclass(frozen=True, kw_only=True)
class Feed:
    """How a dataset is batched and fed to the replicas (`distribute` says what each does).

    Attributes:
      global_batch_size: the examples of one step over all replicas.
      drop_remainder: drop a last, smaller batch.
      repeat: endless data, for loops that count steps per epoch themselves.
      auto_shard_policy: how several workers share the input ("auto", "file", "data", "off").
      batch_map: transforms each global batch (normalization, vectorized), or None.
      skip: global batches dropped from the start of the stream (a restored run).
      chunks: the elements are chunks of rows a Python reader streams.
      num_rows: how many rows those chunks hold, when known.
      cache_batches: keep `batch_map`'s results in memory.
    """

    global_batch_size: int
    drop_remainder: bool = False
    repeat: bool = False
    auto_shard_policy: str = "auto"
    batch_map: Callable | None = None
    skip: int = 0
    chunks: bool = False
    num_rows: int | None = None
    cache_batches: bool = False


def distribute(
    strategy: tf.distribute.Strategy, dataset: tf.data.Dataset, feed: Feed
) -> tf.distribute.DistributedDataset:
    """Batches `dataset` by the global batch and splits each batch over the replicas, as `feed`
    says.

    Every loop gets its data from here; shuffling, augmentation and normalization happen before
    (`tfrecipe.data.pipeline.prepare`). The replicas of one step together see one global batch,
    exactly as a single replica would, and the distributed dataset's cardinality counts global
    steps (which `Model.fit` relies on; `distribute_datasets_from_function` would count
    per-replica batches). `repeat` makes the data endless, for loops that count steps per epoch
    themselves. `batch_map` transforms each global batch (normalization, vectorized). With
    `cache_batches` its results stay in memory: a new iterator skips instantiating it (3 ms).

    On several workers TensorFlow shards the input by `auto_shard_policy` (docs/data.md): "file"
    gives each worker its own files (needs at least as many files as workers), "data" has every
    worker read everything and keep every N-th element, "auto" tries files and falls back to data,
    "off" gives every worker all the data. `skip` global batches are dropped from the start of the
    (endless) stream: a run restored at step N continues where the interrupted one stopped (the
    seeded order, which is the dataset's first iteration): every further `iter()` reshuffles (the
    seeded shuffle's generator belongs to the dataset), so loops train on the first one and never
    open another to peek (`tfrecipe.compat.fix_fit_under_strategy` keeps `fit` from it).

    `chunks`: the elements are chunks of rows a Python reader streams (`Splits.batched`):
    rebatched to the global batch, not auto-sharded (each worker's reader reads its own share,
    `Splits.for_worker`), and under parameter servers returned as a plain dataset the
    coordinator feeds to its workers (a worker's tf.data graph cannot call back into Python).
    `num_rows`: how many rows those chunks hold, when known: the batches are counted for Keras
    (else it cannot tell an evaluation split's end from a reader running dry, and warns).
    """
    auto_shard_policy = feed.auto_shard_policy
    if feed.chunks:
        dataset = _rebatch_chunks(
            dataset, feed.global_batch_size, feed.drop_remainder, feed.num_rows, feed.repeat
        )
        auto_shard_policy = "off"
    else:
        dataset = dataset.batch(feed.global_batch_size, drop_remainder=feed.drop_remainder)
    dataset = _finished(dataset, feed.batch_map, cache=feed.cache_batches)
    if feed.repeat:
        dataset = dataset.repeat()
    if feed.skip:
        # Global batches, before the strategy splits them: every worker skips the same ones.
        dataset = dataset.skip(feed.skip)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = _AUTO_SHARD[auto_shard_policy]
    dataset = dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
    if (feed.chunks or not feed.repeat) and isinstance(
        strategy, tf.distribute.experimental.ParameterServerStrategy
    ):
        # the coordinator evaluates inline, and feeds a Python reader's batches itself
        return dataset
    return strategy.experimental_distribute_dataset(dataset)


def _finished(dataset: tf.data.Dataset, batch_map: Callable | None, *, cache: bool):
    """Each batch through `batch_map` (vectorized), the results held in memory with `cache`."""
    if batch_map is not None:
        dataset = dataset.map(
            graph.plain(batch_map), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
    return dataset.cache() if cache else dataset


def _rebatch_chunks(
    dataset: tf.data.Dataset,
    global_batch_size: int,
    drop_remainder: bool,
    num_rows: int | None,
    repeat: bool,
) -> tf.data.Dataset:
    """A Python reader's chunks of rows as global batches, counted where `num_rows` is known."""
    dataset = dataset.rebatch(global_batch_size, drop_remainder=drop_remainder)
    if num_rows is not None and not repeat:
        batches = num_rows // global_batch_size
        batches += bool(num_rows % global_batch_size) and not drop_remainder
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(batches))
    return dataset


_AUTO_SHARD = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}
