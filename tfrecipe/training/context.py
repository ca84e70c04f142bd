"""What one run's stages share: `RunContext`, made once in train(), and `Built`, what the stages
before training built. A stage takes its own config sections, the context and what was built
before it (torchtune's recipes read what they built from the recipe; a frozen record gives the
same narrow signatures without a mutable object)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfrecipe.config import schema
from tfrecipe.config.grants import Grants
from tfrecipe.config.plan import RunPlan
from tfrecipe.config.trust import Trust
from tfrecipe.data.pipeline import PipelineOptions
from tfrecipe.distribute import cluster
from tfrecipe.runs import RunDir
from tfrecipe.training import summary as summaries


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunContext:
    """One run's shared context.

    Attributes:
      plan: what the run decided once (the loop, backups, steps per call, precision).
      home: the run dir (a worker's scratch dir beside the chief's).
      grants: what this invocation's command line granted (`Trust`) and the import prefixes
        the validated config's `allowed_targets` may instantiate under it.
      task: the task spec (`task` section): loss, metrics, head, main metric.
      pipeline: the input pipeline's options; `seed`, `deterministic`: the run's seeding.
      cluster_task: who this process is in the cluster.
      config: the run's public config (secrets redacted): config.yaml, the trackers.
      recorded: what summary.json records of the config (`summary.config_fields`).
    """

    plan: RunPlan
    home: RunDir
    grants: Grants
    task: schema.Task
    pipeline: PipelineOptions
    seed: int
    deterministic: bool
    cluster_task: cluster.Task
    config: Mapping[str, Any]
    recorded: Mapping[str, Any]

    @classmethod
    def of(
        cls,
        run: schema.RunConfig,
        *,
        plan: RunPlan,
        config: Mapping[str, Any],
        home: RunDir,
        cluster_task: cluster.Task,
        trust: Trust,
    ) -> RunContext:
        """The context of the validated `run` and its `plan`, for this process."""
        recorded = summaries.config_fields(
            strategy=run.strategy,
            loop=run.loop,
            model=run.model,
            dataset=run.dataset,
            precision=run.precision,
            seed=run.seed,
        )
        return cls(
            plan=plan,
            home=home,
            grants=Grants.of(run.allowed_targets, trust=trust),
            task=run.task,
            pipeline=run.pipeline,
            seed=run.seed,
            deterministic=run.deterministic,
            cluster_task=cluster_task,
            config=config,
            recorded=recorded,
        )

    @property
    def chief(self) -> bool:
        """This process writes the run dir (the others write a scratch dir they delete)."""
        return self.home.chief


@dataclasses.dataclass(frozen=True)
class Batches:
    """The data as loaded (not yet distributed), with the batch sizes it is read at."""

    strategy: Any  # tf.distribute.Strategy
    splits: Any  # data.Splits
    steps_per_epoch: int
    per_replica_batch: int
    global_batch: int
    batching: schema.Batching  # drop_remainder, jit_compile, the learning rate's scaling


@dataclasses.dataclass(frozen=True)
class Built:
    """What a run builds before it trains: under its strategy, its data and model, restored."""

    batches: Batches
    data: Any  # training.inputs.Inputs, distributed
    model: Any  # keras.Model, compiled
    learning_rate: float
    phases: Any  # loops.finetune.TwoPhases | None
    policy: Any  # fault.recovery.Recovery
    resumed: Any  # the restored backup, or None
    warm: Any  # the warm start (model.init_from), or None
    steps_per_call: int

    @property
    def strategy(self):
        return self.batches.strategy

    @property
    def splits(self):
        return self.batches.splits

    @property
    def per_replica_batch(self) -> int:
        return self.batches.per_replica_batch

    @property
    def global_batch(self) -> int:
        return self.batches.global_batch

    @property
    def start_step(self) -> int:
        """The restored backup's step, or 0."""
        return self.resumed.step if self.resumed else 0
