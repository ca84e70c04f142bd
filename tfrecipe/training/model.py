"""The run's model under the strategy: built, compiled with its optimizer, warm-started, set
up for two-phase fine-tuning, paced (steps per call); and what its outputs need (export
formats, the signature)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import compat, optim, signature, tasks
from tfrecipe.config import schema
from tfrecipe.config.plan import RunPlan
from tfrecipe.data.splits import Splits
from tfrecipe.distribute.strategy import model_scope
from tfrecipe.errors import ConfigError
from tfrecipe.loops import finetune
from tfrecipe.models import batch_norm, warm_start
from tfrecipe.models import export as exports
from tfrecipe.models.build import build_model, compile_model
from tfrecipe.models.build import objective as objective  # the task's, for the loops
from tfrecipe.training.context import Batches, RunContext


@dataclasses.dataclass(frozen=True)
class Compiled:
    """The run's model, compiled under its strategy, with its scaled learning rate and
    `loop.finetune`'s two phases (or None)."""

    model: keras.Model
    learning_rate: float
    phases: finetune.TwoPhases | None


def build_compiled(
    ctx: RunContext,
    batches: Batches,
    spec: schema.Target,
    optimizer: schema.Optimizer,
    loop: schema.Loop,
    export_formats: list[str],
) -> Compiled:
    """Model (`spec`), optimizer, loss and metrics, created under the strategy's scope (one
    step per call until `pace` decides, after the restore); a format of `export_formats` that
    cannot carry it is refused before training, not after it."""
    learning_rate = initial_learning_rate(
        optimizer.learning_rate, batches.batching, global_batch=batches.global_batch, plan=ctx.plan
    )
    new_optimizer = optimizer_factory(
        optimizer,
        learning_rate=learning_rate,
        plan=ctx.plan,
        total_steps=batches.steps_per_epoch * loop.epochs,
    )
    model = _compiled_model(ctx, batches, spec, new_optimizer)
    check_export_formats(export_formats, model)
    phases = two_phases(loop.finetune, model, batches, ctx, new_optimizer)
    return Compiled(model, learning_rate, phases)


def _compiled_model(
    ctx: RunContext,
    batches: Batches,
    spec: schema.Target,
    new_optimizer: Callable[[], keras.optimizers.Optimizer],
) -> keras.Model:
    strategy, batching = batches.strategy, batches.batching
    _check_fit_accumulation(ctx.plan, strategy.num_replicas_in_sync)
    _check_xla(batching.jit_compile, strategy)
    compat.cache_saving_skipsets()  # its best-weights saves and exports, 2x faster on an MLP
    with model_scope(strategy):
        model = build_model(spec, batches.splits, task=ctx.task, grants=ctx.grants)
        if batching.fused_batch_norm:
            batch_norm.fuse(model)
        compile_model(
            model,
            task=ctx.task,
            optimizer=new_optimizer(),
            jit_compile=batching.jit_compile,
            grants=ctx.grants,
        )
    return model


def _check_fit_accumulation(plan: RunPlan, num_replicas: int) -> None:
    """Keras 3.15's gradient accumulation fails under a strategy with several replicas (its
    accumulate-or-apply `cond` holds a `merge_call`: "merge_call called while defining a new
    graph"); the custom loop accumulates there."""
    steps = plan.optimizer_accumulation_steps()
    if steps > 1 and num_replicas > 1:
        raise ConfigError(
            f"loop.gradient_accumulation_steps={steps}: loop=fit accumulates with Keras' "
            f"optimizer, which fails on {num_replicas} replicas (Keras 3.15: a merge_call inside "
            "its cond); use loop=custom, which accumulates on any strategy"
        )


def _check_xla(jit_compile: bool | str, strategy: tf.distribute.Strategy) -> None:
    """An XLA program runs on exactly one device (TensorFlow's XLA known issues: "tf.Variable on a
    different device"); both loops compile the strategy's whole step, which on several local
    devices fails at the first step. Keras' `auto` turns XLA off under any strategy."""
    if jit_compile is not True or strategy.num_replicas_in_sync < 2:
        return
    devices = strategy.extended.worker_devices
    if len(devices) > 1:
        raise ConfigError(
            f"batching.jit_compile=true: an XLA program runs on exactly one device, and this "
            f"strategy trains on {len(devices)} here ({', '.join(devices)}); allowed with it: "
            "auto (Keras turns XLA off under a strategy) or false"
        )


def pace(model: keras.Model, plan: RunPlan, steps_per_epoch: int, start_step: int) -> int:
    """The run's steps per call (`RunPlan.steps_per_call`), decided once, after the restore (a
    run restored mid-epoch needs calls that also divide the rest of that epoch); fit's model
    takes it as its `steps_per_execution`."""
    steps = plan.steps_per_call(
        num_params=model.count_params(),
        replicas=model.distribute_strategy.num_replicas_in_sync,
        steps_per_epoch=steps_per_epoch,
        start_step=start_step,
    )
    execution = plan.steps_per_execution(steps)
    if execution is not None:  # fit runs micro-batches: each call ends on an update
        model.steps_per_execution = execution
    return steps


def initial_learning_rate(
    learning_rate: float, batching: schema.Batching, *, global_batch: int, plan: RunPlan
) -> float:
    """The configured rate scaled (`batching.lr_scaling`) by the examples of one optimizer
    update: the global batch times `loop.gradient_accumulation_steps`."""
    return optim.scaled_learning_rate(
        learning_rate,
        rule=batching.lr_scaling,
        global_batch_size=global_batch * plan.gradient_accumulation_steps,
        reference_batch_size=batching.lr_reference_batch_size or batching.per_replica_batch_size,
    )


def optimizer_factory(
    spec: schema.Optimizer, *, learning_rate: float, total_steps: int, plan: RunPlan
) -> Callable[[], keras.optimizers.Optimizer]:
    """Makes the run's optimizer (call it in the strategy's scope): its scaled learning rate on
    its schedule, loss scaling with float16."""

    def new_optimizer() -> keras.optimizers.Optimizer:
        schedule = optim.learning_rate_schedule(
            spec, learning_rate=learning_rate, total_steps=total_steps
        )
        return optim.build_optimizer(
            spec,
            learning_rate=schedule,
            loss_scaling=plan.precision == "mixed_float16",
            # the custom loop accumulates in its own step function
            gradient_accumulation_steps=plan.optimizer_accumulation_steps(),
        )

    return new_optimizer


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
    spec: schema.Finetune,
    model: keras.Model,
    batches: Batches,
    ctx: RunContext,
    new_optimizer: Callable[[], keras.optimizers.Optimizer],
) -> finetune.TwoPhases | None:
    """`loop.finetune`'s switch: phase two's optimizer and compile are the run's own."""
    if spec.unfreeze_at_epoch is None:
        return None
    strategy, jit_compile = batches.strategy, batches.batching.jit_compile

    def scoped_optimizer() -> keras.optimizers.Optimizer:
        with model_scope(strategy):
            return new_optimizer()

    def compile_with(optimizer: keras.optimizers.Optimizer) -> None:
        with model_scope(strategy):
            compile_model(
                model,
                task=ctx.task,
                optimizer=optimizer,
                steps_per_execution=model.steps_per_execution,
                jit_compile=jit_compile,
            )

    schedule = finetune.Unfreezing(spec.unfreeze_at_epoch, spec.learning_rate_factor, spec.unfreeze)
    return finetune.TwoPhases(
        model,
        schedule,
        steps_per_epoch=batches.steps_per_epoch,
        new_optimizer=scoped_optimizer,
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


def describe(
    splits: Splits,
    model: keras.Model,
    *,
    task: schema.Task,
    dataset: schema.Target,
    normalize,
) -> dict[str, Any]:
    """What predictions need (signature.json): class names, target encoding, input columns."""
    return signature.describe(
        task=task,
        num_outputs=tasks.num_outputs(task, splits.info),
        class_names=splits.info.class_names,
        feature_names=splits.info.feature_names,
        features=splits.train.element_spec[0],
        label=(dataset.model_extra or {}).get("label"),
        normalize=normalize,
    )
