"""The `cluster` group without training: TF_CONFIG validation (as a function and through the real
command line), the chief, the launcher's task commands and ports, and config combinations that
are refused before anything starts."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.configs import validate
from tfrecipe.distribute import cluster, launcher
from tfrecipe.errors import ConfigError

TWO_WORKERS = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


def tf_config(cluster_spec=TWO_WORKERS, task_type="worker", index=0) -> str:
    return json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}})


# --- TF_CONFIG ------------------------------------------------------------------------------------
def test_a_valid_tf_config_gives_the_task():
    task = cluster.parse_tf_config(tf_config(index=1))
    assert (task.type, task.index, task.num_workers) == ("worker", 1, 2)
    assert not task.is_chief
    assert cluster.parse_tf_config(tf_config(index=0)).is_chief


def test_with_a_chief_entry_the_chief_is_the_chief():
    spec = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    assert cluster.parse_tf_config(tf_config(spec, "chief", 0)).is_chief
    assert not cluster.parse_tf_config(tf_config(spec, "worker", 0)).is_chief


BAD_TF_CONFIGS = {
    "unset": (None, "TF_CONFIG is not set"),
    "malformed JSON": ('{"cluster": {', "TF_CONFIG is not valid JSON"),
    "not an object": ("[1, 2]", "must be a JSON object"),
    "no cluster": ('{"task": {"type": "worker", "index": 0}}', "TF_CONFIG has no cluster"),
    "no task": (json.dumps({"cluster": TWO_WORKERS}), "TF_CONFIG has no task"),
    "index out of range": (tf_config(index=2), "task.index=2 is out of range"),
    "negative index": (tf_config(index=-1), "task.index must be a non-negative integer"),
    "unknown role": (tf_config(task_type="boss"), "task.type must be one of"),
    "role not in cluster": (tf_config(task_type="ps"), "task.index=0 is out of range"),
    "bad address": (tf_config({"worker": ["no-port"]}), 'must be a list of "host:port"'),
}


@pytest.mark.parametrize(("raw", "message"), BAD_TF_CONFIGS.values(), ids=BAD_TF_CONFIGS)
def test_a_bad_tf_config_is_a_config_error_naming_the_problem(raw, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")) as error:
        cluster.parse_tf_config(raw)
    assert len(error.value.messages) == 1 and "\n" not in error.value.messages[0]


def test_the_evaluator_need_not_be_in_the_cluster():
    task = cluster.parse_tf_config(tf_config(task_type="evaluator"))
    assert task.type == "evaluator" and not task.is_chief


@pytest.mark.parametrize(
    ("raw", "message"),
    [BAD_TF_CONFIGS[k] for k in ("malformed JSON", "no task", "index out of range")],
    ids=["malformed JSON", "no task", "index out of range"],
)
def test_the_command_line_refuses_a_bad_tf_config(cli, tmp_path, raw, message):
    run_dir = tmp_path / "run"
    result = cli(
        "strategy=multi_worker_mirrored",
        "cluster=tf_config",
        f"hydra.run.dir={run_dir}",
        env={"TF_CONFIG": raw},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    report = [line for line in result.stderr.splitlines() if line.startswith("tfrecipe:")]
    assert len(report) == 1 and message in report[0], result.stderr[-2000:]
    assert not run_dir.exists()


# --- refused combinations -----------------------------------------------------------------------
REFUSED = {
    "parameter_server with fit": (
        ["strategy=parameter_server", "cluster=local", "cluster.num_ps=1", "loop=fit"],
        "loop=fit: Keras 3 Model.fit does not support strategy=parameter_server; use loop=custom",
    ),
    "parameter_server without a cluster": (
        ["strategy=parameter_server", "loop=custom"],
        "strategy=parameter_server: needs a cluster",
    ),
    "parameter_server without ps": (
        ["strategy=parameter_server", "cluster=local", "loop=custom"],
        "cluster.num_ps=0",
    ),
    "ps for a mirrored cluster": (
        ["strategy=multi_worker_mirrored", "cluster=local", "cluster.num_ps=1"],
        "cluster.num_ps=1: parameter servers serve only strategy=parameter_server",
    ),
    "local cluster for a one-process strategy": (
        ["strategy=mirrored", "cluster=local"],
        "cluster=local: starts several workers",
    ),
}


@pytest.mark.parametrize(("overrides", "message"), REFUSED.values(), ids=REFUSED)
def test_combinations_that_cannot_work_are_refused(compose_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        validate(compose_cfg(*overrides))


def test_the_command_line_refuses_fit_on_parameter_servers(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(
        "strategy=parameter_server",
        "cluster=local",
        "cluster.num_ps=1",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 2
    assert "use loop=custom" in result.stderr and "Traceback" not in result.stderr
    assert not run_dir.exists()


# --- the launcher's pieces ------------------------------------------------------------------------
def test_free_ports_are_distinct_loopback_ports():
    ports = launcher.free_ports(5)
    assert len(set(ports)) == 5 and all(1024 <= p <= 65535 for p in ports)


def test_the_cluster_spec_lists_loopback_addresses_only():
    spec = launcher.cluster_spec(launcher.LaunchOptions(num_workers=2, num_ps=1))
    assert {role: len(a) for role, a in spec.items()} == {"chief": 1, "worker": 2, "ps": 1}
    assert all(a.startswith("127.0.0.1:") for addrs in spec.values() for a in addrs)


def test_tasks_run_the_same_overrides_joining_through_tf_config():
    overrides = [
        "model=mlp",
        "cluster=local",
        "cluster.num_workers=3",
        "+cluster.x=1",
        "hydra.run.dir='/tmp/r'",
    ]
    argv = launcher.task_argv(overrides, chief=True)
    assert argv[:4] == [sys.executable, "-P", "-m", "tfrecipe"]  # not the current folder's
    assert argv[4:] == ["model=mlp", "hydra.run.dir='/tmp/r'", "cluster=tf_config"]
    # Non-chief tasks keep Hydra's own files out of the shared run dir.
    assert launcher.task_argv(overrides, chief=False)[-2:] == [
        "hydra.output_subdir=null",
        "hydra/job_logging=stdout",
    ]


def test_the_launcher_does_not_import_tensorflow():
    code = "import sys, tfrecipe.cli.main, tfrecipe.distribute.launcher; print('tensorflow' in sys.modules)"
    import subprocess

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_train_refuses_the_local_launcher_inside_a_process(compose_cfg, tmp_path):
    from tfrecipe.train import train

    cfg = compose_cfg("strategy=multi_worker_mirrored", "cluster=local")
    with pytest.raises(
        ConfigError, match="cluster=local: the local launcher runs from the command"
    ):
        train(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_keras_fix_covers_the_installed_keras():
    """The installed Keras is one the multi-worker fit fix is verified for: after an upgrade this
    fails until someone checks (tests/test_multi_worker.py) whether the fix is still needed."""
    import keras

    from tfrecipe.compat import needs_fix

    assert needs_fix(keras.__version__)
    assert not needs_fix("3.16.0") and not needs_fix("2.15.0")


# --- SLURM (the resolver on a SLURM job's environment; the sbatch script runs it for real) -------
SLURM_JOB = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "node[01-02]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
}


@pytest.mark.parametrize("rank", [0, 3])
def test_slurm_tasks_become_workers_on_cpu_nodes(monkeypatch, compose_cfg, rank):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: CPU nodes
    for name, value in {**SLURM_JOB, "SLURM_PROCID": str(rank)}.items():
        monkeypatch.setenv(name, value)
    run = validate(
        compose_cfg("strategy=multi_worker_mirrored", "cluster=slurm", "cluster.port_base=9000")
    )
    task = cluster.current_task(run.cluster)
    assert task.cluster == {"worker": ["node01:9000", "node01:9001", "node02:9000", "node02:9001"]}
    assert (task.type, task.index, task.is_chief) == ("worker", rank, rank == 0)


def test_slurm_outside_a_job_is_refused(cli, tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run_dir = tmp_path / "run"
    result = cli("strategy=multi_worker_mirrored", "cluster=slurm", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2 and "cluster=slurm: not inside a SLURM job" in result.stderr
    assert not run_dir.exists()
