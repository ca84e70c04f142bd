"""Who this process is in a training cluster: TF_CONFIG validation, cluster resolvers, the chief.

Reading and checking TF_CONFIG needs no TensorFlow (the local launcher and the command line's
pre-check use it before anything is imported); only `build_resolver` imports TensorFlow.

Roles follow TensorFlow's TF_CONFIG: `chief`, `worker`, `ps` and `evaluator`. Without a `chief`
entry, worker 0 is the chief (MultiWorkerMirroredStrategy's convention); with parameter servers
the coordinator is the `chief`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tfrecipe import reading, rundir
from tfrecipe.config import schema
from tfrecipe.errors import ConfigError

if TYPE_CHECKING:
    import tensorflow as tf

ROLES = ("chief", "worker", "ps", "evaluator")


@dataclasses.dataclass(frozen=True)
class Task:
    """This process's place in the cluster.

    Attributes:
      type: "chief", "worker", "ps" or "evaluator"; None for a single process (no cluster).
      index: the task's index within its role.
      cluster: role -> list of "host:port" addresses (empty for a single process).
    """

    type: str | None = None
    index: int = 0
    cluster: Mapping[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        """The one process that writes the run directory."""
        if self.type is None:
            return True
        if "chief" in self.cluster:
            return self.type == "chief"
        return self.type == "worker" and self.index == 0

    @property
    def num_workers(self) -> int:
        return len(self.cluster.get("worker", [])) + len(self.cluster.get("chief", []))


SINGLE_PROCESS = Task()


def parse_tf_config(raw: str | None) -> Task:
    """Checks a TF_CONFIG value; returns the task it describes.

    Raises:
      ConfigError: TF_CONFIG is unset, not JSON, or describes no valid task of its cluster.
    """
    where = "cluster=tf_config: TF_CONFIG"
    config = _json_object(raw, where)
    cluster = _parse_cluster(config.get("cluster"), where)
    task_type, index = _parse_task(config.get("task"), cluster, where)
    return Task(type=task_type, index=index, cluster=cluster)


def _json_object(raw: str | None, where: str) -> dict:
    """TF_CONFIG's JSON object; refuses an unset value, bad JSON or another JSON value."""
    if not raw:
        raise ConfigError(
            f"{where} is not set; set it to the JSON TensorFlow expects "
            '({"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}) '
            "or use cluster=local"
        )
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"{where} is not valid JSON ({error}); received TF_CONFIG={raw!r}"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(f"{where} must be a JSON object; received TF_CONFIG={raw!r}")
    return config


def _parse_task(task: object, cluster: dict[str, list[str]], where: str) -> tuple[str, int]:
    """(type, index) of TF_CONFIG's task: a role, and an index that `cluster` has an address
    for (the evaluator's is outside the cluster)."""
    if not isinstance(task, dict) or "type" not in task:
        raise ConfigError(
            f'{where} has no task; add "task": {{"type": "worker", "index": 0}} '
            f"(received task={task!r})"
        )
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in ROLES:
        raise ConfigError(
            f"{where}: task.type must be one of {', '.join(ROLES)}; received task.type={task_type!r}"
        )
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ConfigError(
            f"{where}: task.index must be a non-negative integer; received task.index={index!r}"
        )
    members = cluster.get(task_type, [])
    if task_type != "evaluator" and index >= len(members):  # the evaluator is outside the cluster
        raise ConfigError(
            f"{where}: task.index={index} is out of range for task.type={task_type!r}, which has "
            f"{len(members)} address(es) in cluster.{task_type}"
        )
    return task_type, index


def _parse_cluster(cluster: object, where: str) -> dict[str, list[str]]:
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError(
            f'{where} has no cluster; add "cluster": {{"worker": ["host:port", ...]}} '
            f"(received cluster={cluster!r})"
        )
    parsed = {}
    for role, addresses in cluster.items():
        if role not in ROLES:
            raise ConfigError(f"{where}: unknown role cluster.{role}; roles are {', '.join(ROLES)}")
        if not isinstance(addresses, list) or not all(_is_address(a) for a in addresses):
            raise ConfigError(
                f'{where}: cluster.{role} must be a list of "host:port" strings; '
                f"received {addresses!r}"
            )
        parsed[role] = list(addresses)
    if "worker" not in parsed and "chief" not in parsed:
        raise ConfigError(f"{where}: the cluster has no worker (cluster.worker is missing)")
    return parsed


def _is_address(address: object) -> bool:
    if not isinstance(address, str):
        return False
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit()


# --- Kubernetes: an indexed Job and a headless Service ------------------------------------------
# The variables scripts/k8s_*.yaml set; JOB_COMPLETION_INDEX is Kubernetes' own.
K8S_INDEX, K8S_JOB, K8S_SERVICE = "JOB_COMPLETION_INDEX", "TFRECIPE_K8S_JOB", "TFRECIPE_K8S_SERVICE"
K8S_REPLICAS, K8S_PORT = "TFRECIPE_K8S_REPLICAS", "TFRECIPE_K8S_PORT"
K8S_DEFAULT_PORT = 2222  # TFJob's
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def k8s_task(environ: Mapping[str, str], *, loopback: bool = False) -> Task:
    """The task of this pod of an indexed Job (completion indexes in role order: chief, workers,
    parameter servers, evaluator), as TFJob would have given it: the same roles, indexes and
    cluster, every address `JOB-INDEX.SERVICE:PORT` (the pod's hostname in the Service's
    subdomain); the evaluator is outside the cluster, as in TF_CONFIG.

    Args:
      environ: the pod's environment (K8S_INDEX, K8S_JOB, K8S_SERVICE, K8S_REPLICAS, K8S_PORT).
      loopback: every task at 127.0.0.1:(PORT + INDEX), for the Job's environment on one machine.

    Raises:
      ConfigError: a variable is missing or malformed (one line naming it).
    """
    replicas = _k8s_replicas(environ.get(K8S_REPLICAS))
    total = sum(replicas.values())
    index = _k8s_int(environ, K8S_INDEX, None, f"0..{total - 1} (set by an indexed Job)")
    if index >= total:
        raise ConfigError(
            f"cluster=k8s: {K8S_INDEX}={index} is past the Job's {total} pods "
            f"({K8S_REPLICAS}={environ[K8S_REPLICAS]}); make the Job's completions {total}"
        )
    port = _k8s_port(environ, total, loopback=loopback)
    if loopback:
        addresses = [f"127.0.0.1:{port + i}" for i in range(total)]
    else:
        job, service = _k8s_name(environ, K8S_JOB), _k8s_name(environ, K8S_SERVICE)
        addresses = [f"{job}-{i}.{service}:{port}" for i in range(total)]
    return _k8s_role_task(replicas, index, addresses)


def _k8s_port(environ: Mapping[str, str], total: int, *, loopback: bool) -> int:
    """K8S_PORT, with room for `total` consecutive ports when the tasks share a loopback."""
    port = _k8s_int(environ, K8S_PORT, K8S_DEFAULT_PORT, "a TCP port 1024..65535")
    last = port + total - 1 if loopback else port  # loopback: pod i at port + i
    if not 1024 <= port <= last <= 65535:
        raise ConfigError(
            f"cluster=k8s: {K8S_PORT}={port}: expected a TCP port 1024..{65536 - total if loopback else 65535}"
        )
    return port


def _k8s_role_task(replicas: dict[str, int], index: int, addresses: list[str]) -> Task:
    """The task of completion index `index`, the indexes given out to the roles in ROLES'
    order; the evaluator's address stays outside the cluster."""
    cluster, first, mine = {}, 0, None
    for role in ROLES:  # the order of the completion indexes
        count = replicas.get(role, 0)
        if first <= index < first + count:
            mine = (role, index - first)
        if count and role != "evaluator":
            cluster[role] = addresses[first : first + count]
        first += count
    return Task(type=mine[0], index=mine[1], cluster=cluster)


def _k8s_replicas(raw: str | None) -> dict[str, int]:
    """`worker=2` / `chief=1,worker=2,ps=1`: the pods per role."""
    expected = 'ROLE=COUNT pairs, e.g. "worker=2" or "chief=1,worker=2,ps=1"'
    if not raw:
        raise ConfigError(f"cluster=k8s: {K8S_REPLICAS} is not set; expected {expected}")
    replicas: dict[str, int] = {}
    for pair in raw.split(","):
        role, _, count = pair.strip().partition("=")
        if role not in ROLES or not count.isdigit() or role in replicas:
            raise ConfigError(
                f"cluster=k8s: {K8S_REPLICAS}={raw!r}: expected {expected} with roles among "
                f"{', '.join(ROLES)}, each once"
            )
        replicas[role] = int(count)
    if not replicas.get("worker") and not replicas.get("chief"):
        raise ConfigError(f"cluster=k8s: {K8S_REPLICAS}={raw!r} has no worker; expected {expected}")
    if replicas.get("chief", 0) > 1 or replicas.get("evaluator", 0) > 1:
        raise ConfigError(
            f"cluster=k8s: {K8S_REPLICAS}={raw!r}: at most one chief and one evaluator"
        )
    return replicas


def _k8s_int(environ: Mapping[str, str], name: str, default: int | None, expected: str) -> int:
    raw = environ.get(name)
    if raw is None and default is not None:
        return default
    if raw is None or not raw.isdigit():
        raise ConfigError(f"cluster=k8s: {name}={raw!r}: expected {expected}")
    return int(raw)


def _k8s_name(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "")
    if not _DNS_LABEL.fullmatch(value):
        raise ConfigError(
            f"cluster=k8s: {name}={value!r}: expected a Kubernetes name (lower-case letters, "
            "digits and '-', at most 63); the manifest sets it (scripts/k8s_multi_worker.yaml)"
        )
    return value


def export_k8s_tf_config(spec: schema.K8sCluster, environ: MutableMapping[str, str]) -> Task:
    """Builds this pod's TF_CONFIG from the Job's environment and sets it, so that the process
    joins from then on exactly as with cluster=tf_config. A TF_CONFIG already set must be the
    same one (never silently replaced)."""
    task = k8s_task(environ, loopback=spec.loopback)
    evaluators = _k8s_replicas(environ[K8S_REPLICAS]).get("evaluator", 0)
    if bool(evaluators) != spec.evaluator:
        raise ConfigError(
            f"cluster.evaluator={str(spec.evaluator).lower()}: {K8S_REPLICAS}="
            f"{environ[K8S_REPLICAS]} has {evaluators} evaluator pod(s); set "
            f"cluster.evaluator={str(bool(evaluators)).lower()} on every pod (workers save "
            "each epoch's weights for the evaluator)"
        )
    built = json.dumps(
        {"cluster": dict(task.cluster), "task": {"type": task.type, "index": task.index}}
    )
    given = environ.get("TF_CONFIG")
    if given and parse_tf_config(given) != task:
        raise ConfigError(
            f"cluster=k8s: TF_CONFIG is already set to another cluster ({given}); the Job's "
            f"environment gives {built}: unset TF_CONFIG, or use cluster=tf_config"
        )
    environ["TF_CONFIG"] = built
    return task


def current_task(spec: schema.Cluster, environ: MutableMapping[str, str] | None = None) -> Task:
    """This process's task, from the config and the environment (no TensorFlow needed except
    for SLURM, whose resolver computes it)."""
    environ = os.environ if environ is None else environ
    if spec.name == "tf_config":
        return parse_tf_config(environ.get("TF_CONFIG"))
    if spec.name == "k8s":
        return export_k8s_tf_config(spec, environ)
    if spec.name == "slurm":
        resolver = build_resolver(spec)
        members = resolver.cluster_spec().as_dict()  # resolves the task type and id as well
        return Task(type=resolver.task_type, index=resolver.task_id, cluster=members)
    return SINGLE_PROCESS


def check_environment(spec: schema.Cluster) -> None:
    """Raises `ConfigError` when the environment does not give the cluster the config asks for
    (cluster=k8s: sets the TF_CONFIG the Job's environment gives, see `export_k8s_tf_config`)."""
    if spec.name == "tf_config":
        parse_tf_config(os.environ.get("TF_CONFIG"))
    elif spec.name == "k8s":
        export_k8s_tf_config(spec, os.environ)  # every later step reads it, as for tf_config
    elif spec.name == "slurm" and "SLURM_JOB_ID" not in os.environ:
        raise ConfigError(
            "cluster=slurm: not inside a SLURM job (SLURM_JOB_ID is not set); submit with sbatch "
            "(see scripts/slurm_multi_worker.sbatch) or use cluster=local"
        )


_CPU_TASK_SLOTS = 4096  # more tasks per node than any machine runs


def build_resolver(spec: schema.Cluster) -> tf.distribute.cluster_resolver.ClusterResolver | None:
    """TensorFlow's cluster resolver for the config; None for a single process."""
    import tensorflow as tf

    if spec.name == "k8s":
        export_k8s_tf_config(spec, os.environ)
    if spec.name in ("tf_config", "k8s"):
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if spec.name == "slurm":
        try:
            return _slurm_resolver(spec)
        except (RuntimeError, ValueError, KeyError, OSError) as error:
            raise ConfigError(
                f"cluster=slurm: cannot read the SLURM allocation ({error})"
            ) from None
    return None


def _slurm_resolver(spec: schema.Cluster) -> tf.distribute.cluster_resolver.ClusterResolver:
    import tensorflow as tf

    slurm = tf.distribute.cluster_resolver.SlurmClusterResolver
    gpus = spec.gpus_per_node
    if gpus is None and shutil.which("nvidia-smi") is None:
        gpus = 0  # TensorFlow would count GPUs with nvidia-smi, absent on CPU nodes
    if gpus != 0:
        return slurm(
            port_base=spec.port_base, tasks_per_node=spec.tasks_per_node, gpus_per_node=gpus
        )

    class CpuSlurmClusterResolver(slurm):
        """A CPU node: no accelerators. TensorFlow's resolver pairs each task's port with a
        slice of GPUs and so finds no task on a node without any: it gets one private
        placeholder slot per task, never shown (num_accelerators, which strategies read to
        pick their devices, says none) nor used for CUDA_VISIBLE_DEVICES (auto_set_gpu)."""

        def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
            return {}

    return CpuSlurmClusterResolver(
        port_base=spec.port_base,
        tasks_per_node=spec.tasks_per_node,
        gpus_per_node=_CPU_TASK_SLOTS,
        gpus_per_task=1,
        auto_set_gpu=False,
    )


def settle_summary(run_dir: str | Path) -> None:
    """After a SLURM step (scripts/slurm_multi_worker.sbatch): a summary.json still "running" is
    that of a chief that was SIGKILLed (srun's answer to its own SIGTERM, or a cancelled job past
    KillWait), which could not say so. Mark it "failed", counting the steps of the last backup,
    where a rerun resumes. Any other summary (or none) is left as it is."""
    run_dir = Path(run_dir)
    home = rundir.RunFiles(run_dir)
    summary = home.summary()
    if not summary or summary.get("status") != "running":
        return
    step = latest_backup_step(run_dir / rundir.BACKUP)
    if step is not None:
        summary["steps_completed"] = step
    error = (
        "killed (SIGKILL) before it could save; a rerun resumes from the last backup "
        f"({'step ' + str(step) if step is not None else 'none: from the start'})"
    )
    home.record_status("failed", error, fields=summary)


def latest_backup_step(backup_dir: Path) -> int | None:
    """The step of the newest backup (CheckpointManager's state file names it `ckpt-STEP`)."""
    try:  # a regular file of a state file's size: a link to /dev/zero would be read forever
        state = reading.read_text(backup_dir / "checkpoint", limit=1024**2, what="a backup state")
    except (OSError, reading.UnreadableFile):
        return None
    match = re.search(r'^model_checkpoint_path: ".*?ckpt-(\d+)"', state, re.MULTILINE)
    return int(match[1]) if match else None


def is_chief_task(cluster: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process writes the run directory of a run on the cluster named `cluster`
    (`cluster.name`), judged without TensorFlow, for what runs before or after `train` (the
    pre-check, the job's config print and failure record): a SLURM step's task 0 (TensorFlow's
    SlurmClusterResolver makes every task a worker, the first one the chief), else as TF_CONFIG
    says (no (valid) TF_CONFIG: a single process, its own chief)."""
    environ = os.environ if environ is None else environ
    if cluster == "slurm":
        return environ.get("SLURM_PROCID", "0") == "0"
    try:
        return parse_tf_config(environ.get("TF_CONFIG")).is_chief
    except ConfigError:
        return True


# Worker servers of an in-process-scheduled cluster deadlock on a 2-core machine with TensorFlow's
# default inter-op pool (measured; docs/strategies.md, `cluster=local`): give them at least this many threads.
WORKER_INTER_OP_THREADS = 4


def serve(spec: schema.Cluster) -> NoReturn:
    """Runs this process as a parameter server or worker server until it is stopped.

    The coordinator (the chief) drives training through these servers; they run no Python
    training code themselves.
    """
    # gRPC reads this at start-up: fail calls to a dead task at once instead of waiting, so the
    # coordinator can reschedule its steps elsewhere.
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    import tensorflow as tf

    resolver = build_resolver(spec)
    config = tf.compat.v1.ConfigProto()
    if resolver.task_type == "worker":
        config.inter_op_parallelism_threads = max(
            WORKER_INTER_OP_THREADS, config.inter_op_parallelism_threads
        )
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        config=config,
        start=True,
    )
    print(f"{resolver.task_type} {resolver.task_id} serving at {server.target}", flush=True)
    server.join()
    raise SystemExit(0)  # join() returns only if the server is stopped
