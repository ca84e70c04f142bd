"""The run's model under the strategy: built, compiled with its optimizer, warm-started, set
up for two-phase fine-tuning; and what its outputs need (export formats, the signature)."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tfrecipe import factory, optim, signature, tasks
from tfrecipe.config import schema
from tfrecipe.data.splits import Splits
from tfrecipe.distribute.strategy import model_scope
from tfrecipe.errors import ConfigError
from tfrecipe.loops import finetune
from tfrecipe.models import batch_norm, warm_start
from tfrecipe.models import export as exports


def build_model(
    run: schema.RunConfig,
    strategy: tf.distribute.Strategy,
    splits: Splits,
    steps_per_epoch: int,
    global_batch: int,
) -> keras.Model:
    """Model, optimizer, loss and metrics, created under the strategy's scope (one step per
    call until `pacing.pace` decides, after the restore)."""
    _check_fit_accumulation(run, strategy.num_replicas_in_sync)
    with model_scope(strategy):
        model = factory.build_model(
            run.model, splits, task=run.task, allowed_targets=run.allowed_targets
        )
        if run.batching.fused_batch_norm:
            batch_norm.fuse(model)
        total_steps = steps_per_epoch * run.loop.epochs
        optimizer = run_optimizer(run, global_batch, total_steps=total_steps)
        factory.compile_model(
            model,
            task=run.task,
            optimizer=optimizer,
            jit_compile=run.batching.jit_compile,
            allowed_targets=run.allowed_targets,
        )
    return model


def _check_fit_accumulation(run: schema.RunConfig, num_replicas: int) -> None:
    """Keras 3.15's gradient accumulation fails under a strategy with several replicas (its
    accumulate-or-apply `cond` holds a `merge_call`: "merge_call called while defining a new
    graph"); the custom loop accumulates there."""
    steps = run.loop.gradient_accumulation_steps
    if run.loop.name == "fit" and steps > 1 and num_replicas > 1:
        raise ConfigError(
            f"loop.gradient_accumulation_steps={steps}: loop=fit accumulates with Keras' "
            f"optimizer, which fails on {num_replicas} replicas (Keras 3.15: a merge_call inside "
            "its cond); use loop=custom, which accumulates on any strategy"
        )


def initial_learning_rate(run: schema.RunConfig, global_batch: int) -> float:
    """The configured rate scaled (`batching.lr_scaling`) by the examples of one optimizer
    update: the global batch times `loop.gradient_accumulation_steps`."""
    return optim.scaled_learning_rate(
        run.optimizer.learning_rate,
        rule=run.batching.lr_scaling,
        global_batch_size=global_batch * run.loop.gradient_accumulation_steps,
        reference_batch_size=run.batching.lr_reference_batch_size
        or run.batching.per_replica_batch_size,
    )


def run_optimizer(
    run: schema.RunConfig, global_batch: int, *, total_steps: int
) -> keras.optimizers.Optimizer:
    """The run's optimizer: its scaled learning rate on its schedule, loss scaling with float16."""
    schedule = optim.learning_rate_schedule(
        run.optimizer,
        learning_rate=initial_learning_rate(run, global_batch),
        total_steps=total_steps,
    )
    return optim.build_optimizer(
        run.optimizer,
        learning_rate=schedule,
        loss_scaling=run.precision.policy == "mixed_float16",
        # the custom loop accumulates in its own step function
        gradient_accumulation_steps=run.loop.gradient_accumulation_steps
        if run.loop.name == "fit"
        else 1,
    )


def check_export_formats(formats, model: keras.Model) -> None:
    """A format that cannot carry the built model, or whose packages are missing, is refused
    before training (the config check refuses the model kinds it knows: schema._export_problems)."""
    missing = exports.missing_packages(formats)
    if missing:
        raise ConfigError(
            f"export.formats={list(formats)}: needs {', '.join(missing)}, which are not "
            "installed; pip install 'tfrecipe[export]', or remove the format"
        )
    for fmt in formats:
        why = exports.unsupported(model, fmt)
        if why is not None:
            raise ConfigError(
                f"export.formats={list(formats)}: {fmt} cannot carry this model ({why}); "
                f"remove {fmt}"
            )


def two_phases(
    run: schema.RunConfig,
    strategy: tf.distribute.Strategy,
    model: keras.Model,
    steps_per_epoch: int,
    global_batch: int,
) -> finetune.TwoPhases | None:
    """`loop.finetune`'s switch: phase two's optimizer and compile are the run's own."""
    spec = run.loop.finetune
    if spec.unfreeze_at_epoch is None:
        return None

    def new_optimizer() -> keras.optimizers.Optimizer:
        with model_scope(strategy):
            total_steps = steps_per_epoch * run.loop.epochs
            return run_optimizer(run, global_batch, total_steps=total_steps)

    def compile_with(optimizer: keras.optimizers.Optimizer) -> None:
        with model_scope(strategy):
            factory.compile_model(
                model,
                task=run.task,
                optimizer=optimizer,
                steps_per_execution=model.steps_per_execution,
                jit_compile=run.batching.jit_compile,
            )

    plan = finetune.Plan(spec.unfreeze_at_epoch, spec.learning_rate_factor, spec.unfreeze)
    return finetune.TwoPhases(
        model,
        plan,
        steps_per_epoch=steps_per_epoch,
        new_optimizer=new_optimizer,
        compile_with=compile_with,
    )


def warm_start_from(
    model_spec: schema.Target, strategy: tf.distribute.Strategy, model: keras.Model
) -> warm_start.Loaded | None:
    """`model.init_from`: a new run's first weights from an earlier run. Only a new run's: a
    resumed run continues from its own backup, never from init_from again."""
    path = (model_spec.model_extra or {}).get("init_from")
    if path is None:
        return None
    with model_scope(strategy):
        return warm_start.init_from(model, path)


def describe(run: schema.RunConfig, splits: Splits, model: keras.Model) -> dict[str, Any]:
    """What predictions need (signature.json): class names, target encoding, input columns."""
    return signature.describe(
        task=run.task,
        num_outputs=tasks.num_outputs(run.task, splits.info),
        class_names=splits.info.class_names,
        feature_names=splits.info.feature_names,
        features=splits.train.element_spec[0],
        label=(run.dataset.model_extra or {}).get("label"),
        normalize=run.pipeline.normalize,
    )
