"""This process in a run: who it is in the cluster (a parameter server or worker serves, a
sidecar evaluates), where it writes, and its TensorFlow state (strategy, seeds, precision)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import compat
from tfrecipe.config import schema
from tfrecipe.data.tabular import STATS_WAIT_S, StatsCache
from tfrecipe.distribute import cluster, evaluator
from tfrecipe.distribute.strategy import build_strategy, device_kinds
from tfrecipe.errors import ConfigError
from tfrecipe.models.build import build_model, compile_model
from tfrecipe.precision import set_precision
from tfrecipe.training.dataset import evaluation_data, load_splits
from tfrecipe.training.plan import RunPlan


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
    plan: RunPlan,
    *,
    seed: int,
    deterministic: bool,
    require_native: bool,
) -> tf.distribute.Strategy:
    """The strategy (first: logical devices must be set before any other TensorFlow call),
    then seeds, then the plan's precision policy (seeding clears the Keras session, which
    resets it)."""
    strategy = build_strategy(spec, cluster_resolver=cluster.build_resolver(cluster_spec))
    seed_everything(seed, deterministic=deterministic)
    set_precision(
        plan.precision,
        require_native=require_native,
        device_kinds=device_kinds(strategy),
        cpu_bfloat16_pays=plan.cpu_bfloat16_pays,
    )
    return strategy


def evaluate_checkpoints(run: schema.RunConfig, run_dir: Path) -> dict[str, Any]:
    """The sidecar evaluator: the run's model, compiled like training's, scores each checkpoint
    on the validation split (the test split when there is none), prepared like training's
    evaluation data, all on the default strategy (it joins no collective)."""
    started = time.perf_counter()
    splits = load_splits(
        run.dataset,
        allowed_targets=run.allowed_targets,
        stats_cache=StatsCache(run_dir, chief=False, wait_s=STATS_WAIT_S),  # the chief's
        task=run.task,
    )
    model = build_model(run.model, splits, task=run.task, allowed_targets=run.allowed_targets)
    compile_model(model, task=run.task, allowed_targets=run.allowed_targets)
    split = "validation" if splits.validation is not None else "test"
    data = evaluation_data(
        splits, split, run.pipeline, batch_size=run.batching.per_replica_batch_size, seed=run.seed
    )
    return evaluator.evaluate_checkpoints(model, data, run_dir=run_dir, started=started)
