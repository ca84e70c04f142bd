"""Where a run ran: package versions, the project's git commit, the CPU and its flags, GPUs,
hosts and replicas, the cluster's shape (no addresses). `compare` marks runs whose hardware or
versions differ (`differences`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGES = ("tfrecipe", "tensorflow", "keras", "hydra-core", "numpy", "pyarrow")
# The CPU flags that change how fast a run trains (bf16 paths, AMX tiles, wide vectors).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8", "fma")
# What makes two runs' speeds incomparable: `compare` names the first that differs.
HARDWARE_KEYS = (
    "cpu.model",
    "cpu.flags",
    "cpu.count",
    "cpu.intra_op_threads",
    "gpus",
    "hosts",
    "replicas",
)
VERSION_KEYS = tuple(f"versions.{name}" for name in PACKAGES)


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def cpu() -> dict[str, Any]:
    """The CPU's model name, the flags of CPU_FLAGS it has, and the cores this process may use."""
    model, flags = None, set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name" and model is None:
            model = value.strip()
        elif name.strip() == "flags" and not flags:
            flags = set(value.split())
    if model is None:
        import platform

        model = platform.processor() or platform.machine()
    return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags], "count": cores()}


def cores() -> int:
    """The cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def intra_op_threads() -> int:
    """The threads one op splits its work over in this process (`strategy.intra_op_threads`;
    TensorFlow's default: every core)."""
    import tensorflow as tf

    threads = tf.config.threading.get_intra_op_parallelism_threads()
    # TF_NUM_INTRAOP_THREADS is read by the runtime itself, not reflected in tf.config; a value
    # that is not a number is ignored there (TensorFlow's default), so here too
    from_env = os.environ.get("TF_NUM_INTRAOP_THREADS", "").strip()
    return threads or (int(from_env) if from_env.isdigit() else 0) or cores()


def graph_optimizer() -> bool:
    """Whether TensorFlow's graph optimizer (Grappler) rewrites this process's functions
    (`strategy.graph_optimizer`)."""
    import tensorflow as tf

    return not tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)


def gpus() -> list[dict[str, Any]]:
    """Each visible GPU's name and compute capability (TensorFlow's description), with the
    driver and the CUDA TensorFlow was built for."""
    import tensorflow as tf

    found = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        found.append(
            {
                "name": details.get("device_name", device.name),
                "compute_capability": ".".join(map(str, details.get("compute_capability", ()))),
            }
        )
    if found:
        build = tf.sysconfig.get_build_info()
        for gpu in found:
            gpu.update(driver=_nvidia_driver(), cuda=build.get("cuda_version"))
    return found


def _nvidia_driver() -> str | None:
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    words = first.split()
    return next((w for w in words if w[:1].isdigit() and "." in w), None)


def git(directory: Path) -> dict[str, Any] | None:
    """The commit of the checkout holding `directory` and whether it has uncommitted changes
    (None outside a checkout). Read from git's files (`checkout`): no `git` runs, so nothing a
    repository's configuration names (a clean filter, an fsmonitor hook) runs either."""
    from tfrecipe.perf import checkout

    found = checkout.find(Path(os.path.abspath(directory)))
    sha = checkout.commit(found[1]) if found is not None else None
    if sha is None:
        return None
    work_tree, git_dir = found
    return {"sha": sha, "dirty": checkout.dirty(git_dir, work_tree)}


def collect(
    *, num_replicas: int, num_hosts: int, cluster_shape: Mapping[str, int] | None
) -> dict[str, Any]:
    """summary.json's `provenance`: versions, the project's commit (the working directory's
    checkout), CPU, GPUs, hosts, replicas and the cluster's shape (task counts, no addresses)."""
    return {
        "versions": versions(),
        "git": git(Path.cwd()),
        "cpu": cpu() | {"intra_op_threads": intra_op_threads()},
        "graph_optimizer": graph_optimizer(),
        "gpus": gpus(),
        "hosts": num_hosts,
        "replicas": num_replicas,
        "cluster": dict(cluster_shape) if cluster_shape else None,
    }


def lookup(provenance: Mapping[str, Any], dotted: str) -> Any:
    value: Any = provenance
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def differences(provenance: Mapping[str, Any] | None, reference: Mapping[str, Any] | None) -> str:
    """How a run's provenance differs from the reference run's, in a few words ("" when it does
    not, "?" when either has none): `hw` and/or `versions`, naming the first key of each."""
    if not provenance or not reference:
        return "?" if provenance is not reference else ""
    marks = []
    for kind, keys in (("hw", HARDWARE_KEYS), ("versions", VERSION_KEYS)):
        changed = [k for k in keys if lookup(provenance, k) != lookup(reference, k)]
        if changed:
            marks.append(f"{kind}:{changed[0].removeprefix('versions.')}")
    return " ".join(marks)
