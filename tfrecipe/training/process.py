"""This process in a run: who it is in the cluster (a parameter server or worker serves, a
sidecar evaluates), where it writes, and its TensorFlow state (strategy, seeds, precision)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import compat, rundir, signature
from tfrecipe.config import schema
from tfrecipe.config.changes import check_resume_unchanged
from tfrecipe.data import fingerprint
from tfrecipe.data.tabular import STATS_WAIT_S, StatsCache
from tfrecipe.distribute import cluster, evaluator
from tfrecipe.distribute.strategy import build_strategy, device_kinds
from tfrecipe.errors import ConfigError
from tfrecipe.fault import watchdog
from tfrecipe.models.build import build_model, compile_model
from tfrecipe.outcome import BACKUP_DIR, check_resume_batch, ensure_fresh_run_dir
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


@dataclasses.dataclass(frozen=True)
class Dirs:
    """Where this process writes: the run dir on the chief, a scratch dir on another worker,
    which restores from the chief's backups in the shared run dir."""

    run_dir: Path
    shared_run_dir: Path  # the chief's run dir

    @property
    def chief(self) -> bool:
        return self.run_dir == self.shared_run_dir

    @property
    def backup_dir(self) -> Path:
        return self.shared_run_dir / BACKUP_DIR  # every worker reads the chief's

    def stats_cache(self) -> StatsCache:
        """The table statistics: the chief computes them, the others wait for its."""
        return StatsCache(
            self.shared_run_dir, chief=self.chief, wait_s=0 if self.chief else STATS_WAIT_S
        )

    def claim(self, config: Mapping[str, Any], *, resume: str, allowed: list[str]) -> None:
        """Locks the chief's run dir when it exists (another run may train there), then checks
        it holds no run this one must not continue, nor one it would continue differently."""
        if self.chief and self.run_dir.exists():
            rundir.lock_run_dir(self.run_dir)
        ensure_fresh_run_dir(self.run_dir, resume=resume)
        check_resume_unchanged(self.run_dir, config, resume=resume, allowed=allowed)

    def check_batch(self, *, global_batch: int, num_replicas: int) -> None:
        """A resumed run continues at the global batch it trained at (`check_resume_batch`)."""
        check_resume_batch(
            self.shared_run_dir, global_batch=global_batch, num_replicas=num_replicas
        )

    def check_data(self, dataset: schema.Target, *, resume: str, allowed: list[str]):
        """What the run trains on (the chief's record), taken first: a resume on other data
        is refused."""
        if not self.chief:
            return None
        node = dataset.model_dump(by_alias=True)
        return fingerprint.check_resumed(self.run_dir, node, allowed=allowed, resume=resume)

    def record_inputs(self, signature_fields: Mapping[str, Any], data_files) -> None:
        """What predictions need (signature.json) and what the run trained on (the chief)."""
        if self.chief:
            signature.write(self.run_dir, signature_fields)
            fingerprint.record(self.run_dir, data_files)

    def earlier_stalls(self) -> list[dict[str, Any]]:
        """The stalls of earlier starts of this run (their stack files, summary.json)."""
        if not self.chief:
            return []
        earlier = (rundir.read_summary(self.run_dir) or {}).get("stalls")
        return watchdog.recorded_stalls(self.run_dir, earlier)

    def stall_watchdog(
        self, stall_timeout: float | None, task: cluster.Task
    ) -> watchdog.StallWatchdog | None:
        """The progress watchdog (`cluster.stall_timeout`), when it is on: stack files go to the
        chief's run dir."""
        return watchdog.build_watchdog(
            stall_timeout,
            task=f"{task.type}-{task.index}" if task.type is not None else None,
            run_dir=self.shared_run_dir,
            chief=self.chief,
        )


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
