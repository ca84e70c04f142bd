"""The cross-section rules: what each section of the config allows, but not together with the
others (a strategy and a loop, a cluster and a strategy, a model and an export format, a task and
a monitor, ...). Each rule returns problems naming the key to change, the value found there and
how to fix it; `tfrecipe.config.schema.validate` reports them with the sections' own.

No TensorFlow: the rules read the task table (tfrecipe/tasks/) and the export limits
(tfrecipe/config/export_limits.py), never a built object.
"""

from __future__ import annotations

import re

from tfrecipe.config import export_limits as limits
from tfrecipe.config.plan import RunPlan
from tfrecipe.config.run_sections import RunConfig
from tfrecipe.config.step_checks import fit_steps_problems
from tfrecipe.config.training_sections import parse_freeze
from tfrecipe.data import residency
from tfrecipe.errors import Problem


def cross_section_problems(run: RunConfig) -> list[Problem]:
    """What each section allows but not together with the others, as problems naming the key to
    change, the value found there and how to fix it."""
    return [
        *_parameter_server_problems(run),
        *_cluster_problems(run),
        *_loop_problems(run),
        *fit_steps_problems(run),
        *_parameter_server_loop_problems(run),
        *_resume_problems(run),
        *_rollback_problems(run),
        *_monitor_problems(run),
        *_freeze_problems(run),
        *_finetune_problems(run),
        *_task_metric_problems(run),
        *_sweep_problems(run),
        *_tracker_problems(run),
        *_ensemble_problems(run),
        *_export_problems(run),
        *_ema_problems(run),
        *residency.problems(run.pipeline.resident, strategy=RunPlan.from_config(run).strategy),
    ]


def _ema_problems(run: RunConfig) -> list[Problem]:
    """Early stopping's restored weights are raw ones; the averaged weights (optimizer.ema) put
    in place when training ends would replace them."""
    stopping = run.callbacks.early_stopping
    if run.optimizer.ema and stopping.enabled and stopping.restore_best_weights:
        return [
            Problem(
                "optimizer.ema",
                True,
                "with callbacks.early_stopping.restore_best_weights=true the restored best epoch "
                "would be replaced by the final averaged weights; set restore_best_weights=false "
                "(best.weights.h5 holds the best epoch's averaged weights)",
            )
        ]
    return []


def _export_problems(run: RunConfig) -> list[Problem]:
    """A format that cannot carry the configured model is refused before training: string
    preprocessing (TextVectorization, StringLookup) in ONNX, TextVectorization in LiteRT, a
    table's dict of columns in LiteRT's int8 calibration (what each format carries:
    tfrecipe/config/export_limits.py)."""
    formats, problems = list(run.export.formats), []
    if run.model.target == limits.TEXT_MODEL:
        problems += _text_model_problems(formats)
    table = run.dataset.target.startswith(limits.TABLE_DATASETS)
    categorical = (run.dataset.model_extra or {}).get("categorical")
    refused = [f for f in formats if limits.why_not(f, limits.TABLE_CATEGORICAL_LAYER)]
    if table and categorical and refused:  # onnx, the one format the table refuses it in
        problems.append(
            Problem(
                "export.formats",
                formats,
                f"dataset.categorical={list(categorical)} are encoded by StringLookup layers "
                "inside the model, which Keras exports to an invalid ONNX file; remove onnx "
                "(litert, saved_model and keras carry it)",
            )
        )
    quantize = run.export.litert.quantize
    if table and "litert" in formats and quantize in limits.CALIBRATED_QUANTIZATIONS:
        problems.append(
            Problem(
                "export.litert.quantize",
                quantize,
                "a table's model takes a dict of named columns, which LiteRT's int8 calibration "
                "cannot feed (it fails after training); use dynamic or float16, or none",
            )
        )
    return problems


def _text_model_problems(formats: list[str]) -> list[Problem]:
    """model=text holds a TextVectorization layer: each chosen format that cannot carry it."""
    layer = limits.TEXT_MODEL_LAYER
    carriers = " and ".join(limits.carried_by(layer))
    return [
        Problem(
            "export.formats",
            formats,
            f"model=text cannot be exported to {fmt}: {why}; remove {fmt} ({carriers} carry it)",
        )
        for fmt in limits.EXPORT_FORMATS
        if fmt in formats and (why := limits.why_not(fmt, layer, called=f"its {layer} layer"))
    ]


def _finetune_problems(run: RunConfig) -> list[Problem]:
    """Two-phase fine-tuning needs a second phase, a synchronous loop it can recompile and a
    regular expression that compiles (which layers it matches is checked on the built model)."""
    spec, epochs = run.loop.finetune, run.loop.epochs
    if spec.unfreeze_at_epoch is None:
        if spec.unfreeze is not None:
            return [
                Problem(
                    "loop.finetune.unfreeze",
                    spec.unfreeze,
                    "chooses what unfreezes at loop.finetune.unfreeze_at_epoch, which is null; "
                    "set it (e.g. =1)",
                )
            ]
        return []
    key, at, problems = "loop.finetune.unfreeze_at_epoch", spec.unfreeze_at_epoch, []
    if at >= epochs:
        problems.append(
            Problem(
                key,
                at,
                f"the switch must come before the last epoch ends (loop.epochs={epochs}); use "
                f"1..{epochs - 1} or more epochs",
            )
        )
    if RunPlan.from_config(run).parameter_servers:
        problems.append(
            Problem(
                key,
                at,
                "not supported with strategy=parameter_server (its workers keep the traced step "
                "of the first phase); use a synchronous strategy or unfreeze_at_epoch=null",
            )
        )
    if run.callbacks.terminate_on_nan.max_rollbacks:
        problems.append(
            Problem(
                key,
                at,
                "a rollback could cross the switch (the backup before it holds the other "
                "optimizer); set callbacks.terminate_on_nan.max_rollbacks=0",
            )
        )
    return problems + _unfreeze_pattern_problems(spec.unfreeze)


def _unfreeze_pattern_problems(pattern: str | None) -> list[Problem]:
    """`loop.finetune.unfreeze` must compile (which layers it matches is checked on the model)."""
    if pattern is None:
        return []
    try:
        re.compile(pattern)
    except re.error as error:
        return [
            Problem(
                "loop.finetune.unfreeze",
                pattern,
                f"not a regular expression ({error}); expected e.g. 'block_1[3-6]|Conv_1'",
            )
        ]
    return []


def _freeze_problems(run: RunConfig) -> list[Problem]:
    options = run.model.model_extra or {}
    value, anyway = options.get("freeze"), options.get("freeze_random", False)
    try:
        kind, pattern = parse_freeze(value)
    except ValueError as error:
        return [Problem("model.freeze", value, str(error))]
    if kind == "regex" and re.search(pattern, "") is not None:
        # It matches the empty name, so every name: every layer frozen, nothing would train.
        return [
            Problem(
                "model.freeze",
                value,
                "matches every layer name, so nothing would be left to train; anchor it to the "
                "layers to freeze (e.g. '^block[1-3]_'), or use backbone or fraction:F",
            )
        ]
    if not isinstance(anyway, bool):
        return [Problem("model.freeze_random", anyway, "expected true or false")]
    if kind == "none" or anyway or _starts_trained(run):
        return []
    # Frozen random weights never learn: the head alone trains on random features (keras_app's
    # MobileNetV3Small stayed at chance on the digits), and nothing said so.
    weights = "model.weights=imagenet|PATH or " if "weights" in options else ""
    return [
        Problem(
            "model.freeze",
            value,
            "freezes randomly initialized weights (nothing trained to start from), which then "
            f"never learn; pass {weights}model.init_from=RUN_DIR, or model.freeze_random=true "
            "to freeze them anyway",
        )
    ]


def _starts_trained(run: RunConfig) -> bool:
    """Whether the model starts from trained weights: the backbone's own (keras_app's
    `model.weights`), a warm start (`model.init_from`) or a checkpoint (`resume=PATH`)."""
    options = run.model.model_extra or {}
    return bool(options.get("weights") or options.get("init_from")) or run.resume not in (
        "auto",
        "never",
    )


def _task_metric_problems(run: RunConfig) -> list[Problem]:
    """An extra metric (task.metrics) must not take a name the run already reports."""
    from tfrecipe.tasks import extra_metric_name, metric_names

    taken = ["loss", *metric_names(run.task, extra=False)]
    problems = []
    for index, node in enumerate(run.task.metrics):
        name, key = extra_metric_name(node), f"task.metrics.{index}._target_"
        if name.startswith(("val_", "test_")):
            problems.append(
                Problem(
                    key,
                    node.target,
                    f"would be reported as {name!r}; val_ and test_ name a metric on the "
                    "validation and test splits (Keras and summary.json add them), so give it a "
                    f"name without them (name: {name.split('_', 1)[1]})",
                )
            )
        elif name in taken:
            problems.append(
                Problem(
                    key,
                    node.target,
                    f"would be reported as {name!r}, a name the run already reports "
                    f"({', '.join(taken)}); give it another name (name: my_{name})",
                )
            )
        taken.append(name)
    return problems


def _tracker_problems(run: RunConfig) -> list[Problem]:
    """logger=mlflow needs the `tracking` extra: said before training, not as an ImportError
    once the model is built."""
    import importlib.util

    if run.logger.mlflow is None or importlib.util.find_spec("mlflow") is not None:
        return []
    hint = 'MLflow is not installed; pip install "tfrecipe[tracking]" (mlflow-skinny)'
    return [Problem("logger", "mlflow", hint)]


def _ensemble_problems(run: RunConfig) -> list[Problem]:
    """An ensemble's members train one after another in this one process."""
    if run.ensemble.seeds == 1 or (run.cluster.name == "none" and not run.loop.lr_find.only):
        return []
    if run.loop.lr_find.only:
        return [
            Problem(
                "ensemble.seeds",
                run.ensemble.seeds,
                "tfrecipe lr-find sweeps one model; use ensemble.seeds=1",
            )
        ]
    return [
        Problem(
            "ensemble.seeds",
            run.ensemble.seeds,
            f"members train one after another in one process, not on cluster={run.cluster.name}; "
            "use cluster=none (or one run per seed: -m seed=0,1,2)",
        )
    ]


def _sweep_problems(run: RunConfig) -> list[Problem]:
    """The sweep's objective must be a number the task's runs report (else every job's
    objective would be NaN and the sweeper would optimize nothing)."""
    from tfrecipe.tasks import summary_names

    allowed = summary_names(run.task)
    named = {"sweep.objective": run.sweep.objective, "sweep.metric": run.sweep.metric}
    return [
        Problem(
            key, value, f"task={run.task.name} does not report it; allowed: {', '.join(allowed)}"
        )
        for key, value in named.items()
        if value is not None and value not in allowed
    ]


def _monitor_problems(run: RunConfig) -> list[Problem]:
    """A checkpoint or early-stopping monitor must be a value the task's run logs (Keras would
    only warn, each epoch, and never save or stop)."""
    from tfrecipe.tasks import monitors

    allowed = monitors(run.task)
    return [
        Problem(
            f"callbacks.{key}.monitor",
            spec.monitor,
            f"task={run.task.name} does not produce it; allowed: {', '.join(allowed)}",
        )
        for key, spec in (
            ("model_checkpoint", run.callbacks.model_checkpoint),
            ("early_stopping", run.callbacks.early_stopping),
        )
        if spec.enabled and spec.monitor not in allowed
    ]


def _rollback_problems(run: RunConfig) -> list[Problem]:
    """A rollback restarts from a backup once TerminateOnNaN has stopped the loop."""
    spec = run.callbacks.terminate_on_nan
    if not spec.max_rollbacks:
        return []
    key, problems = "callbacks.terminate_on_nan.max_rollbacks", []
    if not spec.enabled:
        problems.append(
            Problem(
                key,
                spec.max_rollbacks,
                "rolls back when TerminateOnNaN stops training, but "
                "callbacks.terminate_on_nan.enabled=false; enable it or set max_rollbacks=0",
            )
        )
    if run.callbacks.backup.enabled is False:
        problems.append(
            Problem(
                key,
                spec.max_rollbacks,
                "rolls back to the last backup, but callbacks.backup.enabled=false; set "
                "callbacks.backup.enabled=true (or null) or max_rollbacks=0",
            )
        )
    if RunPlan.from_config(run).parameter_servers:
        problems.append(
            Problem(
                key,
                spec.max_rollbacks,
                "not supported with strategy=parameter_server (its ClusterCoordinator loop does "
                "not restart in-process from a backup); set max_rollbacks=0",
            )
        )
    return problems


def _resume_problems(run: RunConfig) -> list[Problem]:
    if not run.resume:
        return [Problem("resume", run.resume, "expected auto, never or a checkpoint path")]
    return []


def _loop_problems(run: RunConfig) -> list[Problem]:
    """Each loop's own knobs: a knob the chosen loop would ignore is an error, not a no-op."""
    loop, problems, plan = run.loop, [], RunPlan.from_config(run)
    if plan.loop == "fit" and loop.steps_per_loop not in (1, "auto"):
        problems.append(
            Problem(
                "loop.steps_per_loop",
                loop.steps_per_loop,
                "a loop=custom knob; with loop=fit set batching.steps_per_execution",
            )
        )
    accumulating = loop.gradient_accumulation_steps > 1
    if plan.loop == "fit" and accumulating and run.precision.policy == "mixed_float16":
        # Keras' loss scaling skips an overflowing step in a cond around its own accumulation
        problems.append(
            Problem(
                "loop.gradient_accumulation_steps",
                loop.gradient_accumulation_steps,
                "loop=fit accumulates with Keras' optimizer, which cannot count the float16 "
                "steps loss scaling skips; use loop=custom, or precision=mixed_bfloat16",
            )
        )
    if loop.lr_find.min_lr >= loop.lr_find.max_lr:
        problems.append(
            Problem(
                "loop.lr_find.min_lr",
                loop.lr_find.min_lr,
                f"must be below loop.lr_find.max_lr={loop.lr_find.max_lr} (the sweep goes up)",
            )
        )
    if plan.loop != "fit" and run.batching.steps_per_execution not in (1, "auto"):
        problems.append(
            Problem(
                "batching.steps_per_execution",
                run.batching.steps_per_execution,
                "a Model.fit knob; with loop=custom set loop.steps_per_loop",
            )
        )
    return problems


def _parameter_server_loop_problems(run: RunConfig) -> list[Problem]:
    """The ClusterCoordinator loop schedules one batch per step on whichever worker is free, so
    the custom loop's step knobs have nothing to act on; refused here, before a cluster starts."""
    loop, problems, plan = run.loop, [], RunPlan.from_config(run)
    if not plan.parameter_servers or plan.requested_loop != "custom":
        return []  # loop=fit is refused on its own (_parameter_server_problems)
    if loop.gradient_accumulation_steps != 1:
        problems.append(
            Problem(
                "loop.gradient_accumulation_steps",
                loop.gradient_accumulation_steps,
                "strategy=parameter_server applies each worker's batch on its own (asynchronous "
                "steps, nothing to accumulate); set loop.gradient_accumulation_steps=1",
            )
        )
    if loop.steps_per_loop not in (1, "auto"):  # auto: one step per closure here
        problems.append(
            Problem(
                "loop.steps_per_loop",
                loop.steps_per_loop,
                "strategy=parameter_server schedules one step per closure (ClusterCoordinator); "
                "set loop.steps_per_loop=1",
            )
        )
    return problems


def _parameter_server_problems(run: RunConfig) -> list[Problem]:
    """strategy=parameter_server needs loop=custom, unpartitioned variables and a cluster with
    parameter servers."""
    cluster, problems, plan = run.cluster, [], RunPlan.from_config(run)
    if not plan.parameter_servers:
        return []
    if plan.requested_loop == "fit":  # the plan's loop is parameter_server's
        problems.append(
            Problem(
                "loop",
                "fit",
                "Keras 3 Model.fit does not support strategy=parameter_server; use loop=custom "
                "(ClusterCoordinator schedule/join)",
            )
        )
    if run.strategy.variable_partitioner != "none":
        problems.append(
            Problem(
                "strategy.variable_partitioner",
                run.strategy.variable_partitioner,
                "Keras 3 optimizers cannot update partitioned (sharded) variables "
                "(apply_gradients fails with \"ShardedVariable doesn't support being used as a "
                'reference"); use strategy.variable_partitioner=none',
            )
        )
    if not plan.in_cluster:
        problems.append(
            Problem(
                "strategy",
                "parameter_server",
                "needs a cluster with parameter servers; use cluster=local cluster.num_ps=1 (or "
                "cluster=tf_config / cluster=slurm)",
            )
        )
    if cluster.name == "local" and cluster.num_ps == 0:
        problems.append(
            Problem(
                "cluster.num_ps",
                0,
                "strategy=parameter_server needs at least one parameter server; set "
                "cluster.num_ps=1",
            )
        )
    return problems


def _cluster_problems(run: RunConfig) -> list[Problem]:
    """A local cluster's tasks must fit the strategy."""
    cluster, problems, plan = run.cluster, [], RunPlan.from_config(run)
    strategy = plan.strategy
    if cluster.name == "local" and not plan.parameter_servers and cluster.num_ps:
        problems.append(
            Problem(
                "cluster.num_ps",
                cluster.num_ps,
                "parameter servers serve only strategy=parameter_server (received "
                f"strategy={strategy}); set cluster.num_ps=0",
            )
        )
    if cluster.name == "local" and not plan.multi_worker:
        problems.append(
            Problem(
                "cluster",
                "local",
                "starts several workers, which only strategy=multi_worker_mirrored and "
                f"strategy=parameter_server use (received strategy={strategy})",
            )
        )
    return problems
