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
from tfrecipe.training import baselines, ensemble, inputs, loop, monitors, protection
from tfrecipe.training import model as models
from tfrecipe.training import summary as summaries
from tfrecipe.training.plan import RunPlan
from tfrecipe.training.process import (
    Dirs,
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
        dirs = Dirs(run_dir=Path(run_dir), shared_run_dir=Path(run_dir))
        return _train(config, run, plan, task, dirs)
    # Only the chief writes the run dir; the others write the same files (every worker must
    # take part in saving synchronized variables) to a scratch dir they delete.
    with tempfile.TemporaryDirectory(prefix=f"tfrecipe-{task.type}{task.index}-") as scratch:
        dirs = Dirs(run_dir=Path(scratch), shared_run_dir=Path(run_dir))
        return _train(config, run, plan, task, dirs)


def _train(
    config: Mapping[str, Any], run: schema.RunConfig, plan: RunPlan, task: cluster.Task, dirs: Dirs
) -> dict[str, Any]:
    """Trains into `dirs.run_dir`; however it ends, summary.json says how."""
    with summaries.recording_unfinished(dirs.run_dir, chief=dirs.chief) as attempt:
        if run.ensemble.seeds == 1:
            return _train_steps(config, run, plan, task, dirs, attempt).fields
        return ensemble.train_ensemble(
            config, run, dirs, attempt,
            train_member=lambda c, r, d: _train(c, r, RunPlan.from_config(r), task, d),
            export=_exporting(run).export,
            fit_baselines=_baselines(run),
        ).fields  # fmt: skip


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


def _train_steps(
    config: Mapping[str, Any],
    run: schema.RunConfig,
    plan: RunPlan,
    task: cluster.Task,
    dirs: Dirs,
    attempt: dict[str, RunSummary],
) -> RunSummary:
    """The steps of one run; `attempt["summary"]` is its summary once the run dir holds it."""
    started = time.perf_counter()
    dirs.claim(config, resume=run.resume, allowed=run.resume_allow_changes)
    data_files = dirs.check_data(run.dataset, resume=run.resume, allowed=run.resume_allow_changes)
    strategy = setup_strategy(
        run.strategy, run.cluster, plan, seed=run.seed, deterministic=run.deterministic,
        require_native=run.precision.require_native,
    )  # fmt: skip
    built = _build(run, plan, dirs, strategy)
    summary = _start_summary(config, run, task, dirs, built, started=started)
    signature = models.describe(
        built.splits, built.model, task=run.task, dataset=run.dataset,
        normalize=run.pipeline.normalize,
    )  # fmt: skip
    dirs.record_inputs(signature, data_files)
    attempt["summary"] = summary
    if run.loop.lr_find.enabled:
        summary.update(lr_find=_find_learning_rate(run, plan, built, dirs))
        summary.write()
        if run.loop.lr_find.only:  # `tfrecipe lr-find`: the sweep is the run
            steps = built.start_step
            summary.finish("completed", rows=[], steps_completed=steps, examples_per_sec=None)
            return summary
    _fit(config, run, plan, task, dirs, built, summary)
    return summary


def _build(run: schema.RunConfig, plan: RunPlan, dirs: Dirs, strategy) -> _Built:
    """Data, then (in the strategy's scope) model, optimizer and metrics, then the restore."""
    per_replica_batch, global_batch = inputs.batch_sizes(
        run.batching, strategy.num_replicas_in_sync
    )
    dirs.check_batch(global_batch=global_batch, num_replicas=strategy.num_replicas_in_sync)
    splits, steps_per_epoch = inputs.load_data(
        run.dataset, task=run.task, batching=run.batching, loop=run.loop, global_batch=global_batch,
        allowed_targets=run.allowed_targets, stats_cache=dirs.stats_cache(),
    )  # fmt: skip
    if run.baseline.name == "auto":  # refused before training, not after it
        baselines.check_applicable(splits, dataset=run.dataset.target)
    learning_rate = models.initial_learning_rate(
        run.optimizer.learning_rate, run.batching, global_batch=global_batch, plan=plan
    )
    new_optimizer = models.optimizer_factory(
        run.optimizer, learning_rate=learning_rate, plan=plan,
        total_steps=steps_per_epoch * run.loop.epochs,
    )  # fmt: skip
    model = models.build_compiled(
        run.model, splits, strategy, task=run.task, batching=run.batching,
        new_optimizer=new_optimizer, plan=plan, allowed_targets=run.allowed_targets,
    )  # fmt: skip
    models.check_export_formats(run.export.formats, model)  # before training, not after it
    phases = models.two_phases(
        run.loop.finetune, strategy, model, task=run.task, jit_compile=run.batching.jit_compile,
        new_optimizer=new_optimizer, steps_per_epoch=steps_per_epoch,
    )  # fmt: skip
    nan = run.callbacks.terminate_on_nan
    policy, resumed = _restore(run.resume, nan, dirs, model, phases, steps_per_epoch)
    start_step = resumed.step if resumed else 0
    return _Built(
        strategy=strategy, splits=splits, model=model, per_replica_batch=per_replica_batch,
        global_batch=global_batch, learning_rate=learning_rate, phases=phases, policy=policy,
        resumed=resumed, start_step=start_step,
        warm=models.warm_start_from(run.model, strategy, model) if resumed is None else None,
        steps_per_call=models.pace(model, plan, steps_per_epoch, start_step),  # decided once
        data=inputs.build_inputs(
            splits, strategy, task=run.task, pipeline=run.pipeline, seed=run.seed, plan=plan,
            drop_remainder=run.batching.drop_remainder, steps_per_epoch=steps_per_epoch,
            global_batch=global_batch, start_step=start_step,
        ),
    )  # fmt: skip


def _restore(
    resume: str, nan: schema.TerminateOnNaN, dirs: Dirs, model, phases, steps_per_epoch: int
):
    """The NaN/Inf recovery policy and the restored backup (None: a fresh start)."""
    if phases is not None:  # a backup past the switch holds phase two's optimizer
        phases.resume_in_phase_two(protection.candidates(resume, dirs.backup_dir))
    # before a restore, which sets a float rate's variable to the backup's
    policy = protection.recovery_policy(
        nan, resume=resume, model=model, backup_dir=dirs.backup_dir,
        steps_per_epoch=steps_per_epoch,
    )  # fmt: skip
    return policy, protection.restore(model, resume=resume, backup_dir=dirs.backup_dir)


def _start_summary(
    config: Mapping[str, Any],
    run: schema.RunConfig,
    task: cluster.Task,
    dirs: Dirs,
    built: _Built,
    *,
    started: float,
) -> RunSummary:
    """summary.json as training starts ("running"), with the resolved config beside it."""
    fields = summaries.initial_fields(
        run, num_replicas=built.strategy.num_replicas_in_sync,
        per_replica_batch=built.per_replica_batch, global_batch=built.global_batch,
        learning_rate=built.learning_rate, run_dir=dirs.run_dir,
    )  # fmt: skip
    summary = RunSummary(dirs.run_dir, fields, started=started)
    model = built.model
    summary.update(summaries.how_it_runs(model, steps_per_call=built.steps_per_call, task=task))
    log.info("model: %(total)d parameters, %(trainable)d trainable", summary["params"])
    summary.update(summaries.options_used(built.phases, built.warm, built.data.class_weight))
    summary.update(summaries.about_data(run.task, built.splits.info))
    if built.resumed:
        step = built.resumed.step
        rollbacks = built.policy.resume_rollbacks(model, dirs.shared_run_dir, step)
        summary.update(resumed_from_step=step, rollbacks=rollbacks)
    if dirs.chief:  # stalls of earlier starts of this run (their stack files, summary.json)
        summary.update(stalls=dirs.earlier_stalls())
    summary.start(config, chief=dirs.chief)
    return summary


def _fit(config, run: schema.RunConfig, plan: RunPlan, task, dirs: Dirs, built: _Built, summary):
    """Trains (monitored, protected), tests, exports, fits baselines; summary.json says how."""
    model, data = built.model, built.data
    knobs = monitors.Knobs(
        allowed_targets=run.allowed_targets, export_formats=run.export.formats,
        averaged_weights=bool(run.optimizer.ema), deterministic=run.deterministic,
        sidecar_evaluator=bool(getattr(run.cluster, "evaluator", False)),
        epoch_is_a_pass=not run.loop.steps_per_epoch,
    )  # fmt: skip
    watched = monitors.build_monitors(
        run.callbacks, run.logger, plan, knobs=knobs, config=config, chief=task.is_chief,
        run_dir=dirs.run_dir, inputs=data, global_batch=built.global_batch,
        strategy=built.strategy, start_step=built.start_step, resuming=built.resumed is not None,
        watchdog=dirs.stall_watchdog(run.cluster.stall_timeout, task),
    )  # fmt: skip
    protected = protection.fault_tolerance(
        plan, run.callbacks.backup, model=model, run_dir=dirs.run_dir,
        steps_per_epoch=data.steps_per_epoch, resumed=built.resumed is not None,
    )  # fmt: skip
    measure = loop.measurer(
        plan, data, per_replica_batch=built.per_replica_batch, global_batch=built.global_batch,
        hosts=summary["provenance"]["hosts"], deterministic=run.deterministic,
    )  # fmt: skip
    objective = models.objective(run.task, allowed_targets=run.allowed_targets)
    options = loop.options(
        run.loop, objective=objective, progress=run.callbacks.progress.enabled, inputs=data,
        steps_per_call=built.steps_per_call, input_clock=watched.input_clock,
    )  # fmt: skip
    with loop.recording_end(summary, watched, model, protected, measure):
        trained = loop.train_model(plan, model, data, options=options, summary=summary,
                                   monitors=watched, protected=protected, policy=built.policy,
                                   start_step=built.start_step, phases=built.phases)  # fmt: skip
        rows = watched.history.rows
        summary.update(summaries.best_epoch(run.callbacks, rows, epochs=run.loop.epochs))
        loop.test_and_export(trained, model, data, summary, _exporting(run), rows=rows,
                             objective=objective)  # fmt: skip
        # after the model: it names no layer first
        if dirs.chief and (fit_baselines := _baselines(run)) is not None:
            summary.update(baselines=fit_baselines(built.splits))


def _find_learning_rate(run: schema.RunConfig, plan: RunPlan, built: _Built, dirs: Dirs):
    recompile = functools.partial(  # compiled as the run compiles it
        models.compile_model, task=run.task, jit_compile=run.batching.jit_compile,
        allowed_targets=run.allowed_targets,
    )  # fmt: skip
    return loop.find_learning_rate(
        run.loop.lr_find, plan, built.model, built.data, optimizer=run.optimizer,
        objective=models.objective(run.task, allowed_targets=run.allowed_targets),
        recompile=recompile, run_dir=dirs.run_dir, chief=dirs.chief,
    )  # fmt: skip


def _exporting(run: schema.RunConfig) -> loop.Exporting:
    return loop.Exporting(spec=run.export, pipeline=run.pipeline, task=run.task,
                          batch_size=run.batching.per_replica_batch_size)  # fmt: skip


def _baselines(run: schema.RunConfig):
    """`fit(splits)`: scikit-learn's baselines on the run's splits, with `baseline=auto`."""
    return baselines.fitter(
        run.baseline, task=run.task, pipeline=run.pipeline, seed=run.seed,
        allowed_targets=run.allowed_targets,
    )  # fmt: skip
