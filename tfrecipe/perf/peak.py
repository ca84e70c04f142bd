"""The peak FLOP/s a run's MFU divides by: a table for known GPUs and TPUs (dense tensor-core or
MXU figures from the vendors' data sheets), else a matmul calibration on this machine's CPU, per
dtype, measured once and cached per machine (tfrecipe.perf.cache).

The calibration times a 2048x2048 matmul (2·n³ FLOPs) in the graph: a warm-up, then the best of
a few repetitions. Cost: well under a second per dtype on a 2-core CPU, once per machine.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass

from tfrecipe.perf.cache import remembered

_N = 2048
_REPEATS = 3

# Dense peak FLOP/s per device by the compute dtype's family, from the vendors' data sheets, no
# sparsity: float32 = plain fp32; tensorfloat32 = float32 matmuls and convolutions on tensor cores
# (TensorFlow's default on Ampere and later: tf.config.experimental.
# enable_tensor_float_32_execution); bf16/fp16 = tensor cores / MXU. Keys are matched against the
# device's name. Measured on an H200 (TF 2.21, docs/benchmarks.md): an 8192² matmul ran at
# 398 TFLOP/s in float32 with TF32 on, 6x the plain-fp32 figure: without the TF32 column a float32
# run's MFU would be 7x too high.
GPU_PEAKS: dict[str, dict[str, float]] = {
    "H200": {"float32": 67e12, "tensorfloat32": 494.7e12, "bfloat16": 989e12, "float16": 989e12},
    "H100 PCIe": {"float32": 51e12, "tensorfloat32": 378e12, "bfloat16": 756e12, "float16": 756e12},
    "H100": {"float32": 67e12, "tensorfloat32": 494.7e12, "bfloat16": 989e12, "float16": 989e12},
    "A100": {"float32": 19.5e12, "tensorfloat32": 156e12, "bfloat16": 312e12, "float16": 312e12},
    "L40S": {"float32": 91.6e12, "tensorfloat32": 183e12, "bfloat16": 362e12, "float16": 362e12},
    "L4": {"float32": 30.3e12, "tensorfloat32": 60e12, "bfloat16": 121e12, "float16": 121e12},
    "A10G": {"float32": 31.2e12, "tensorfloat32": 35e12, "bfloat16": 70e12, "float16": 70e12},
    "A10": {"float32": 31.2e12, "tensorfloat32": 62.5e12, "bfloat16": 125e12, "float16": 125e12},
    "V100": {"float32": 15.7e12, "float16": 125e12},  # Volta, Turing: no TF32
    "T4": {"float32": 8.1e12, "float16": 65e12},
}
TPU_PEAKS: dict[str, dict[str, float]] = {  # per chip
    "v2": {"bfloat16": 45e12},
    "v3": {"bfloat16": 123e12},
    "v4": {"bfloat16": 275e12},
    "v5e": {"bfloat16": 197e12},
    "v5lite": {"bfloat16": 197e12},
    "v5 lite": {"bfloat16": 197e12},
    "v5p": {"bfloat16": 459e12},
    "v6e": {"bfloat16": 918e12},
}


# Per-GPU all-reduce bandwidth in bytes/s, one direction (NVLink where the part has it, else
# PCIe x16): what a ring all-reduce across GPUs of one machine can move per GPU.
GPU_LINKS: dict[str, float] = {
    "H200": 450e9,  # NVLink 4: 900 GB/s both directions
    "H100 PCIe": 64e9,  # PCIe 5
    "H100": 450e9,
    "A100": 300e9,  # NVLink 3 (SXM)
    "V100": 150e9,  # NVLink 2
    "L40S": 32e9,  # PCIe 4
    "L4": 32e9,
    "A10G": 32e9,
    "A10": 32e9,
    "T4": 16e9,  # PCIe 3
}


def allreduce_seconds(num_bytes: float, num_gpus: int, device_name: str) -> float | None:
    """A ring all-reduce's time (NCCL's algorithm within a machine) for `num_bytes` of gradients
    over `num_gpus` GPUs named like `device_name`: each GPU sends and receives
    2·(n-1)/n of the bytes over its link (latency not counted). None: one GPU, or a GPU not in
    GPU_LINKS."""
    if num_gpus < 2:
        return None
    for key in sorted(GPU_LINKS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return 2 * (num_gpus - 1) / num_gpus * num_bytes / GPU_LINKS[key]
    return None


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of one replica's device for a dtype, and where the figure comes from."""

    flops_per_sec: float | None
    source: str  # "table:<device>", "calibration:<dtype> matmul (cached)", "none: <why>"


def gpu_peak(device_name: str, dtype: str, *, tf32: bool = False) -> Peak:
    """The table's peak for a GPU named like `device_name` (TensorFlow's device description:
    "NVIDIA H100 80GB HBM3"), the longest matching key first (H100 PCIe before H100). `tf32`:
    TensorFloat-32 execution is on, so float32 is held to the TF32 peak where the GPU has one."""
    for key in sorted(GPU_PEAKS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            if dtype == "float32" and tf32 and "tensorfloat32" in GPU_PEAKS[key]:
                dtype = "tensorfloat32"
            figure = GPU_PEAKS[key].get(dtype)
            if figure is None:
                return Peak(None, f"none: no {dtype} peak for {key} in the table")
            return Peak(figure, f"table:{key} {dtype}")
    return Peak(None, f"none: {device_name!r} is not in tfrecipe.perf.peak.GPU_PEAKS")


def tpu_peak(device_kind: str, dtype: str) -> Peak:
    """The table's per-chip peak for a TPU kind ("TPU v4", "TPU v5 lite"); float32 matmuls run
    on the MXU in bfloat16 passes, so they are held to the bfloat16 peak."""
    for key in sorted(TPU_PEAKS, key=len, reverse=True):
        if key.lower() in device_kind.lower():
            return Peak(TPU_PEAKS[key]["bfloat16"], f"table:TPU {key} bfloat16")
    return Peak(None, f"none: {device_kind!r} is not in tfrecipe.perf.peak.TPU_PEAKS")


def machine_key(cpu: Mapping[str, object], tf_version: str, threads: int) -> str:
    """What a calibration holds for: the CPU (model, flags), the cores it may use, TensorFlow."""
    text = json.dumps([cpu.get("model"), sorted(cpu.get("flags") or []), threads, tf_version])
    return hashlib.sha256(f"{platform.node()}|{text}".encode()).hexdigest()[:16]


def cpu_peak(dtype: str, *, key: str, at_least: float = 0.0) -> Peak:
    """The CPU's measured matmul FLOP/s in `dtype` (float32, bfloat16, float16), from the
    per-machine cache when it has this machine's, else measured now and cached. `at_least`: a
    rate the run reached; a cached peak below it was measured on a busy machine: again."""
    figure, cached = remembered(
        "peak", f"{key}:{dtype}", lambda: calibrate(dtype), at_least=at_least
    )
    return Peak(figure, f"calibration:{dtype} matmul" + (" (cached)" if cached else ""))


def calibrate(dtype: str) -> float:
    """Best-of-N FLOP/s of 2048² matmuls in `dtype` on the CPU, in the graph: one, or where one
    op runs on fewer threads than the machine has cores (`strategy.intra_op_threads`), as many
    side by side as fill them (TensorFlow's inter-op pool runs independent ops at once), so the
    peak is the machine's either way."""
    import tensorflow as tf

    from tfrecipe import graph
    from tfrecipe.perf.provenance import cores, intra_op_threads

    side_by_side = max(1, cores() // intra_op_threads())
    with tf.device("/CPU:0"):
        a = tf.cast(tf.random.stateless_uniform((_N, _N), seed=(1, 2)), dtype)
        bs = [
            tf.cast(tf.random.stateless_uniform((_N, _N), seed=(3, i)), dtype)
            for i in range(side_by_side)
        ]

    @graph.function
    def matmuls(a, bs):
        return tf.add_n([tf.reduce_sum(tf.cast(tf.matmul(a, b)[:1, :1], tf.float32)) for b in bs])

    matmuls(a, bs).numpy()  # traced, warmed up
    best = float("inf")
    for _ in range(_REPEATS):
        start = time.perf_counter()
        matmuls(a, bs).numpy()
        best = min(best, time.perf_counter() - start)
    return side_by_side * 2 * _N**3 / best
