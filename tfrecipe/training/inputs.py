"""The run's data: the splits, the optimizer steps per epoch, and the distributed datasets."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfrecipe import graph, tasks
from tfrecipe.config import schema
from tfrecipe.data import resident
from tfrecipe.data.distribute import Feed, input_shard
from tfrecipe.data.distribute import distribute as distribute_dataset
from tfrecipe.data.pipeline import PipelineOptions, batch_transform, prepare
from tfrecipe.data.splits import DatasetInfo, Splits
from tfrecipe.errors import ConfigError
from tfrecipe.training.context import Batches, RunContext
from tfrecipe.training.dataset import check_targets, load_splits


def batch_sizes(spec: schema.Batching, num_replicas: int) -> tuple[int, int]:
    """Returns (per_replica, global): global = per-replica x replicas, or the fixed global
    batch split evenly over the replicas."""
    if spec.global_batch_size is None:
        return spec.per_replica_batch_size, spec.per_replica_batch_size * num_replicas
    if spec.global_batch_size % num_replicas:
        raise ConfigError(
            f"batching.global_batch_size={spec.global_batch_size}: must divide evenly by the "
            f"{num_replicas} replicas; use a multiple of {num_replicas}"
        )
    return spec.global_batch_size // num_replicas, spec.global_batch_size


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The distributed splits (validation and test may be None) and what the loop needs of them."""

    train: tf.distribute.DistributedDataset  # from the run's start step on
    # a held split (resident.HeldEval) beside a held training split
    validation: tf.distribute.DistributedDataset | resident.HeldEval | None
    test: tf.distribute.DistributedDataset | resident.HeldEval | None
    info: DatasetInfo
    steps_per_epoch: int
    # step -> the training data from that optimizer step on (fit's resume, a rollback)
    train_from: Callable[[int], tf.distribute.DistributedDataset]
    # per class id, the weight of its examples' loss in training (task.class_weight), or None
    class_weight: np.ndarray | None = None
    splits: Splits | None = None  # undistributed: examples for checking exports
    # summary.json's `resident`: whether the training split is held on the device, and why
    resident: dict[str, object] | None = None


def load_data(
    ctx: RunContext,
    strategy: tf.distribute.Strategy,
    spec: schema.Target,
    batching: schema.Batching,
    loop: schema.Loop,
) -> Batches:
    """The dataset's splits (not yet distributed), the batch sizes for the strategy's replicas
    (a resumed run keeps its global batch) and the optimizer steps per epoch."""
    replicas = strategy.num_replicas_in_sync
    per_replica_batch, global_batch = batch_sizes(batching, replicas)
    ctx.home.check_batch(global_batch=global_batch, num_replicas=replicas)
    splits = load_splits(
        spec,
        grants=ctx.grants,
        stats_cache=ctx.home.stats_cache(),
        task=ctx.task,
    )
    # the batch first: a typo'd batch size is named as such, not as the memory it would take
    check_batch_fits(batching, global_batch, splits.info.num_train)
    check_targets(spec, splits.info, task=ctx.task, global_batch=global_batch)
    # Steps count optimizer steps; with gradient accumulation each reads N batches, so the
    # default epoch stays about one pass.
    steps_per_epoch = loop.steps_per_epoch or math.ceil(
        _steps_in(splits.info.num_train, global_batch, batching.drop_remainder)
        / loop.gradient_accumulation_steps
    )
    return Batches(strategy, splits, steps_per_epoch, per_replica_batch, global_batch, batching)


def check_batch_fits(spec: schema.Batching, global_batch: int, num_train: int) -> None:
    """A global batch larger than the training split is a typo (every step would repeat
    examples within one batch, or drop_remainder=true would leave no step at all)."""
    if global_batch <= num_train:
        return
    key = "global_batch_size" if spec.global_batch_size is not None else "per_replica_batch_size"
    raise ConfigError(
        f"batching.{key}={getattr(spec, key)}: the global batch ({global_batch}) is larger than "
        f"the training split ({num_train} examples); choose a global batch of at most {num_train}"
    )


def _steps_in(num_examples: int, global_batch: int, drop_remainder: bool) -> int:
    # check_batch_fits made sure global_batch <= num_examples: at least one step.
    if drop_remainder:
        return num_examples // global_batch
    return math.ceil(num_examples / global_batch)


def build_inputs(batches: Batches, ctx: RunContext, *, start_step: int = 0) -> Inputs:
    """The splits distributed with the strategy, training's from `start_step` on (this worker's
    share of a streamed table), weighted by class with `task.class_weight`."""
    splits = batches.splits
    class_weight = tasks.class_weights(ctx.task, splits.train, splits.info, chunks=splits.batched)
    shard = input_shard(batches.strategy)
    if splits.for_worker is not None:  # a streamed table: each worker reads its own share
        splits = splits.for_worker(*shard)
    # a streamed split's rows, where this worker reads them all (Keras counts its batches)
    rows = {"validation": splits.info.num_validation, "test": splits.info.num_test}
    place = functools.partial(_distributed, batches, ctx, splits, class_weight)

    def distribute(dataset: tf.data.Dataset | None, *, split: str, start: int = 0):
        if dataset is None:
            return None
        return place(_Split(dataset, split, start, rows.get(split) if shard[1] == 1 else None))

    choice, held = _held_training(batches, ctx, splits, class_weight)  # pipeline.resident
    # validation and test held beside a held training split: one call evaluates each
    evaluation, held_eval = _held_evaluation(batches, ctx, splits, choice)

    def train_from(step: int) -> tf.distribute.DistributedDataset | resident.ResidentTrain:
        if held is not None:  # micro-batches: N per optimizer step with accumulation
            return resident.ResidentTrain(held, start=step * ctx.plan.gradient_accumulation_steps)
        return distribute(splits.train, split="train", start=step)

    return Inputs(
        train=train_from(start_step),
        validation=held_eval.get("validation") or distribute(splits.validation, split="validation"),
        test=held_eval.get("test") or distribute(splits.test, split="test"),
        info=splits.info,
        steps_per_epoch=batches.steps_per_epoch,
        train_from=train_from,
        class_weight=class_weight,
        splits=splits,
        resident={**choice.fields(), "evaluation": evaluation.fields()},
    )


def _held_training(batches: Batches, ctx: RunContext, splits: Splits, class_weight):
    """`pipeline.resident`: the training split held on the device, normalized and weighted as
    a streamed batch would be (tfrecipe.data.resident), or None where it streams; and why."""
    drop_remainder = batches.batching.drop_remainder
    per_pass = _steps_in(splits.info.num_train, batches.global_batch, drop_remainder)
    return resident.hold_training(
        resident.TrainingRows(splits.train, splits.info.num_train, chunks=splits.batched),
        strategy=batches.strategy,
        layout=resident.Layout(batches.global_batch, per_pass, ctx.seed),
        options=ctx.pipeline,
        finish=_batch_map(ctx.pipeline, class_weight),
        cpu_holds=ctx.plan.cpu_resident_pays,  # on a CPU: residency.CPU_HOLDS
    )


def _held_evaluation(batches: Batches, ctx: RunContext, splits: Splits, training):
    """The validation and test splits held beside a held training split (normalized as a
    streamed evaluation batch is, unweighted), by name, or none where they stream; and why."""
    info = splits.info
    rows = {
        "validation": (splits.validation, info.num_validation),
        "test": (splits.test, info.num_test),
    }
    return resident.hold_evaluation(
        resident.EvaluationRows(
            resident.TrainingRows(splits.train, info.num_train),
            {
                name: resident.TrainingRows(*pair)
                for name, pair in rows.items()
                if pair[0] is not None
            },
            batches.global_batch,
        ),
        training,
        strategy=batches.strategy,
        options=ctx.pipeline,
        finish=_batch_map(ctx.pipeline, None),
    )


@dataclasses.dataclass(frozen=True)
class _Split:
    dataset: tf.data.Dataset
    name: str  # train, validation, test
    start: int  # the optimizer step training's data starts at
    num_rows: int | None  # a streamed split's rows, where this worker reads them all


def _distributed(
    batches: Batches, ctx: RunContext, splits: Splits, class_weight, split: _Split
) -> tf.distribute.DistributedDataset:
    """One split of `splits`, prepared as the pipeline says and distributed."""
    training = split.name == "train"
    pipeline = ctx.pipeline
    batch_map = _batch_map(pipeline, class_weight if training else None)
    place = _placement(pipeline, batch_map, split.dataset, training=training, splits=splits)
    dataset = prepare(
        place.rows_mapped(split.dataset),
        place.rows,
        split=split.name,
        training=training,
        seed=ctx.seed,
        chunks=splits.batched,
    )
    feed = Feed(
        global_batch_size=batches.global_batch,
        drop_remainder=batches.batching.drop_remainder and training,
        # Training data is endless; an epoch is `steps_per_epoch` steps of one iterator, so
        # with the default (one pass per epoch) each epoch sees every example once.
        repeat=training,
        auto_shard_policy=pipeline.auto_shard_policy,
        batch_map=place.batch_map,
        # A restored run continues the same seeded stream where the backup was taken.
        skip=split.start * ctx.plan.gradient_accumulation_steps,
        chunks=splits.batched,
        num_rows=split.num_rows,
        cache_batches=place.cache_batches,
    )
    return distribute_dataset(batches.strategy, dataset, feed)


# A training split mapped before its memory cache grows by the map (uint8 images: 4x as float32);
# above this it stays as read, mapped batch by batch.
PREMAP_MAX_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where a split's batch map runs, and what is cached: `rows` is the pipeline `prepare`
    applies to the rows, `premap` maps the rows once before it (and its cache), `batch_map` maps
    each batch after batching, `cache_batches` holds the mapped batches in memory."""

    rows: PipelineOptions
    premap: Callable | None
    batch_map: Callable | None
    cache_batches: bool

    def rows_mapped(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        if self.premap is None:
            return dataset
        # vectorized, in chunks: the map is written for batches (the values are the same)
        mapped = dataset.batch(1024).map(
            graph.plain(self.premap), num_parallel_calls=tf.data.AUTOTUNE
        )
        return mapped.unbatch()


def _placement(
    pipeline: PipelineOptions,
    batch_map: Callable,
    dataset: tf.data.Dataset,
    *,
    training: bool,
    splits: Splits,
) -> _Placement:
    """Under `pipeline.cache=memory` the map runs once, not on every batch of every epoch:
    - evaluation splits are cached as mapped batches (a new iterator per validation then skips
      instantiating the map's function, 2.9 ms);
    - the training split is mapped before its cache, so that its epochs only shuffle and batch
      (57 against 108-116 us per batch of 64 on the 2-core EPYC), unless augmentation works on
      the rows as read or the mapped rows would pass PREMAP_MAX_BYTES.
    Anything else (a file cache, no cache, streamed tables) maps each batch."""
    as_read = _Placement(pipeline, None, batch_map, cache_batches=False)
    if pipeline.cache != "memory" or splits.batched:
        return as_read
    if not training:
        return _Placement(pipeline.model_copy(update={"cache": None}), None, batch_map, True)
    if (
        pipeline.augments
        or _mapped_bytes(dataset.element_spec[0], splits.info.num_train) > PREMAP_MAX_BYTES
    ):
        return as_read
    return _Placement(pipeline, batch_map, None, cache_batches=False)


def _mapped_bytes(features: object, rows: int) -> float:
    """What `rows` examples of `features` take as float32 after the map (0: not integer arrays,
    which the map leaves as large as they are; infinite: a shape not known before reading)."""
    if not isinstance(features, tf.TensorSpec) or not features.dtype.is_integer:
        return 0
    if not features.shape.is_fully_defined():
        return math.inf
    return 4 * rows * features.shape.num_elements()


def _batch_map(pipeline: PipelineOptions, class_weight: np.ndarray | None):
    """What each batch goes through: normalization, then (with class weights) each example's
    weight: (x, y, w), Keras' sample-weight form."""
    batch_map = batch_transform(pipeline)
    if class_weight is not None:
        batch_map = tasks.weigh_examples(class_weight, after=batch_map)
    return batch_map
