"""`train(cfg)`: one training run, as a list of steps.

plan -> cluster -> strategy -> precision -> data -> (in strategy.scope()) model, optimizer,
metrics -> (restore) -> loop -> results in the run directory. How each step is assembled lives
in `tfrecipe.training`; what the run decides (the loop, backups, steps per call, precision),
`tfrecipe.config.plan`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tfrecipe import rundir
from tfrecipe.config import schema
from tfrecipe.config.changes import Resuming
from tfrecipe.config.plan import RunPlan
from tfrecipe.config.trust import Trust
from tfrecipe.outcome import TrainingError, ensure_fresh_run_dir
from tfrecipe.runs import RunDir
from tfrecipe.training import baselines, ensemble, inputs, loop, lr_find, monitors, protection
from tfrecipe.training import model as models
from tfrecipe.training import summary as summaries
from tfrecipe.training.context import Batches, Built, RunContext
from tfrecipe.training.process import (
    evaluate_checkpoints,
    join_cluster,
    seed_everything,
    setup_strategy,
)
from tfrecipe.training.summary import RunSummary

__all__ = ["TrainingError", "batch_sizes", "ensure_fresh_run_dir", "seed_everything", "train"]

log = logging.getLogger("tfrecipe")
batch_sizes = inputs.batch_sizes


def train(cfg: DictConfig, *, run_dir: str | Path, trust: Trust | None = None) -> dict[str, Any]:
    """Trains as `cfg` says; writes the run directory; returns the summary (summary.json).

    Args:
      cfg: the composed config (`tfrecipe.compose(overrides)`).
      run_dir: where the run writes.
      trust: what may grant code (`allowed_targets`): `Trust.from_command_line(overrides)` for
        the overrides you composed with; None: what this process's command line granted (a
        sweep's job inherits its sweep's), which in a plain Python process is nothing.

    Raises:
      ConfigError: the configuration is invalid (nothing has been written).
      TrainingError: training failed (summary.json says "failed").
    """
    trust = trust or Trust.of_this_process()
    run = schema.validate(cfg, trust=trust, environment=True)
    lr_find.check_own_run_dir(Path(run_dir), run.loop.lr_find)  # before anything is written
    plan = RunPlan.from_config(run)
    task = join_cluster(run.cluster, plan)
    # What config.yaml and W&B hold: the raw config goes no further than here.
    context = functools.partial(
        RunContext.of, run, plan=plan, config=rundir.public_config(cfg), cluster_task=task
    )
    if task.type == "evaluator":  # a sidecar: reads the run dir the workers write
        sidecar = context(home=RunDir.at(run_dir), trust=trust)
        return evaluate_checkpoints(sidecar, run.model, run.dataset, run.batching)
    if task.is_chief:
        return _train(context(home=RunDir.at(run_dir), trust=trust), run)
    # Only the chief writes the run dir; the others write the same files (every worker must
    # take part in saving synchronized variables) to a scratch dir they delete.
    with tempfile.TemporaryDirectory(prefix=f"tfrecipe-{task.type}{task.index}-") as scratch:
        home = RunDir(path=Path(scratch), shared=Path(run_dir))
        return _train(context(home=home, trust=trust), run)


def _train(ctx: RunContext, run: schema.RunConfig) -> dict[str, Any]:
    """Trains into `ctx.home`, one stage a line, each handed its own sections of `run`, the
    context and what the stages before it built; however it ends, summary.json says how."""
    home, finishing = ctx.home, loop.finishing(ctx, run.export, run.batching, run.baseline)
    with summaries.recording_unfinished(home) as attempt:
        started = time.perf_counter()
        home.claim(ctx.config, Resuming.of(run))
        if run.ensemble.seeds > 1:
            members = _members(ctx, run, finishing)
            return ensemble.train_ensemble(ctx, attempt, members, started=started).fields
        data_files = home.check_data(run.dataset, Resuming.of(run))
        strategy = setup_strategy(run.strategy, run.cluster, run.precision, ctx)
        batches = inputs.load_data(ctx, strategy, run.dataset, run.batching, run.loop)
        baselines.check_before_training(batches.splits, run)  # `baseline=auto`, not after it
        compiled = models.build_compiled(
            ctx, batches, run.model, run.optimizer, run.loop, run.export.formats
        )
        built = _restore(
            ctx, batches, compiled, run.callbacks.terminate_on_nan, run.resume, run.model
        )
        protection.check_epochs_left(built.resumed, batches.steps_per_epoch, run.loop.epochs)
        summary = _start_summary(ctx, built, run.dataset, started, data_files)
        attempt["summary"] = summary
        fitting = _Fitting(
            callbacks=run.callbacks,
            logger=run.logger,
            loop=run.loop,
            cluster=run.cluster,
            optimizer=run.optimizer,
            objective=models.objective(ctx.task, grants=ctx.grants),
        )
        if run.loop.lr_find.enabled and _find_learning_rate(ctx, built, summary, fitting):
            return summary.fields  # `tfrecipe lr-find`: the sweep is the run
        _fit(ctx, built, summary, fitting, finishing)
        return summary.fields


def _members(ctx: RunContext, run: schema.RunConfig, finishing: loop.Finishing) -> ensemble.Members:
    """`ensemble.seeds` > 1: each member a run of its own (`schema.member_config`) in
    RUN_DIR/members/I, trained as `_train` trains one."""

    def train_member(index: int, home: RunDir) -> dict[str, Any]:
        member_run, config = schema.member_config(run, ctx.config, index)
        plan = RunPlan.from_config(member_run)
        member = RunContext.of(
            member_run,
            plan=plan,
            config=config,
            home=home,
            cluster_task=ctx.cluster_task,
            trust=ctx.grants.trust,
        )
        return _train(member, member_run)

    return ensemble.Members(
        seeds=run.ensemble.seeds,
        dataset=run.dataset,
        batch_size=run.batching.per_replica_batch_size,
        train_member=train_member,
        export=finishing.exporting.export,
        fit_baselines=finishing.fit_baselines,
    )


def _restore(
    ctx: RunContext,
    batches: Batches,
    compiled: models.Compiled,
    nan: schema.TerminateOnNaN,
    resume: str,
    model_spec: schema.Target,
) -> Built:
    """The NaN/Inf recovery policy and the restored backup (`resume`), else the warm start
    (`model_spec`'s init_from); then the steps per call and the distributed data, from the
    restored step on."""
    model, strategy = compiled.model, batches.strategy
    policy, resumed = protection.restore_protected(
        nan,
        resume=resume,
        model=model,
        phases=compiled.phases,
        backup_dir=ctx.home.backup_dir,
        steps_per_epoch=batches.steps_per_epoch,
    )
    start_step = resumed.step if resumed else 0
    return Built(
        batches=batches,
        model=model,
        learning_rate=compiled.learning_rate,
        phases=compiled.phases,
        policy=policy,
        resumed=resumed,
        warm=models.warm_start_from(model_spec, strategy, model) if resumed is None else None,
        steps_per_call=models.pace(model, ctx.plan, batches.steps_per_epoch, start_step),
        data=inputs.build_inputs(batches, ctx, start_step=start_step),
    )


def _start_summary(
    ctx: RunContext, built: Built, dataset: schema.Target, started: float, data_files
) -> RunSummary:
    """summary.json as training starts ("running"), with the resolved config beside it."""
    home, model = ctx.home, built.model
    fields = summaries.initial_fields(
        dict(ctx.recorded),
        num_replicas=built.strategy.num_replicas_in_sync,
        per_replica_batch=built.per_replica_batch,
        global_batch=built.global_batch,
        learning_rate=built.learning_rate,
        run_dir=home.path,
    )
    summary = RunSummary(home, fields, started=started)
    summary.update(
        summaries.how_it_runs(model, steps_per_call=built.steps_per_call, task=ctx.cluster_task)
    )
    log.info("model: %(total)d parameters, %(trainable)d trainable", summary["params"])
    summary.update(summaries.options_used(built.phases, built.warm, built.data.class_weight))
    summary.update(summaries.about_data(ctx.task, built.splits.info))
    summary.update(resident=summaries.residency(built.data, model))  # pipeline.resident, XLA
    summaries.log_choices(summary)  # where the training data live, XLA's compile cache
    if built.resumed:
        rollbacks = built.policy.resume_rollbacks(model, home.shared, built.resumed.step)
        earlier = summaries.earlier_warm_start(home.shared)  # restored, not warm-started again
        summary.update(resumed_from_step=built.resumed.step, rollbacks=rollbacks, **earlier)
    if home.chief:  # stalls of earlier starts of this run (their stack files, summary.json)
        summary.update(stalls=home.earlier_stalls())
    summary.start(ctx.config, chief=home.chief)
    normalize = ctx.pipeline.normalize
    signature = models.describe(
        built.splits, model, task=ctx.task, dataset=dataset, normalize=normalize
    )
    home.record_inputs(signature, data_files)
    return summary


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Fitting:
    """The sections training reads, and the task's objective (loss and metrics)."""

    callbacks: schema.Callbacks
    logger: schema.Logger
    loop: schema.Loop
    cluster: schema.Cluster
    optimizer: schema.Optimizer
    objective: Callable[[], tuple[Any, Any]]


def _fit(
    ctx: RunContext, built: Built, summary: RunSummary, fitting: _Fitting, finishing: loop.Finishing
) -> None:
    """Trains (monitored, protected), tests, exports, fits baselines; summary.json says how."""
    callbacks, loop_spec = fitting.callbacks, fitting.loop
    watched = _monitors(ctx, built, fitting, finishing.exporting.spec.formats)
    protected = protection.fault_tolerance(
        ctx.plan,
        callbacks.backup,
        model=built.model,
        run_dir=ctx.home.path,
        steps_per_epoch=built.data.steps_per_epoch,
        resumed=built.resumed,
    )
    hosts = summary["provenance"]["hosts"]
    measure = loop.measurer(ctx, built, hosts=hosts, validation_freq=loop_spec.validation_freq)
    options = loop.options(
        loop_spec,
        objective=fitting.objective,
        progress=callbacks.progress.enabled and ctx.chief,  # the chief's lines alone
        inputs=built.data,
        steps_per_call=built.steps_per_call,
        monitors=watched,
    )
    options = loop.with_epoch_groups(options, ctx, built, watched, protected, summary)
    with loop.recording_end(summary, watched, built.model, protected, measure):
        trained = loop.train_model(ctx, built, options, summary, watched, protected)
        rows = watched.history.rows
        summary.update(summaries.best_epoch(callbacks, rows, epochs=loop_spec.epochs))
        exporting = finishing.exporting
        loop.test_and_export(
            trained, built, summary, exporting, rows=rows, objective=fitting.objective
        )
        # after the model: it names no layer first
        if ctx.chief and finishing.fit_baselines is not None:
            summary.update(baselines=finishing.fit_baselines(built.splits))


def _monitors(
    ctx: RunContext, built: Built, fitting: _Fitting, export_formats: list[str]
) -> monitors.Monitors:
    """The callbacks, trackers and clocks every loop drives; the stall watchdog first."""
    knobs = monitors.MonitorOptions(
        export_formats=export_formats,
        averaged_weights=bool(fitting.optimizer.ema),
        sidecar_evaluator=bool(getattr(fitting.cluster, "evaluator", False)),
        epoch_is_a_pass=not fitting.loop.steps_per_epoch,
    )
    watchdog = ctx.home.stall_watchdog(fitting.cluster.stall_timeout, ctx.cluster_task)
    return monitors.build_monitors(ctx, built, fitting.callbacks, fitting.logger, knobs, watchdog)


def _find_learning_rate(
    ctx: RunContext, built: Built, summary: RunSummary, fitting: _Fitting
) -> bool:
    """The learning-rate sweep, in summary.json; True: the sweep is the run (`tfrecipe lr-find`)."""
    spec = fitting.loop.lr_find
    recompile = functools.partial(  # compiled as the run compiles it
        models.compile_model,
        task=ctx.task,
        jit_compile=built.batches.batching.jit_compile,
        grants=ctx.grants,
    )
    sweeping = lr_find.Sweeping(fitting.optimizer, fitting.objective, recompile)
    found = loop.find_learning_rate(spec, ctx, built, sweeping)
    summary.update(lr_find=found, **lr_find.own_mark(spec))
    summary.write()
    if spec.only:
        summary.finish(
            "completed", rows=[], steps_completed=built.start_step, examples_per_sec=None
        )
    return spec.only
