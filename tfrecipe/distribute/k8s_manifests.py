"""The Kubernetes objects a `cluster=k8s` run needs, for the user's config and cluster shape
(`tfrecipe k8s`): the ReadWriteMany volume every pod writes the run dir to, the headless Service
that names the pods, and the indexed Job (docs/strategies.md, "cluster=k8s"). Plain data, no
TensorFlow; scripts/k8s_*.yaml are two of its outputs, annotated.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from tfrecipe.errors import ConfigError

# What a pod's exit code means to the Job (tfrecipe.outcome): 75 saved a backup on SIGTERM, 2 is
# a configuration error, the same on every start.
EXIT_PREEMPTED, EXIT_CONFIG = 75, 2
VOLUME = "tfrecipe-runs"
RUNS = "/runs"
# A DNS-1035 label short enough for the pods' names (NAME-INDEX-SUFFIX).
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,40}[a-z0-9])?")
_STRATEGIES = ("multi_worker_mirrored", "parameter_server")


@dataclasses.dataclass(frozen=True)
class Shape:
    """The cluster a Job runs: its name (the Job's, the Service's, the run dir's), the image,
    the pods per role and what each pod gets."""

    name: str = "tfrecipe"
    image: str = "tfrecipe:latest"
    workers: int = 2
    ps: int = 1  # parameter servers, under strategy=parameter_server (plus one coordinator)
    port: int = 2222
    cpu: str = "4"
    memory: str = "8Gi"
    volume_size: str = "10Gi"
    storage_class: str | None = None  # None: the cluster's default class

    def problems(self) -> list[str]:
        problems = []
        if not _NAME.fullmatch(self.name):
            problems.append(
                f"k8s: --name={self.name}: expected a DNS label (lowercase letters, digits, '-', "
                "starting with a letter, at most 42 characters)"
            )
        if self.workers < 1:
            problems.append(f"k8s: --workers={self.workers}: expected at least 1")
        return problems


def manifests(shape: Shape, *, strategy: str, overrides: list[str]) -> list[dict[str, Any]]:
    """The volume claim, the Service and the Job that run `python -m tfrecipe OVERRIDES
    cluster=k8s hydra.run.dir=/runs/NAME` on `shape`'s pods.

    Raises:
      ConfigError: a strategy without a cluster, or a shape Kubernetes would refuse.
    """
    if strategy not in _STRATEGIES:
        raise ConfigError(
            f"k8s: strategy={strategy}: a Job of several pods trains under "
            "strategy=multi_worker_mirrored or strategy=parameter_server"
        )
    problems = shape.problems()
    if strategy == "parameter_server" and shape.ps < 1:
        problems.append(f"k8s: --ps={shape.ps}: strategy=parameter_server needs at least 1")
    if problems:
        raise ConfigError(problems)
    return [volume_claim(shape), service(shape), job(shape, strategy=strategy, overrides=overrides)]


def replicas(shape: Shape, strategy: str) -> str:
    """TFRECIPE_K8S_REPLICAS: the pods per role, in completion-index order."""
    if strategy == "parameter_server":
        return f"chief=1,worker={shape.workers},ps={shape.ps}"
    return f"worker={shape.workers}"


def volume_claim(shape: Shape) -> dict[str, Any]:
    """The ReadWriteMany volume every pod mounts at /runs (the chief writes the run dir there,
    the others read its backups on a restart)."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": shape.volume_size}},
    }
    if shape.storage_class is not None:
        spec["storageClassName"] = shape.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": VOLUME},
        "spec": spec,
    }


def service(shape: Shape) -> dict[str, Any]:
    """The headless Service: pod i is NAME-i.NAME, before any pod is ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": shape.name},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": shape.name},
            "ports": [{"name": "grpc", "port": shape.port}],
        },
    }


def job(shape: Shape, *, strategy: str, overrides: list[str]) -> dict[str, Any]:
    """The indexed Job: one pod per task, restarted by its failure policy (docs/strategies.md)."""
    pods = shape.workers + (1 + shape.ps if strategy == "parameter_server" else 0)
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": pods,
        "parallelism": pods,
    }
    if strategy == "parameter_server":  # done when the coordinator is; the servers are stopped
        spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
    spec |= {
        "backoffLimitPerIndex": 3,
        "maxFailedIndexes": 0,
        "podFailurePolicy": {"rules": _failure_rules()},
        "template": {"spec": _pod(shape, strategy, overrides)},
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": shape.name}, "spec": spec}


def _failure_rules() -> list[dict[str, Any]]:
    def exits(action: str, code: int) -> dict[str, Any]:
        return {
            "action": action,
            "onExitCodes": {"containerName": "tfrecipe", "operator": "In", "values": [code]},
        }

    return [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        exits("Ignore", EXIT_PREEMPTED),
        exits("FailJob", EXIT_CONFIG),
    ]


def _pod(shape: Shape, strategy: str, overrides: list[str]) -> dict[str, Any]:
    own = [
        o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("cluster", "hydra.run.dir")
    ]
    env = [
        {
            "name": "TFRECIPE_K8S_JOB",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}
            },
        },
        {"name": "TFRECIPE_K8S_SERVICE", "value": shape.name},
        {"name": "TFRECIPE_K8S_REPLICAS", "value": replicas(shape, strategy)},
        {"name": "TFRECIPE_K8S_PORT", "value": str(shape.port)},
    ]
    if strategy == "parameter_server":  # fail calls to a dead task at once, so steps move on
        env.append({"name": "GRPC_FAIL_FAST", "value": "use_caller"})
    container = {
        "name": "tfrecipe",
        "image": shape.image,
        "command": ["python", "-m", "tfrecipe"],
        "args": [*own, "cluster=k8s", f"hydra.run.dir={RUNS}/{shape.name}"],
        "env": env,
        "ports": [{"containerPort": shape.port, "name": "grpc"}],
        "resources": {"limits": {"cpu": shape.cpu, "memory": shape.memory}},
        "volumeMounts": [{"name": "runs", "mountPath": RUNS}],
    }
    return {
        "subdomain": shape.name,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 120,
        "containers": [container],
        "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": VOLUME}}],
    }
