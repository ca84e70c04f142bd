"""The Keras mixed-precision policy, and whether the hardware runs it natively."""

from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

from tfrecipe.errors import ConfigError

# GPU compute capability below which the policy runs without its hardware speed-up.
_MIN_GPU_CAPABILITY = {"mixed_float16": (7, 0), "mixed_bfloat16": (8, 0)}
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpu_has_bf16() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text().split() if cpuinfo.exists() else []
    return any(flag in flags for flag in _CPU_BF16_FLAGS)


def native_support_problem(policy: str, device_kinds: set[str]) -> str | None:
    """Why `policy` would run emulated on these devices, or None when it runs natively."""
    if policy == "float32" or ("TPU" in device_kinds and policy == "mixed_bfloat16"):
        return None
    if "TPU" in device_kinds:
        return "TPUs have no float16; use precision=mixed_bfloat16"
    if "GPU" in device_kinds:
        needed = _MIN_GPU_CAPABILITY[policy]
        for gpu in tf.config.list_physical_devices("GPU"):
            capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
            if capability and tuple(capability) < needed:
                return f"{gpu.name} has compute capability {capability}, {policy} needs {needed}"
        return None
    if policy == "mixed_bfloat16":
        return None if _cpu_has_bf16() else "this CPU has no native bfloat16 (AVX512_BF16/AMX)"
    return "a CPU has no native float16 (use precision=mixed_bfloat16, or a GPU)"


def resolve_policy(policy: str, device_kinds: set[str], *, cpu_bfloat16_pays: bool = True) -> str:
    """`precision=auto`: mixed_bfloat16 where these devices run it natively, else float32; on a
    CPU only where it pays for the model (`cpu_bfloat16_pays`, the run plan's). A cluster's
    plan never says auto (its workers could pick differently)."""
    if policy != "auto":
        return policy
    if not device_kinds & {"GPU", "TPU"} and not cpu_bfloat16_pays:
        return "float32"
    native = native_support_problem("mixed_bfloat16", device_kinds) is None
    return "mixed_bfloat16" if native else "float32"


def set_precision(
    policy: str, *, require_native: bool, device_kinds: set[str], cpu_bfloat16_pays: bool = True
) -> None:
    """Sets the global Keras dtype policy (before any layer is built); `auto` as
    `resolve_policy` picks.

    Raises:
      ConfigError: `require_native` and the hardware would only emulate `policy`.
    """
    policy = resolve_policy(policy, device_kinds, cpu_bfloat16_pays=cpu_bfloat16_pays)
    problem = native_support_problem(policy, device_kinds)
    if problem and require_native:
        raise ConfigError(
            f"precision={policy}: the hardware cannot run it natively ({problem}); "
            "set precision.require_native=false to run it emulated (slow, for functional tests)"
        )
    keras.mixed_precision.set_global_policy(policy)
