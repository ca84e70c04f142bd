"""This process in a run: who it is in the cluster (a parameter server or worker serves, a
sidecar evaluates), where it writes, and its TensorFlow state (strategy, seeds, precision)."""

from __future__ import annotations

import time
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import compat
from tfrecipe.config import schema
from tfrecipe.config.plan import RunPlan
from tfrecipe.data.tabular import STATS_WAIT_S, StatsCache
from tfrecipe.distribute import cluster, evaluator
from tfrecipe.distribute.strategy import build_strategy, device_kinds
from tfrecipe.errors import ConfigError
from tfrecipe.models.build import build_model, compile_model
from tfrecipe.precision import set_precision
from tfrecipe.rundir import RunFiles
from tfrecipe.training.context import RunContext
from tfrecipe.training.dataset import evaluation_data, load_splits


def join_cluster(spec: schema.Cluster, plan: RunPlan) -> cluster.Task:
    """Who this process is; parameter servers and their workers serve here and never return."""
    if spec.name == "local":
        raise ConfigError(
            "cluster=local: the local launcher runs from the command line (python -m tfrecipe "
            "... cluster=local), not inside a sweep or train(); use cluster=tf_config here"
        )
    task = cluster.current_task(spec)
    if plan.parameter_servers and task.type in ("ps", "worker"):
        cluster.serve(spec)
    return task


def seed_everything(seed: int, *, deterministic: bool) -> None:
    keras.backend.clear_session()  # nothing left over from an earlier run in this process
    keras.utils.set_random_seed(seed)  # Python, NumPy and TensorFlow
    # Set both ways: an earlier run in this process (a sweep job, a test) may have turned it on.
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    else:
        # TensorFlow 2.21 exports only the enabling half (no tf.config...disable_op_determinism).
        compat.disable_op_determinism()


def setup_strategy(
    spec: schema.Strategy,
    cluster_spec: schema.Cluster,
    precision: schema.Precision,
    ctx: RunContext,
) -> tf.distribute.Strategy:
    """The strategy (first: logical devices must be set before any other TensorFlow call),
    then seeds, then the plan's precision policy (seeding clears the Keras session, which
    resets it)."""
    strategy = build_strategy(spec, cluster_resolver=cluster.build_resolver(cluster_spec))
    seed_everything(ctx.seed, deterministic=ctx.deterministic)
    plan = ctx.plan
    set_precision(
        plan.precision,
        require_native=precision.require_native,
        device_kinds=device_kinds(strategy),
        cpu_bfloat16_pays=plan.cpu_bfloat16_pays,
    )
    return strategy


def evaluate_checkpoints(
    ctx: RunContext, model_spec: schema.Target, dataset: schema.Target, batching: schema.Batching
) -> dict[str, Any]:
    """The sidecar evaluator: the run's model (`model_spec`), compiled like training's, scores
    each checkpoint in the run dir on the validation split (the test split when there is none),
    prepared like training's evaluation data, all on the default strategy (it joins no
    collective)."""
    started, run_dir, grants = time.perf_counter(), ctx.home.shared, ctx.grants
    splits = load_splits(
        dataset,
        grants=grants,
        stats_cache=StatsCache(run_dir, chief=False, wait_s=STATS_WAIT_S),  # the chief's
        task=ctx.task,
    )
    model = build_model(model_spec, splits, task=ctx.task, grants=grants)
    compile_model(model, task=ctx.task, grants=grants)
    split = "validation" if splits.validation is not None else "test"
    batch_size = batching.per_replica_batch_size
    data = evaluation_data(splits, split, ctx.pipeline, batch_size=batch_size, seed=ctx.seed)
    chiefs = RunFiles(run_dir)  # the checkpoints and summary.json are the chief's
    return evaluator.evaluate_checkpoints(model, data, home=chiefs, started=started)
