"""`train(cfg)`: one training run, as a list of steps.

plan -> cluster -> strategy -> precision -> data -> (in strategy.scope()) model, optimizer,
metrics -> (restore) -> loop -> results in the run directory. How each step is assembled lives
in `tfrecipe.training`; what the run decides (the loop, backups, steps per call, precision),
`tfrecipe.training.plan`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tfrecipe import rundir
from tfrecipe.config import schema
from tfrecipe.config.trust import Trust
from tfrecipe.distribute import cluster
from tfrecipe.outcome import TrainingError, ensure_fresh_run_dir
from tfrecipe.runs import RunDir
from tfrecipe.training import baselines, ensemble, inputs, loop, monitors, protection
from tfrecipe.training import model as models
from tfrecipe.training import summary as summaries
from tfrecipe.training.plan import RunPlan
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
    run = schema.validate(cfg, trust=trust or Trust.of_this_process())
    plan = RunPlan.from_config(run)
    task = join_cluster(run.cluster, plan)
    if task.type == "evaluator":  # a sidecar: reads the run dir the workers write
        return evaluate_checkpoints(run, Path(run_dir))
    # What config.yaml and W&B hold: the raw config goes no further than here.
    config = rundir.public_config(cfg)
    if task.is_chief:
        dirs = RunDir.at(run_dir)
        return _train(config, run, plan, task, dirs)
    # Only the chief writes the run dir; the others write the same files (every worker must
    # take part in saving synchronized variables) to a scratch dir they delete.
    with tempfile.TemporaryDirectory(prefix=f"tfrecipe-{task.type}{task.index}-") as scratch:
        dirs = RunDir(path=Path(scratch), shared=Path(run_dir))
        return _train(config, run, plan, task, dirs)


def _train(
    config: Mapping[str, Any], run: schema.RunConfig, plan: RunPlan, task: cluster.Task, dirs
) -> dict[str, Any]:
    """Trains into `dirs.path` (a RunDir), step by step, each step handed its own sections of `run`, the
    plan and what the steps before it built; however it ends, summary.json says how."""
    exporting = loop.Exporting(spec=run.export, pipeline=run.pipeline, task=run.task,
                               batch_size=run.batching.per_replica_batch_size)  # fmt: skip
    fit_baselines = baselines.fitter(run.baseline, task=run.task, pipeline=run.pipeline,
                                     seed=run.seed,
                                     allowed_targets=run.allowed_targets)  # fmt: skip
    recorded = summaries.config_fields(strategy=run.strategy, loop=run.loop, model=run.model,
                                       dataset=run.dataset, precision=run.precision,
                                       seed=run.seed)  # fmt: skip
    with summaries.recording_unfinished(dirs.path, chief=dirs.chief) as attempt:
        started = time.perf_counter()
        dirs.claim(config, resume=run.resume, allowed=run.resume_allow_changes)
        if run.ensemble.seeds > 1:

            def train_member(index: int, member_dirs: RunDir) -> dict[str, Any]:
                member_run, member = schema.member_config(run, config, index)
                member_plan = RunPlan.from_config(member_run)
                return _train(member, member_run, member_plan, task, member_dirs)

            return ensemble.train_ensemble(
                config, dirs, attempt, started=started, recorded=recorded, seed=run.seed,
                seeds=run.ensemble.seeds, dataset=run.dataset, task=run.task,
                allowed_targets=run.allowed_targets, pipeline=run.pipeline,
                batch_size=run.batching.per_replica_batch_size, train_member=train_member,
                export=exporting.export, fit_baselines=fit_baselines,
            ).fields  # fmt: skip
        data_files = dirs.check_data(run.dataset, resume=run.resume,
                                     allowed=run.resume_allow_changes)  # fmt: skip
        strategy = setup_strategy(
            run.strategy, run.cluster, plan, seed=run.seed, deterministic=run.deterministic,
            require_native=run.precision.require_native,
        )  # fmt: skip
        built = _build(
            plan, dirs, strategy, batching=run.batching, dataset=run.dataset, task=run.task,
            loop_spec=run.loop, optimizer=run.optimizer, model_spec=run.model, seed=run.seed,
            pipeline=run.pipeline, allowed_targets=run.allowed_targets, baseline=run.baseline,
            resume=run.resume, nan=run.callbacks.terminate_on_nan, exports=run.export.formats,
        )  # fmt: skip
        summary = _start_summary(
            config, recorded, task, dirs, built, started=started, task_spec=run.task,
            dataset=run.dataset, normalize=run.pipeline.normalize, data_files=data_files,
        )  # fmt: skip
        attempt["summary"] = summary
        objective = models.objective(run.task, allowed_targets=run.allowed_targets)
        if run.loop.lr_find.enabled and _find_learning_rate(
            run.loop.lr_find, plan, built, dirs, summary, objective=objective, task=run.task,
            optimizer=run.optimizer, jit=run.batching.jit_compile, allowed=run.allowed_targets,
        ):  # fmt: skip
            return summary.fields  # `tfrecipe lr-find`: the sweep is the run
        _fit(config, plan, task, dirs, built, summary, callbacks=run.callbacks, logger=run.logger,
             loop_spec=run.loop, cluster=run.cluster, deterministic=run.deterministic,
             ema=run.optimizer.ema, allowed_targets=run.allowed_targets, objective=objective,
             exports=run.export.formats, exporting=exporting, pipeline=run.pipeline,
             fit_baselines=fit_baselines)  # fmt: skip
        return summary.fields


@dataclasses.dataclass(frozen=True)
class _Built:
    """What a run builds before it trains: under its strategy, its data and model, restored."""

    strategy: Any  # tf.distribute.Strategy
    splits: Any  # data.Splits, undistributed
    data: inputs.Inputs
    model: Any  # keras.Model, compiled
    per_replica_batch: int
    global_batch: int
    learning_rate: float
    phases: Any  # loops.finetune.TwoPhases | None
    policy: Any  # fault.recovery.Recovery
    resumed: Any  # the restored backup, or None
    warm: Any  # the warm start (model.init_from), or None
    steps_per_call: int
    start_step: int  # the restored backup's step, or 0


def _build(
    plan: RunPlan, dirs: RunDir, strategy, *, batching: schema.Batching, dataset: schema.Target,
    task: schema.Task, loop_spec: schema.Loop, optimizer: schema.Optimizer,
    model_spec: schema.Target, pipeline, seed: int, allowed_targets: list[str],
    baseline: schema.Baseline, resume: str, nan: schema.TerminateOnNaN, exports: list[str],
) -> _Built:  # fmt: skip
    """Data, then (in the strategy's scope) model, optimizer and metrics, then the restore."""
    per_replica_batch, global_batch = inputs.batch_sizes(batching, strategy.num_replicas_in_sync)
    dirs.check_batch(global_batch=global_batch, num_replicas=strategy.num_replicas_in_sync)
    splits, steps_per_epoch = inputs.load_data(
        dataset, task=task, batching=batching, loop=loop_spec, global_batch=global_batch,
        allowed_targets=allowed_targets, stats_cache=dirs.stats_cache(),
    )  # fmt: skip
    if baseline.name == "auto":  # refused before training, not after it
        baselines.check_applicable(splits, dataset=dataset.target)
    learning_rate = models.initial_learning_rate(optimizer.learning_rate, batching,
                                                 global_batch=global_batch, plan=plan)  # fmt: skip
    total_steps = steps_per_epoch * loop_spec.epochs
    new_optimizer = models.optimizer_factory(optimizer, learning_rate=learning_rate, plan=plan,
                                             total_steps=total_steps)  # fmt: skip
    model = models.build_compiled(
        model_spec, splits, strategy, task=task, batching=batching,
        new_optimizer=new_optimizer, plan=plan, allowed_targets=allowed_targets,
    )  # fmt: skip
    models.check_export_formats(exports, model)  # before training, not after it
    phases = models.two_phases(
        loop_spec.finetune, strategy, model, task=task, jit_compile=batching.jit_compile,
        new_optimizer=new_optimizer, steps_per_epoch=steps_per_epoch,
    )  # fmt: skip
    policy, resumed = protection.restore_protected(
        nan, resume=resume, model=model, phases=phases, backup_dir=dirs.backup_dir,
        steps_per_epoch=steps_per_epoch,
    )  # fmt: skip
    start_step = resumed.step if resumed else 0
    return _Built(
        strategy=strategy, splits=splits, model=model, per_replica_batch=per_replica_batch,
        global_batch=global_batch, learning_rate=learning_rate, phases=phases, policy=policy,
        resumed=resumed, start_step=start_step,
        warm=models.warm_start_from(model_spec, strategy, model) if resumed is None else None,
        steps_per_call=models.pace(model, plan, steps_per_epoch, start_step),  # decided once
        data=inputs.build_inputs(
            splits, strategy, task=task, pipeline=pipeline, seed=seed, plan=plan,
            drop_remainder=batching.drop_remainder, steps_per_epoch=steps_per_epoch,
            global_batch=global_batch, start_step=start_step,
        ),
    )  # fmt: skip


def _start_summary(
    config: Mapping[str, Any], recorded: dict[str, Any], task: cluster.Task, dirs: RunDir,
    built: _Built, *, started: float, task_spec: schema.Task, dataset: schema.Target,
    normalize, data_files,
) -> RunSummary:  # fmt: skip
    """summary.json as training starts ("running"), with the resolved config beside it."""
    fields = summaries.initial_fields(
        recorded, num_replicas=built.strategy.num_replicas_in_sync,
        per_replica_batch=built.per_replica_batch, global_batch=built.global_batch,
        learning_rate=built.learning_rate, run_dir=dirs.path,
    )  # fmt: skip
    summary = RunSummary(dirs.path, fields, started=started)
    model = built.model
    summary.update(summaries.how_it_runs(model, steps_per_call=built.steps_per_call, task=task))
    log.info("model: %(total)d parameters, %(trainable)d trainable", summary["params"])
    summary.update(summaries.options_used(built.phases, built.warm, built.data.class_weight))
    summary.update(summaries.about_data(task_spec, built.splits.info))
    if built.resumed:
        step = built.resumed.step
        rollbacks = built.policy.resume_rollbacks(model, dirs.shared, step)
        summary.update(resumed_from_step=step, rollbacks=rollbacks)
    if dirs.chief:  # stalls of earlier starts of this run (their stack files, summary.json)
        summary.update(stalls=dirs.earlier_stalls())
    summary.start(config, chief=dirs.chief)
    signature = models.describe(built.splits, model, task=task_spec, dataset=dataset,
                                normalize=normalize)  # fmt: skip
    dirs.record_inputs(signature, data_files)
    return summary


def _fit(config, plan: RunPlan, task, dirs: RunDir, built: _Built, summary, *,
         callbacks: schema.Callbacks, logger: schema.Logger, loop_spec: schema.Loop,
         cluster: schema.Cluster, deterministic: bool, ema, allowed_targets: list[str],
         exports: list[str], objective, exporting: loop.Exporting, pipeline,
         fit_baselines) -> None:  # fmt: skip
    """Trains (monitored, protected), tests, exports, fits baselines; summary.json says how."""
    model, data = built.model, built.data
    knobs = monitors.Knobs(allowed_targets=allowed_targets, export_formats=exports,
                           averaged_weights=bool(ema), deterministic=deterministic,
                           sidecar_evaluator=bool(getattr(cluster, "evaluator", False)),
                           epoch_is_a_pass=not loop_spec.steps_per_epoch)  # fmt: skip
    watched = monitors.build_monitors(
        callbacks, logger, plan, knobs=knobs, config=config, chief=task.is_chief,
        run_dir=dirs.path, inputs=data, global_batch=built.global_batch,
        strategy=built.strategy, start_step=built.start_step, resuming=built.resumed is not None,
        watchdog=dirs.stall_watchdog(cluster.stall_timeout, task),
    )  # fmt: skip
    protected = protection.fault_tolerance(
        plan, callbacks.backup, model=model, run_dir=dirs.path,
        steps_per_epoch=data.steps_per_epoch, resumed=built.resumed is not None,
    )  # fmt: skip
    measure = loop.measurer(
        plan, data, per_replica_batch=built.per_replica_batch, global_batch=built.global_batch,
        hosts=summary["provenance"]["hosts"], deterministic=deterministic, pipeline=pipeline,
        steps_per_call=built.steps_per_call, validation_freq=loop_spec.validation_freq,
    )  # fmt: skip
    options = loop.options(
        loop_spec, objective=objective, progress=callbacks.progress.enabled, inputs=data,
        steps_per_call=built.steps_per_call, monitors=watched,
    )  # fmt: skip
    with loop.recording_end(summary, watched, model, protected, measure):
        trained = loop.train_model(plan, model, data, options=options, summary=summary,
                                   monitors=watched, protected=protected, policy=built.policy,
                                   start_step=built.start_step, phases=built.phases)  # fmt: skip
        rows = watched.history.rows
        summary.update(summaries.best_epoch(callbacks, rows, epochs=loop_spec.epochs))
        loop.test_and_export(trained, model, data, summary, exporting, rows=rows,
                             objective=objective)  # fmt: skip
        # after the model: it names no layer first
        if dirs.chief and fit_baselines is not None:
            summary.update(baselines=fit_baselines(built.splits))


def _find_learning_rate(
    spec: schema.LRFind, plan: RunPlan, built: _Built, dirs: RunDir, summary: RunSummary, *,
    objective, task: schema.Task, optimizer: schema.Optimizer, jit: bool, allowed: list[str],
) -> bool:  # fmt: skip
    """The learning-rate sweep, in summary.json; True: the sweep is the run (`tfrecipe lr-find`)."""
    recompile = functools.partial(  # compiled as the run compiles it
        models.compile_model, task=task, jit_compile=jit, allowed_targets=allowed
    )
    found = loop.find_learning_rate(
        spec, plan, built.model, built.data, optimizer=optimizer, objective=objective,
        recompile=recompile, run_dir=dirs.path, chief=dirs.chief,
    )  # fmt: skip
    summary.update(lr_find=found)
    summary.write()
    if spec.only:
        summary.finish("completed", rows=[], steps_completed=built.start_step,
                       examples_per_sec=None)  # fmt: skip
    return spec.only
