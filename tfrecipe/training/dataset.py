"""The `dataset` group's splits as every reader of a run sees them (training, `evaluate`,
`export`, `baseline`, the sidecar evaluator): loaded with the task's class orientation,
checked against the task, and prepared as training evaluates them."""

from __future__ import annotations

from collections.abc import Mapping

from tfrecipe import tasks
from tfrecipe.config import schema
from tfrecipe.config.grants import Grants
from tfrecipe.config.instantiate import instantiate, resolve_target
from tfrecipe.data.pipeline import PipelineOptions, batch_transform, prepare
from tfrecipe.errors import ConfigError


def load_splits(
    spec: schema.Target,
    *,
    grants: Grants,
    stats_cache=None,
    task: schema.Task | None = None,
):
    """The `dataset` group's unbatched splits and their `DatasetInfo` (`data.Splits`).

    `stats_cache`: where a run keeps a table's statistics (`tabular.StatsCache`), for the
    builders that take one (a resume, a second worker and `evaluate` read them back).
    `task`: the run's task, whose `positive_class` decides which class is 1 (`tasks.orient`):
    every reader of a run's data passes it, so that all see the same class ids.
    """
    extra = {}
    if stats_cache is not None and "stats_cache" in _parameters(spec.target, "dataset", grants):
        extra["stats_cache"] = stats_cache
    splits = instantiate(spec.model_dump(by_alias=True), key="dataset", grants=grants, **extra)
    return splits if task is None else tasks.orient(task, splits, dataset=spec.target)


def _parameters(target: str, key: str, grants: Grants) -> Mapping[str, object]:
    import inspect

    try:
        return inspect.signature(resolve_target(target, key=key, grants=grants)).parameters
    except (TypeError, ValueError):
        return {}


def check_targets(spec: schema.Target, info, *, task: schema.Task, global_batch: int = 1) -> None:
    """The dataset's targets against the task, and the head they ask for against the memory
    there is, before training (tasks.check_targets)."""
    tasks.check_targets(task, info, dataset=spec.target)
    _check_head_fits(tasks.num_outputs(task, info), global_batch, dataset=spec.target)


# The least a model's head costs per output: its weights from at least this many units (with
# their gradient and Adam's two slots: 4 copies) and, per example of a batch, the logits, the
# probabilities and their gradient (3 copies), all float32. A real model needs more.
_HEAD_MIN_UNITS = 32


def head_bytes(num_outputs: int, global_batch: int) -> int:
    """A lower bound on the memory a head of `num_outputs` takes while training."""
    return 4 * num_outputs * (4 * _HEAD_MIN_UNITS + 3 * global_batch)


def _check_head_fits(num_outputs: int, global_batch: int, *, dataset: str) -> None:
    """Refuses a class count whose output layer alone cannot fit in memory (a CSV's label ids in
    the billions, a synthetic num_classes typo), before the model allocates it: it would grow
    until the OOM killer ends the process, with no summary and no line saying why."""
    from tfrecipe.data.bundled import available_memory, human_bytes

    needed, available = head_bytes(num_outputs, global_batch), available_memory()
    if available is None or needed <= available:
        return
    raise ConfigError(
        f"dataset {dataset}: {num_outputs} classes (the largest class id + 1) need an output "
        f"layer of at least {human_bytes(needed)} (its weights from {_HEAD_MIN_UNITS} units "
        f"with their gradients and optimizer slots, and the logits of a batch of {global_batch}), "
        f"but {human_bytes(available)} of memory is available; number the classes 0..k-1"
    )


def evaluation_data(splits, split: str, options: PipelineOptions, *, batch_size: int, seed: int):
    """The split named `split` of `splits`, prepared and batched as training evaluates it
    (normalization included), on the default strategy: `batch_size` examples per batch on its
    one replica."""
    import tensorflow as tf

    from tfrecipe.data.distribute import Feed
    from tfrecipe.data.distribute import distribute as distribute_dataset

    dataset = getattr(splits, split)
    prepared = prepare(
        dataset, options, split=split, training=False, seed=seed, chunks=splits.batched
    )
    return distribute_dataset(
        tf.distribute.get_strategy(),
        prepared,
        Feed(
            global_batch_size=batch_size, batch_map=batch_transform(options), chunks=splits.batched
        ),
    )
