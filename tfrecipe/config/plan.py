"""`RunPlan`: what a run decides from its config (the same in each task of its cluster), once,
before TensorFlow is imported (`tfrecipe validate` prints it): the loop, backups and rollbacks, the
step intervals of per-step hooks, the steps per `tf.function` call, the precision policy.

Nothing else decides these: the stages read them from the plan. What needs the built model
(its parameter count, the replicas, the steps per epoch, the restored step) comes to
`RunPlan.steps_per_call` as plain numbers.
"""

from __future__ import annotations

import dataclasses
import math

from tfrecipe.config import compile_cache
from tfrecipe.config.run_sections import Logger, RunConfig
from tfrecipe.data import residency

# A model below this many parameters takes a small fraction of a millisecond per example, so a
# training step costs about as much as the Python (callbacks, dispatch) around it: several steps
# per call pay that once. Above it one step per call loses nothing and keeps hooks per step.
SMALL_MODEL_PARAMS = 1_000_000
MAX_STEPS_PER_CALL = 32
# The strategies that train on several workers of a cluster.
MULTI_WORKER_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
# `precision=auto` on a CPU: bfloat16 pays for these builders' convolutions (measured on an
# AVX512_BF16 EPYC: cnn 1.03-1.12x, resnet 1.03-1.41x; resnet 1.63x on an AMX Xeon), not for
# the small matmuls of an MLP, whose casts cost more (0.76-0.94x): docs/benchmarks.md.
CPU_BFLOAT16_PAYS = frozenset(
    {"tfrecipe.models.cnn", "tfrecipe.models.resnet", "tfrecipe.models.keras_app"}
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunPlan:
    """What the run decided, each in one place.

    Attributes:
      loop: "fit", "custom", or "parameter_server" (a ClusterCoordinator's custom loop).
      requested_loop: the loop the config names (`loop`: "fit" or "custom"); under parameter
        servers `loop` is theirs whatever it names.
      strategy: the distribution strategy the config names (`strategy`).
      in_cluster: this process is a cluster task (multi-worker, parameter servers).
      precision: the dtype policy set before any layer is built ("auto": resolved on the
        devices, `tfrecipe.precision.resolve_policy`).
      cpu_bfloat16_pays: with precision=auto, a CPU with native bfloat16 trains this model
        faster in mixed_bfloat16 (CPU_BFLOAT16_PAYS); a GPU or TPU decides by itself.
      cpu_resident_pays: with pipeline.resident=auto, a CPU holds this model's training split
        (tfrecipe.data.residency.CPU_HOLDS); an accelerator holds what fits.
      periodic_backups: back up every `backup_every_n_steps` optimizer steps.
      max_rollbacks: NaN/Inf rollbacks allowed (0: none; they need backups).
      hook_intervals: the step intervals per-step hooks were asked for (backups, step logs):
        an auto call is no longer than the shortest, so each interval has a call end (where a
        hook acts: at the first call end at or after each multiple of its interval).
      requested_steps_per_call: `batching.steps_per_execution` (fit) or `loop.steps_per_loop`.
      one_step_per_call: why every call takes one step whatever was requested, or None.
      gradient_accumulation_steps: micro-batches per optimizer step.
    """

    loop: str
    in_cluster: bool
    precision: str
    cpu_bfloat16_pays: bool = False
    cpu_resident_pays: bool = False
    periodic_backups: bool
    backup_every_n_steps: int
    max_rollbacks: int
    hook_intervals: tuple[int, ...]
    requested_steps_per_call: int | str
    one_step_per_call: str | None
    gradient_accumulation_steps: int
    hook_keys: tuple[str, ...] = ()  # the key that set each of `hook_intervals`
    # where the training data live, as far as the config decides (tfrecipe.data.residency)
    training_data: str = ""
    requested_loop: str = "fit"
    strategy: str = "auto"
    # whether XLA's persistent cache is used, as far as the config decides (config.compile_cache)
    compile_cache: str = ""
    xla: str = ""  # what XLA compiles, as far as the config decides (compile_cache.xla_plan_line)

    @classmethod
    def from_config(cls, run: RunConfig) -> RunPlan:
        """The plan of `run`, the same in every process of its cluster. Each process of a
        cluster (`cluster` other than none) is one of its tasks: a TF_CONFIG without a task
        type is refused (`cluster.parse_tf_config`), so the config says it before joining."""
        in_cluster = run.cluster.name != "none"
        backup, rollbacks = run.callbacks.backup, run.callbacks.terminate_on_nan.max_rollbacks
        # Periodic backups by default where a process may be lost (a cluster) or training rolls
        # back to the last backup.
        periodic = backup.enabled if backup.enabled is not None else in_cluster or rollbacks > 0
        backed_up = periodic or rollbacks > 0
        hooks = _hooks(run.logger, backup.every_n_steps if backed_up else None)
        loop = "parameter_server" if run.strategy.name == "parameter_server" else run.loop.name
        # auto on a cluster: float32, since workers on different machines could pick differently
        precision = run.precision.policy
        return cls(
            loop=loop,
            in_cluster=in_cluster,
            precision="float32" if precision == "auto" and in_cluster else precision,
            cpu_bfloat16_pays=run.model.target in CPU_BFLOAT16_PAYS,
            cpu_resident_pays=run.model.target in residency.CPU_HOLDS,
            periodic_backups=periodic,
            backup_every_n_steps=backup.every_n_steps,
            max_rollbacks=rollbacks,
            hook_intervals=tuple(hooks.values()),
            hook_keys=tuple(hooks),
            requested_steps_per_call=run.batching.steps_per_execution
            if loop == "fit"
            else run.loop.steps_per_loop,
            one_step_per_call=_one_step_per_call(loop, run.logger),
            gradient_accumulation_steps=run.loop.gradient_accumulation_steps,
            requested_loop=run.loop.name,
            strategy=run.strategy.name,
            **_device_lines(run),
        )

    @property
    def parameter_servers(self) -> bool:
        return self.loop == "parameter_server"

    @property
    def multi_worker(self) -> bool:
        """The strategy trains on several workers (a local cluster starts them)."""
        return self.strategy in MULTI_WORKER_STRATEGIES

    def save_at_start(self, *, resumed: bool) -> bool:
        """A fresh run that rolls back keeps its first step's state: a rollback before the first
        periodic backup."""
        return self.max_rollbacks > 0 and not resumed

    def optimizer_accumulation_steps(self) -> int:
        """The micro-batches Keras' optimizer accumulates: fit's; the custom loop accumulates in
        its own step function."""
        return self.gradient_accumulation_steps if self.loop == "fit" else 1

    def steps_per_call(
        self, *, num_params: int, replicas: int, steps_per_epoch: int, start_step: int = 0
    ) -> int:
        """The loop's steps per `tf.function` call (fit: steps_per_execution, custom:
        steps_per_loop), with "auto" resolved: for a small model the largest number up to
        MAX_STEPS_PER_CALL and up to the shortest hook interval (each interval gets a call end
        of its own: hooks act at the first call end at or after each multiple of their
        interval) that, unless the loop ends an epoch with a shorter call (the custom loop),
        divides `steps_per_epoch` and the steps left in the epoch a restored run starts in
        (fit's last call of an epoch would otherwise run past the epoch on endless data); else
        1. It depends on the config, the model and the restored step only, so every replica and
        worker picks the same."""
        requested = self.requested_steps_per_call
        if self.one_step_per_call is not None:
            return 1
        if requested == "auto" and self.loop == "fit" and replicas > 1:
            # Keras 3.15's multi-step fit fails across replicas (TF 2.21, MirroredStrategy: "You
            # must feed a value for placeholder tensor 'while/cond/Placeholder'").
            return 1
        if requested != "auto":
            return int(requested)
        if num_params >= SMALL_MODEL_PARAMS:
            return 1
        return self._auto_steps(
            min(self.hook_intervals, default=MAX_STEPS_PER_CALL), steps_per_epoch, start_step
        )

    def _auto_steps(self, most: int, steps_per_epoch: int, start_step: int) -> int:
        """The largest call up to `most` and MAX_STEPS_PER_CALL that fit's calls can take (one
        that divides the epoch and the rest of a restored one; the custom loop ends an epoch
        with a shorter call)."""
        most = min(most, MAX_STEPS_PER_CALL)
        if self.loop == "custom":  # no call runs past its epoch
            return min(most, steps_per_epoch) if steps_per_epoch else most
        period = math.gcd(steps_per_epoch, start_step % steps_per_epoch)
        return max(d for d in range(1, min(most, period) + 1) if period % d == 0)

    def call_bounds(self, steps_per_epoch: int) -> tuple[str, ...]:
        """The hooks (`key=interval`) that keep an auto call shorter than it would be without
        them."""
        if self.requested_steps_per_call != "auto" or self.one_step_per_call is not None:
            return ()
        unbounded = self._auto_steps(MAX_STEPS_PER_CALL, steps_per_epoch, 0)
        return tuple(
            f"{key}={interval}"
            for key, interval in zip(self.hook_keys, self.hook_intervals, strict=True)
            if self._auto_steps(interval, steps_per_epoch, 0) < unbounded
        )

    def steps_key(self, replicas: int) -> str | None:
        """What sets more steps per call for this run: fit's `batching.steps_per_execution`,
        except across replicas, where fit runs 1 (validate refuses more under mirrored
        strategies) and the custom loop runs several; None where nothing does (parameter
        servers: one step per closure)."""
        if self.parameter_servers or self.one_step_per_call is not None:
            return None
        if self.loop == "fit" and replicas > 1:
            return "loop=custom loop.steps_per_loop"
        return "batching.steps_per_execution" if self.loop == "fit" else "loop.steps_per_loop"

    def steps_per_execution(self, steps_per_call: int) -> int | None:
        """fit's `Model.steps_per_execution` for `steps_per_call` optimizer steps (it counts
        micro-batches: each call ends on an update); None for the other loops."""
        return steps_per_call * self.gradient_accumulation_steps if self.loop == "fit" else None

    def lines(self) -> list[str]:
        """The plan in a few readable lines (`tfrecipe validate`)."""
        backups = (
            f"every {self.backup_every_n_steps} steps" if self.periodic_backups else "on preemption"
        )
        rollbacks = f"up to {self.max_rollbacks}" if self.max_rollbacks else "none"
        steps = (
            f"1 ({self.one_step_per_call})"
            if self.one_step_per_call
            else str(self.requested_steps_per_call)
        )
        hooks = ", ".join(map(str, self.hook_intervals)) or "none"
        return [
            f"loop: {self.loop}" + (" (cluster task)" if self.in_cluster else " (one process)"),
            f"precision: {self.precision}"
            + (_AUTO[self.cpu_bfloat16_pays] if self.precision == "auto" else ""),
            f"backups: {backups}; rollbacks on NaN/Inf: {rollbacks}",
            f"steps per call: {steps}; hook intervals (steps): {hooks}",
            *([self.training_data] if self.training_data else []),
            *([self.compile_cache] if self.compile_cache else []),
            *([self.xla] if self.xla else []),
        ]


_AUTO = {
    True: " (mixed_bfloat16 where the device runs it natively, a CPU with AVX512_BF16 or AMX "
    "included; else float32)",
    False: " (mixed_bfloat16 on a GPU or TPU that runs it natively; float32 for this model on a "
    "CPU, where bfloat16 pays for convolutional models only)",
}


def _device_lines(run: RunConfig) -> dict[str, str]:
    """The plan's lines on what the devices decide within the config's bounds: where the
    training data live, what XLA compiles and whether it caches its compiled programs."""
    return {
        "training_data": residency.plan_line(
            run.pipeline.resident,
            strategy=run.strategy.name,
            cache=run.pipeline.cache,
            cpu_holds=run.model.target in residency.CPU_HOLDS,
        ),
        "compile_cache": compile_cache.plan_line(
            run.batching.compile_cache,
            jit_compile=run.batching.jit_compile,
            strategy=run.strategy.name,
        ),
        "xla": compile_cache.xla_plan_line(run.batching.jit_compile, strategy=run.strategy.name),
    }


def _hooks(logger: Logger, backup_every: int | None) -> dict[str, int]:
    """The step intervals per-batch hooks were configured at (a call boundary is a step's), by
    the key that sets each."""
    hooks = {} if backup_every is None else {"callbacks.backup.every_n_steps": backup_every}
    if logger.csv is not None:
        hooks["logger.csv.every_n_steps"] = logger.csv.every_n_steps
    if logger.wandb is not None and logger.wandb.log_every_n_steps:
        hooks["logger.wandb.log_every_n_steps"] = logger.wandb.log_every_n_steps
    if logger.tensorboard is not None and logger.tensorboard.update_freq != "epoch":
        update = logger.tensorboard.update_freq
        hooks["logger.tensorboard.update_freq"] = 1 if update == "batch" else update
    return hooks


def _one_step_per_call(loop: str, logger: Logger) -> str | None:
    if loop == "parameter_server":
        return "ClusterCoordinator schedules one step per closure"
    if loop == "fit" and logger.tensorboard is not None and logger.tensorboard.profile_batch:
        # xprof finds no step in a call that loops over several (measured: "steps": 0 at 2 per
        # call, in both loops), and fit's steps per call are fixed for the run: a profiled fit
        # run takes one step per call. The custom loop shortens only the window's calls.
        return "profiled: xprof finds no step in a call of several"
    return None
