"""cluster=k8s: the cluster of an indexed Job (scripts/k8s_multi_worker.yaml,
scripts/k8s_parameter_server.yaml) from its environment, checked against what Kubeflow's TFJob
gave, and the multi-worker Job's environment run for real as two local processes that resume
after one of them is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, TINY
from tests.helpers.configs import validate
from tests.helpers.ports import free_port_pair
from tfrecipe.cli import commands
from tfrecipe.distribute import cluster
from tfrecipe.errors import ConfigError
from tfrecipe.outcome import EXIT_STALLED, EXIT_TRAINING

MANIFESTS = ["k8s_multi_worker.yaml", "k8s_parameter_server.yaml"]


def _manifest(name: str) -> tuple[dict, dict]:
    service, job = yaml.safe_load_all((REPO / "scripts" / name).read_text())
    return service, job


def _job_env(job: dict, index: int) -> dict[str, str]:
    """The variables a pod of `job` gets: its own, the label Kubernetes puts on its pods (read
    through the downward API), JOB_COMPLETION_INDEX."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {cluster.K8S_INDEX: str(index)}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            assert "batch.kubernetes.io/job-name" in var["valueFrom"]["fieldRef"]["fieldPath"]
            env[var["name"]] = job["metadata"]["name"]
    return env


def tfjob_tf_config(name: str, namespace: str, replicas: dict[str, int], rtype: str, i: int):
    """The TF_CONFIG Kubeflow's training operator (v1, genTFConfigJSONStr) gave pod `i` of
    replica type `rtype`: every replica type's pods at NAME-TYPE-I.NAMESPACE.svc:2222."""
    spec = {
        role: [f"{name}-{role}-{n}.{namespace}.svc:2222" for n in range(count)]
        for role, count in replicas.items()
    }
    return {"cluster": spec, "task": {"type": rtype, "index": i}, "environment": "cloud"}


def test_the_spec_is_tfjobs_for_two_workers_and_a_parameter_server():
    """Pod for pod, the same TF_CONFIG as TFJob gave: the same keys, roles, task types and
    indexes, the same number of addresses per role in the same order and on the same port. Only
    the DNS names differ: TFJob made a Service per pod (NAME-TYPE-I.NAMESPACE.svc), an indexed
    Job names pods JOB-INDEX in one headless Service."""
    replicas = {"worker": 2, "ps": 1}
    env = {
        cluster.K8S_JOB: "mnist",
        cluster.K8S_SERVICE: "mnist",
        cluster.K8S_REPLICAS: "worker=2,ps=1",
    }
    pods = [("worker", 0), ("worker", 1), ("ps", 0)]  # the completion indexes, in role order
    for index, (rtype, i) in enumerate(pods):
        theirs = tfjob_tf_config("mnist", "default", replicas, rtype, i)
        mine = {**env, cluster.K8S_INDEX: str(index)}
        cluster.export_k8s_tf_config(validate_k8s(), mine)
        ours = json.loads(mine["TF_CONFIG"])
        same_pods = {
            f"mnist-{role}-{n}.default.svc": f"mnist-{pods.index((role, n))}.mnist"
            for role, n in pods
        }
        renamed = {
            role: [f"{same_pods[a.rpartition(':')[0]]}:{a.rpartition(':')[2]}" for a in addrs]
            for role, addrs in theirs["cluster"].items()
        }
        assert ours.keys() == theirs.keys() - {"environment"}  # "cloud": read by nothing in TF 2
        assert ours["task"] == theirs["task"]
        assert ours["cluster"].keys() == theirs["cluster"].keys()
        for role in theirs["cluster"]:
            assert ours["cluster"][role] == renamed[role], role
        task = cluster.parse_tf_config(mine["TF_CONFIG"])
        assert (task.type, task.index) == (rtype, i)
        assert task.is_chief == (index == 0)  # no chief entry: worker 0, as with TFJob


def validate_k8s(*overrides: str):
    from tfrecipe.config.compose import compose

    return validate(compose(["strategy=multi_worker_mirrored", "cluster=k8s", *overrides])).cluster


def test_a_chief_and_an_evaluator_follow_tf_configs_rules():
    env = {
        cluster.K8S_JOB: "j",
        cluster.K8S_SERVICE: "s",
        cluster.K8S_PORT: "3000",
        cluster.K8S_REPLICAS: "chief=1,worker=1,ps=1,evaluator=1",
    }
    tasks = [cluster.k8s_task({**env, cluster.K8S_INDEX: str(i)}) for i in range(4)]
    assert [(t.type, t.index, t.is_chief) for t in tasks] == [
        ("chief", 0, True),
        ("worker", 0, False),
        ("ps", 0, False),
        ("evaluator", 0, False),
    ]
    assert tasks[0].cluster == {
        "chief": ["j-0.s:3000"],
        "worker": ["j-1.s:3000"],
        "ps": ["j-2.s:3000"],
    }


@pytest.mark.parametrize(
    "change, message",
    [
        ({cluster.K8S_INDEX: None}, "cluster=k8s: JOB_COMPLETION_INDEX=None: expected 0..1"),
        ({cluster.K8S_INDEX: "2"}, "JOB_COMPLETION_INDEX=2 is past the Job's 2 pods"),
        ({cluster.K8S_REPLICAS: "workers=2"}, "TFRECIPE_K8S_REPLICAS='workers=2': expected"),
        ({cluster.K8S_REPLICAS: "ps=1"}, "has no worker"),
        ({cluster.K8S_SERVICE: "My_Service"}, "TFRECIPE_K8S_SERVICE='My_Service': expected a"),
        ({cluster.K8S_PORT: "80"}, "TFRECIPE_K8S_PORT=80: expected a TCP port 1024..65535"),
        (
            {"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}'},
            "cluster=k8s: TF_CONFIG is already set to another cluster",
        ),
        (
            {cluster.K8S_REPLICAS: "worker=2,evaluator=1"},
            "cluster.evaluator=false: TFRECIPE_K8S_REPLICAS=worker=2,evaluator=1 has 1 evaluator",
        ),
    ],
)
def test_a_bad_job_environment_is_one_line_naming_the_variable(change, message):
    env = {
        cluster.K8S_INDEX: "1",
        cluster.K8S_JOB: "j",
        cluster.K8S_SERVICE: "s",
        cluster.K8S_REPLICAS: "worker=2",
        **change,
    }
    env = {name: value for name, value in env.items() if value is not None}
    with pytest.raises(ConfigError) as caught:
        cluster.export_k8s_tf_config(validate_k8s(), env)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_manifests_command_validates_and_every_pod_joins(name, capsys):
    service, job = _manifest(name)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "tfrecipe"]
    commands.validate(container["args"])  # what `tfrecipe validate ARGS` runs
    assert capsys.readouterr().out.startswith("valid: ")
    # The Service names the pods: JOB-INDEX.SERVICE resolves to pod INDEX.
    assert (
        pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    )
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
    tasks = [cluster.k8s_task(_job_env(job, i)) for i in range(spec["completions"])]
    assert sum(map(len, tasks[0].cluster.values())) == spec["completions"]  # no pod left over
    assert [t.is_chief for t in tasks].count(True) == 1 and tasks[0].is_chief
    # Restarts: podFailurePolicy needs restartPolicy Never; 75 (preempted) is not counted.
    assert pod["restartPolicy"] == "Never" and spec["backoffLimitPerIndex"] >= 1
    rules = {
        r["action"]: r.get("onExitCodes", {}).get("values")
        for r in spec["podFailurePolicy"]["rules"]
        if "onExitCodes" in r
    }
    assert rules == {"Ignore": [75], "FailJob": [2]}  # 1 and 76 (stalled) count as restarts
    if "ps" in tasks[0].cluster:  # the servers never end: the Job ends with the coordinator
        assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}


# --- the multi-worker Job's environment as two local processes --------------------------------
STEPS = 2 * 8  # loop.epochs=2 x loop.steps_per_epoch=8
RUN = [
    *TINY,
    "loop.steps_per_epoch=8",
    "callbacks.backup.every_n_steps=2",
    "callbacks.progress.enabled=false",
    # each pod holds after step 5 (ckpt-4 written) until the test released it, having killed one
    "+callbacks.extra.hold._target_=tests.helpers.slow_steps.HoldUntilReleased",
    "+callbacks.extra.hold.steps=5",
    "allowed_targets=[tests.helpers]",
]


class Pod:
    """One pod of the Job: `python -m tfrecipe ARGS` with the manifest's command and variables
    (the Job's index, cluster.loopback=true: all on 127.0.0.1, pod i at PORT + i)."""

    def __init__(self, job: dict, index: int, port: int, run_dir: Path, tmp: Path):
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        args = [a for a in args if not a.startswith("hydra.run.dir=")]
        env = {
            **os.environ,
            **_job_env(job, index),
            cluster.K8S_PORT: str(port),
            "PYTHONPATH": str(REPO),
            "TMPDIR": str(tmp),
        }
        env.pop("TF_CONFIG", None)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tfrecipe",
                *args,
                "cluster.loopback=true",
                "cluster.stall_timeout=12",
                f"hydra.run.dir={run_dir}",
                *RUN,
                f"+callbacks.extra.hold.release={tmp / 'release'}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def finish(self, timeout: float) -> tuple[int, str]:
        try:
            out, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            out, _ = self.process.communicate()
        return self.process.returncode, out


@pytest.fixture
def start_pod(tmp_path):
    """start_pod(index) -> Pod of the multi-worker Job; none outlives the test."""
    _, job = _manifest("k8s_multi_worker.yaml")
    base, started = free_port_pair(), []
    (tmp_path / "tmp").mkdir()

    def _start(index: int) -> Pod:
        started.append(Pod(job, index, base, tmp_path / "run", tmp_path / "tmp"))
        return started[-1]

    yield _start
    for pod in started:
        if pod.process.poll() is None:
            os.killpg(pod.process.pid, signal.SIGKILL)
            pod.process.communicate()


@pytest.mark.slow
def test_the_jobs_two_pods_resume_after_one_is_killed(tmp_path, start_pod):
    run_dir = tmp_path / "run"
    pods = [start_pod(i) for i in range(2)]
    state = run_dir / "backup" / "checkpoint"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (
        'ckpt-4"' in _read(state) or any(p.process.poll() is not None for p in pods)
    ):
        time.sleep(0.2)
    ended = [pod.finish(5)[1][-3000:] for pod in pods if pod.process.poll() is not None]
    assert not ended, ended  # both still training: what an early exit printed, if one did
    os.killpg(pods[1].process.pid, signal.SIGKILL)  # worker 1's pod is killed mid-training
    pods[1].finish(10)
    (tmp_path / "tmp" / "release").touch()  # worker 0 goes on; the restarted pods do not hold
    killed_at = cluster.latest_backup_step(run_dir / "backup")
    assert 4 <= killed_at < STEPS
    pods[1] = start_pod(1)  # the Job restarts index 1 at once
    # Worker 0, left in a collective, stops by itself (a collective error, at the latest its
    # watchdog's 12 s) and is restarted in turn; the two meet again and resume.
    code, out = pods[0].finish(timeout=90)
    assert code in (EXIT_TRAINING, EXIT_STALLED), out[-3000:]
    pods[0] = start_pod(0)
    results = [pod.finish(timeout=240) for pod in pods]
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["num_replicas"] == 2
    assert summary["steps_completed"] == STEPS
    assert summary["resumed_from_step"] >= killed_at


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_the_command_line_refuses_a_pod_without_the_jobs_variables(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli("strategy=multi_worker_mirrored", "cluster=k8s", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "cluster=k8s: TFRECIPE_K8S_REPLICAS is not set" in result.stderr
    assert "Traceback" not in result.stderr and not run_dir.exists()
