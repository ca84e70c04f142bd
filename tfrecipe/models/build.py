"""The `model` group's model, built for the dataset's inputs and the task's head, and compiled on
the task's objective: defined once for training, `tfrecipe evaluate` and the sidecar evaluator
(which must build exactly what training built); and the Keras classes a saved model needs."""

from __future__ import annotations

from collections.abc import Mapping

from tfrecipe import tasks
from tfrecipe.config import schema
from tfrecipe.config.grants import NO_GRANTS, Grants
from tfrecipe.config.instantiate import instantiate, resolve_target
from tfrecipe.errors import ConfigError


def build_model(spec: schema.Target, splits, *, task: schema.Task, grants: Grants):
    """The `model` group's model for the dataset's inputs and the task's head size (build it in
    the scope of the strategy that will train it).

    Preprocessing that must travel with the model is adapted on the training split only: the
    dataset's own (`splits.preprocessing`, e.g. a CSV's column encoders: the builder then sees
    the encoded width) and the builder's (one that takes `train_features` gets the training
    split's features, e.g. to adapt a text vectorizer). The returned model takes raw inputs.
    With `task.standardize_targets` its outputs are rescaled to the targets' units (mean and
    std of the training split's targets).
    """
    model = _build_model(spec, splits, task=task, grants=grants)
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


def _build_model(spec: schema.Target, splits, *, task: schema.Task, grants: Grants):
    import keras

    from tfrecipe.models import freeze

    parameters = _builder_parameters(spec.target, grants)
    node = spec.model_dump(by_alias=True)
    # Every builder's options (schema.MODEL_OPTIONS): applied here to what it built.
    options = {key: node.pop(key, None) for key in schema.MODEL_OPTIONS}
    extra = {}
    if "train_features" in parameters:
        from tfrecipe.graph import plain

        extra["train_features"] = splits.train.map(plain(lambda features, _: features))
    inputs = encoded = None
    if splits.preprocessing is not None:
        inputs, encoded = splits.preprocessing(splits.train)
    body = instantiate(
        node,
        key="model",
        grants=grants,
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


def _builder_parameters(target: str, grants: Grants) -> Mapping[str, object]:
    """The model builder's parameters (empty when they cannot be read); a builder written for
    the old `num_classes` signature is told what to change."""
    import inspect

    fn = resolve_target(target, key="model", grants=grants)
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if "num_classes" in parameters and "num_outputs" not in parameters:
        raise ConfigError(f"model._target_={target}: {tasks.OLD_SIGNATURE_HINT}")
    return parameters


def objective(task: schema.Task, *, grants: Grants = NO_GRANTS):
    """`make() -> (loss, metrics)`: the task's loss and new metric objects, as `compile_model`
    compiles them; what the custom loops optimize and report (`LoopOptions.objective`)."""

    def make():
        return (
            tasks.loss(task, grants=grants),
            tasks.metrics(task, grants=grants),
        )

    return make


def compile_model(
    model,
    *,
    task: schema.Task,
    optimizer=None,
    steps_per_execution: int = 1,
    jit_compile: bool | str = "auto",
    grants: Grants = NO_GRANTS,
) -> None:
    """The model trains on the task's loss and is scored on its metrics, under the names
    `tasks.metric_names` lists (`loss`, `accuracy`, `auc`, `mae`, ...); `grants` (the
    config's `allowed_targets`) may hold the packages of a `_target_` loss or metric of the user's own."""
    loss, metrics = objective(task, grants=grants)()
    model.compile(
        optimizer=optimizer,
        loss=loss,
        metrics=metrics,
        steps_per_execution=steps_per_execution,
        jit_compile=jit_compile,
    )


def register_custom_objects() -> None:
    """Makes tfrecipe's own Keras classes known (before loading a saved model): the tasks'
    metrics and loss, and the layers of its models (registered when their module loads)."""
    import tfrecipe.models.ensemble
    import tfrecipe.models.text  # noqa: F401  (MaskedMean)

    tasks.register_custom_objects()
