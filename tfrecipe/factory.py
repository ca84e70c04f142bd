"""The run's data, model and objective, defined once for training, `tfrecipe evaluate` and the
sidecar evaluator (which must build exactly what training built)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from tfrecipe import tasks
from tfrecipe.config import schema
from tfrecipe.config.instantiate import instantiate, resolve_target
from tfrecipe.data.pipeline import PipelineOptions, batch_transform, prepare
from tfrecipe.data.splits import batch
from tfrecipe.errors import ConfigError


def load_splits(
    spec: schema.Target,
    *,
    allowed_targets: list[str],
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
    if stats_cache is not None and "stats_cache" in _parameters(
        spec.target, "dataset", allowed_targets
    ):
        extra["stats_cache"] = stats_cache
    splits = instantiate(
        spec.model_dump(by_alias=True), key="dataset", allowed=allowed_targets, **extra
    )
    return splits if task is None else tasks.orient(task, splits, dataset=spec.target)


def _parameters(target: str, key: str, allowed_targets: list[str]) -> Mapping[str, object]:
    import inspect

    try:
        return inspect.signature(
            resolve_target(target, key=key, allowed=allowed_targets)
        ).parameters
    except (TypeError, ValueError):
        return {}


def build_model(spec: schema.Target, splits, *, task: schema.Task, allowed_targets: list[str]):
    """The `model` group's model for the dataset's inputs and the task's head size (build it in
    the scope of the strategy that will train it).

    Preprocessing that must travel with the model is adapted on the training split only: the
    dataset's own (`splits.preprocessing`, e.g. a CSV's column encoders: the builder then sees
    the encoded width) and the builder's (one that takes `train_features` gets the training
    split's features, e.g. to adapt a text vectorizer). The returned model takes raw inputs.
    With `task.standardize_targets` its outputs are rescaled to the targets' units (mean and
    std of the training split's targets).
    """
    model = _build_model(spec, splits, task=task, allowed_targets=allowed_targets)
    scaling = tasks.target_scaling(task, splits.train, chunks=splits.batched)
    return model if scaling is None else _in_original_units(model, *scaling)


def _in_original_units(model, mean, std):
    """The model's outputs put back in the targets' units (output x std + mean, in float32):
    its head learns standardized targets, yet predictions, metrics and the exported model are
    in the original units."""
    import keras

    rescale = keras.layers.Rescaling(
        scale=std.tolist(), offset=mean.tolist(), dtype="float32", name="original_units"
    )
    try:  # `input`, not `inputs`: a model taking a dict of columns keeps taking one
        inputs, outputs = model.input, model.output
    except (AttributeError, ValueError):
        raise ConfigError(
            "task.standardize_targets=true: appends a rescaling layer to the model, which needs "
            f"a functional or Sequential model; {model.name} is a subclassed model (rescale its "
            "outputs yourself, or set task.standardize_targets=false)"
        ) from None
    return keras.Model(inputs, rescale(outputs), name=model.name)


def _build_model(spec: schema.Target, splits, *, task: schema.Task, allowed_targets: list[str]):
    import keras

    from tfrecipe.models import freeze

    parameters = _builder_parameters(spec.target, allowed_targets)
    node = spec.model_dump(by_alias=True)
    # Every builder's options (schema.MODEL_OPTIONS): applied here to what it built.
    options = {key: node.pop(key, None) for key in schema.MODEL_OPTIONS}
    extra = {}
    if "train_features" in parameters:
        extra["train_features"] = splits.train.map(lambda features, _: features)
    inputs = encoded = None
    if splits.preprocessing is not None:
        inputs, encoded = splits.preprocessing(splits.train)
    body = instantiate(
        node,
        key="model",
        allowed=allowed_targets,
        input_shape=splits.info.input_shape if encoded is None else tuple(encoded.shape[1:]),
        num_outputs=tasks.num_outputs(task, splits.info),
        **extra,
    )
    freeze.apply(body, options["freeze"])
    if encoded is None:
        _check_takes_text(body, splits.train, spec.target)
        return body
    return keras.Model(inputs, body(encoded), name=body.name)


def _check_takes_text(model, train, target: str) -> None:
    """Raw strings (a text dataset) need a model that tokenizes them itself (`model=text`):
    any other would fail in its first training step with a TensorFlow cast error."""
    features = train.element_spec[0]
    if getattr(features, "dtype", None) != "string":
        return
    if any(getattr(x, "dtype", None) != "string" for x in model.inputs):
        raise ConfigError(
            f"model._target_={target}: the dataset gives raw text (strings) and this model "
            "takes numbers; use model=text (it tokenizes inside the model)"
        )


def _builder_parameters(target: str, allowed_targets: list[str]) -> Mapping[str, object]:
    """The model builder's parameters (empty when they cannot be read); a builder written for
    the old `num_classes` signature is told what to change."""
    import inspect

    fn = resolve_target(target, key="model", allowed=allowed_targets)
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if "num_classes" in parameters and "num_outputs" not in parameters:
        raise ConfigError(f"model._target_={target}: {tasks.OLD_SIGNATURE_HINT}")
    return parameters


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

    from tfrecipe.data.distribute import distribute as distribute_dataset

    dataset = getattr(splits, split)
    prepared = prepare(dataset, options, split=split, training=False, seed=seed,
                       chunks=splits.batched)  # fmt: skip
    return distribute_dataset(
        tf.distribute.get_strategy(),
        prepared,
        global_batch_size=batch_size,
        batch_map=batch_transform(options),
        chunks=splits.batched,
    )


def feature_batches(
    dataset, options: PipelineOptions, *, batch_size: int, limit: int, chunks: bool = False
) -> list:
    """The first `limit` examples' features of a split (`chunks`: a streamed table's), as NumPy
    batches normalized as the model takes them (`batch_transform`): what exports are checked
    and calibrated on."""
    normalize = batch_transform(options)
    batches = batch(dataset, batch_size, chunks=chunks).take(-(-limit // batch_size))
    return list(batches.map(lambda x, y: normalize(x, y)[0]).as_numpy_iterator())


def scorer(
    dataset, options: PipelineOptions, *, task: schema.Task, batch_size: int, chunks: bool = False
):
    """`score(predict) -> {metric: value}`: the task's metrics (`tasks.metrics`) of a predict
    function (features -> model outputs) on a whole split, e.g. an exported model's runtime."""
    import numpy as np

    normalize = batch_transform(options)
    batches = batch(dataset, batch_size, chunks=chunks).map(normalize)

    def score(predict) -> dict[str, float]:
        metrics = tasks.metrics(task)
        for x, y in batches.as_numpy_iterator():
            outputs = np.asarray(predict(x), dtype=np.float32)
            for metric in metrics:
                metric.update_state(y, outputs.reshape(len(y), -1))
        return {metric.name: float(metric.result()) for metric in metrics}

    return score


# A model below this many parameters takes a small fraction of a millisecond per example, so a
# training step costs about as much as the Python (callbacks, dispatch) around it: several steps
# per call pay that once. Above it one step per call loses nothing and keeps hooks per step.
SMALL_MODEL_PARAMS = 1_000_000
MAX_STEPS_PER_CALL = 32


def steps_per_call(
    requested: int | str,
    *,
    num_params: int,
    steps_per_epoch: int,
    start_step: int = 0,
    hook_intervals: tuple[int, ...] = (),
    short_last_call: bool = False,
) -> int:
    """`batching.steps_per_execution` / `loop.steps_per_loop`, with "auto" resolved: for a small
    model the largest number up to MAX_STEPS_PER_CALL that divides every step interval a
    per-step hook was asked for (`hook_intervals`: backups, step logs keep their steps) and,
    unless the loop ends an epoch with a shorter call (`short_last_call`: the custom loop),
    `steps_per_epoch` and the steps left in the epoch a restored run starts in (`fit`'s last
    call of an epoch would otherwise run past the epoch on endless data); else 1. It depends on
    the config, the model and the restored step only, so every replica and worker picks the
    same."""
    if requested != "auto":
        return int(requested)
    if num_params >= SMALL_MODEL_PARAMS:
        return 1
    epoch = () if short_last_call else (steps_per_epoch, start_step % steps_per_epoch)
    period = math.gcd(*epoch, *hook_intervals) or MAX_STEPS_PER_CALL  # 0: nothing constrains it
    return max(d for d in range(1, min(MAX_STEPS_PER_CALL, period) + 1) if period % d == 0)


def compile_model(
    model,
    *,
    task: schema.Task,
    optimizer=None,
    steps_per_execution: int = 1,
    jit_compile: bool | str = "auto",
    allowed_targets: Iterable[str] = (),
) -> None:
    """The model trains on the task's loss and is scored on its metrics, under the names
    `tasks.metric_names` lists (`loss`, `accuracy`, `auc`, `mae`, ...); `allowed_targets`
    may hold the packages of a `_target_` loss or metric of the user's own."""
    model.compile(
        optimizer=optimizer,
        loss=tasks.loss(task, allowed_targets=allowed_targets),
        metrics=tasks.metrics(task, allowed_targets=allowed_targets),
        steps_per_execution=steps_per_execution,
        jit_compile=jit_compile,
    )


def register_custom_objects() -> None:
    """Makes tfrecipe's own Keras classes known (before loading a saved model): the tasks'
    metrics and loss, and the layers of its models (registered when their module loads)."""
    import tfrecipe.models.ensemble
    import tfrecipe.models.text  # noqa: F401  (MaskedMean)

    tasks.register_custom_objects()
