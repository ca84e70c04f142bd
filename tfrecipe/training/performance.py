"""Where a run's time went, assembled at its end (summary.json's `perf`), and where it ran
(`provenance`, at its start). The measuring lives in tfrecipe.perf."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import files
from tfrecipe.distribute import cluster
from tfrecipe.distribute.strategy import device_kinds
from tfrecipe.perf import flops, peak, provenance, report
from tfrecipe.perf.clock import StepClock
from tfrecipe.perf.peak import Peak

log = logging.getLogger("tfrecipe")

_WORKER_ROLES = ("chief", "worker")


def run_provenance(task: cluster.Task, strategy: tf.distribute.Strategy) -> dict[str, Any]:
    """summary.json's `provenance` for this process's run."""
    return provenance.collect(
        num_replicas=strategy.num_replicas_in_sync,
        num_hosts=_hosts(task.cluster),
        cluster_shape={role: len(tasks) for role, tasks in task.cluster.items()} or None,
    )


def _hosts(shape: Mapping[str, list[str]]) -> int:
    """Machines training (chief and workers), by host name; addresses are not kept."""
    hosts = {
        address.rpartition(":")[0] for role in _WORKER_ROLES for address in shape.get(role, ())
    }
    return max(1, len(hosts))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measured:
    """What a run's `perf` block is measured against.

    Attributes:
      element_spec: the training data's (distributed) element spec: FLOPs are counted on it.
      hosts: machines training together (replicas on one CPU share its peak).
      asynchronous: parameter servers: the loop does not stamp its steps (no input wait).
      deterministic: op determinism is on: no clock op in the graph (no input wait).
      knobs: what the diagnosis may suggest (report.Knobs).
    """

    element_spec: Any
    per_replica_batch: int
    global_batch: int
    hosts: int
    asynchronous: bool
    deterministic: bool = False
    knobs: report.Knobs | None = None


def perf_fields(
    model: keras.Model,
    *,
    clock: StepClock,
    examples_per_sec: float | None,
    measured: Measured,
) -> dict[str, Any]:
    """The `perf` block (report.perf_block), with `overhead_s`: what measuring it cost here."""
    element_spec, per_replica_batch = measured.element_spec, measured.per_replica_batch
    global_batch, asynchronous = measured.global_batch, measured.asynchronous
    deterministic, knobs = measured.deterministic, measured.knobs
    hosts = measured.hosts
    started = time.perf_counter()
    strategy = model.distribute_strategy
    replicas = strategy.num_replicas_in_sync
    step_flops = _step_flops(model, element_spec, per_replica_batch, asynchronous=asynchronous)
    reached = examples_per_sec * step_flops / global_batch if examples_per_sec and step_flops else 0
    device_peak = _peak(strategy, hosts=hosts, reached=reached)
    wait = clock.input_wait_fractions()
    note = None
    if wait is None:
        note = "not measured: " + (
            "parameter servers train asynchronously"
            if asynchronous
            else "deterministic=true (TensorFlow refuses clock ops in a graph)"
            if deterministic
            else "the step runs on TPUs, which have no clock op"
            if "TPU" in device_kinds(strategy)
            else "XLA (jit_compile) compiles the strategy's whole step: no clock op"
            if model.jit_compile
            else "no steady-state steps"
        )
    timing = report.Timing(
        examples_per_sec=examples_per_sec,
        step_time_ms=clock.step_times_ms(),
        input_wait=wait,
        input_wait_note=note,
        wall_split=clock.wall_split(),
    )
    compute = report.Compute(
        flops_per_example=step_flops / global_batch if step_flops else None,
        peak_per_replica=device_peak.flops_per_sec,
        peak_source=device_peak.source,
        num_replicas=replicas,
    )
    block = report.perf_block(timing, compute, knobs)
    allreduce = _allreduce_ms(model)
    if allreduce is not None:  # an estimate from the link's bandwidth, named as one
        block["allreduce_ms_estimate"] = allreduce
    block["warm_up_s"] = clock.warm_up()  # the first epoch's extra, split; saving per epoch
    block["overhead_s"] = round(time.perf_counter() - started, 3)
    return block


def _allreduce_ms(model: keras.Model) -> float | None:
    """The estimated time of one step's gradient all-reduce across this machine's GPUs (the
    trainable weights, in their variables' dtype), from GPU_LINKS; None off multi-GPU runs."""
    strategy = model.distribute_strategy
    if "GPU" not in device_kinds(strategy) or strategy.num_replicas_in_sync < 2:
        return None
    gpus = tf.config.list_physical_devices("GPU")
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    num_bytes = sum(v.numpy().nbytes for v in model.trainable_variables)
    seconds = peak.allreduce_seconds(num_bytes, strategy.num_replicas_in_sync, name)
    return None if seconds is None else round(1000 * seconds, 4)


def _step_flops(
    model: keras.Model, element_spec: Any, per_replica_batch: int, *, asynchronous: bool
) -> int | None:
    if asynchronous:
        return None  # steps run as closures on the workers: no step graph here
    try:
        spec = flops.per_replica_spec(element_spec, per_replica_batch)
        return flops.cached_flops_per_step(model, spec)
    except Exception as error:  # a model the profiler cannot trace: said, not fatal
        log.warning("perf: FLOPs not counted (%s: %s)", type(error).__name__, error)
        return None


def _peak(strategy: tf.distribute.Strategy, *, hosts: int, reached: float) -> Peak:
    """One replica's peak FLOP/s in the compute dtype: the GPU/TPU table, else the CPU's
    calibration shared by the replicas on it (calibrated again when the run's total FLOP/s,
    `reached`, beat the cached one: that was measured on a busy machine)."""
    dtype = keras.mixed_precision.global_policy().compute_dtype
    kinds = device_kinds(strategy)
    if "GPU" in kinds:
        gpus = tf.config.list_physical_devices("GPU")
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
        tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
        return peak.gpu_peak(name, dtype, tf32=tf32)
    if "TPU" in kinds:
        # Cloud TPU VMs name their kind ("v4-8", "v5litepod-16"); TensorFlow does not.
        return peak.tpu_peak(os.environ.get("TPU_ACCELERATOR_TYPE", "TPU"), dtype)
    cpu = provenance.cpu()
    key = peak.machine_key(cpu, tf.__version__, threads=cpu["count"] or 1)
    measured = peak.cpu_peak(dtype, key=key, at_least=reached / hosts)
    if measured.flops_per_sec is None:
        return measured
    # The replicas on one machine (logical CPUs, local workers) share its CPU.
    local = max(1, strategy.num_replicas_in_sync // hosts)
    share = measured.flops_per_sec / local
    return Peak(share, measured.source + (f", shared by {local} replicas" if local > 1 else ""))


def log_to_tensorboard(log_dir: Path, perf: Mapping[str, Any], *, step: int) -> None:
    """The perf block's numbers as `perf/*` scalars beside the run's TensorBoard logs."""
    scalars = {
        "examples_per_sec": perf.get("examples_per_sec"),
        "step_time_ms_median": (perf.get("step_time_ms") or {}).get("median"),
        "step_time_ms_p90": (perf.get("step_time_ms") or {}).get("p90"),
        "input_wait_fraction": perf.get("input_wait_fraction"),
        "achieved_flops_per_sec": perf.get("achieved_flops_per_sec"),
        "mfu": perf.get("mfu"),
        **{f"wall_{part}": share for part, share in (perf.get("wall_split") or {}).items()},
    }
    writer = tf.summary.create_file_writer(str(files.library_dir(log_dir / "perf")))
    with writer.as_default():
        for name, value in scalars.items():
            if value is not None:
                tf.summary.scalar(f"perf/{name}", value, step=step)
    writer.close()
