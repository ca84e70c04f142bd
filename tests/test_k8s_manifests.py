"""What Kubernetes gets (issue 49, item 9): every shipped manifest and every one `tfrecipe k8s`
writes is checked against the Kubernetes API schema (the `kubernetes` client's models), the
shipped Job manifests are what the command writes for their shapes, the Dockerfile installs
this checkout, and a bad shape or config is one line, exit 2."""

from __future__ import annotations

import copy
import itertools
import re
import shlex

import pytest
import yaml

from tests.conftest import REPO
from tests.helpers.k8s_schema import schema_problems
from tfrecipe.cli.k8s import main as k8s_main
from tfrecipe.distribute import cluster
from tfrecipe.errors import ConfigError

pytest.importorskip("kubernetes")

SHIPPED = ["k8s_multi_worker.yaml", "k8s_parameter_server.yaml", "k8s_runs_volume.yaml"]
IMAGE = "ghcr.io/your-org/tfrecipe:latest"


def _documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _written(capsys, *args: str) -> list[dict]:
    k8s_main(list(args))
    return _documents(capsys.readouterr().out)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_manifest_fits_the_kubernetes_schema(name):
    for document in _documents((REPO / "scripts" / name).read_text()):
        assert schema_problems(document) == [], name


def test_the_schema_check_names_a_typo_and_a_missing_field():
    job = _documents((REPO / "scripts" / "k8s_multi_worker.yaml").read_text())[1]
    typo = copy.deepcopy(job)
    typo["spec"]["backoffLimitPerIndx"] = typo["spec"].pop("backoffLimitPerIndex")
    assert schema_problems(typo) == ["Job.spec.backoffLimitPerIndx: no such field of V1JobSpec"]
    unnamed = copy.deepcopy(job)
    del unnamed["spec"]["template"]["spec"]["containers"][0]["name"]
    [problem] = schema_problems(unnamed)
    assert problem.startswith("Job.spec.template.spec.containers[0]: Invalid value for `name`")
    wrong = copy.deepcopy(job)
    wrong["spec"]["completions"] = "2"
    assert schema_problems(wrong) == ["Job.spec.completions: expected int, received '2'"]


@pytest.mark.parametrize(
    ("manifest", "args"),
    [
        ("k8s_multi_worker.yaml", ["--name", "tfrecipe-mwms", "strategy=multi_worker_mirrored"]),
        (
            "k8s_parameter_server.yaml",
            [
                "--name",
                "tfrecipe-ps",
                "--workers",
                "2",
                "--ps",
                "1",
                "strategy=parameter_server",
                "loop=custom",
            ],
        ),
    ],
)
def test_the_command_writes_the_shipped_manifests_for_their_shapes(capsys, manifest, args):
    volume, service, job = _written(capsys, "--image", IMAGE, *args)
    assert [schema_problems(d) for d in (volume, service, job)] == [[], [], []]
    assert volume == _documents((REPO / "scripts" / "k8s_runs_volume.yaml").read_text())[0]
    assert [service, job] == _documents((REPO / "scripts" / manifest).read_text())


def test_the_written_job_is_the_shape_asked_for_and_every_pod_joins(capsys):
    args = [
        "--name",
        "big",
        "--workers",
        "3",
        "--ps",
        "2",
        "--storage-class",
        "nfs",
        "strategy=parameter_server",
        "loop=custom",
        "model=mlp",
        "hydra.run.dir=elsewhere",
    ]
    volume, service, job = _written(capsys, *args)
    assert volume["spec"]["storageClassName"] == "nfs"
    spec = job["spec"]
    assert spec["completions"] == spec["parallelism"] == 1 + 3 + 2
    container = spec["template"]["spec"]["containers"][0]
    assert container["args"] == [
        "strategy=parameter_server",
        "loop=custom",
        "model=mlp",
        "cluster=k8s",
        "hydra.run.dir=/runs/big",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    base = {
        cluster.K8S_JOB: "big",
        cluster.K8S_SERVICE: env[cluster.K8S_SERVICE],
        cluster.K8S_REPLICAS: env[cluster.K8S_REPLICAS],
        cluster.K8S_PORT: "2222",
    }
    tasks = [cluster.k8s_task({**base, cluster.K8S_INDEX: str(i)}) for i in range(6)]
    assert [(t.type, t.index) for t in tasks] == [
        ("chief", 0),
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
        ("ps", 0),
        ("ps", 1),
    ]
    assert tasks[0].is_chief and service["metadata"]["name"] == "big"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["model=mlp"],
            "k8s: strategy=default: a Job of several pods trains under "
            "strategy=multi_worker_mirrored or strategy=parameter_server",
        ),
        (
            ["--name", "Bad_Name", "strategy=multi_worker_mirrored"],
            "k8s: --name=Bad_Name: expected a DNS label (lowercase letters, digits, '-', starting "
            "with a letter, at most 42 characters)",
        ),
        (
            ["strategy=multi_worker_mirrored", "loop.epochs=0"],
            "loop.epochs=0: input should be greater than 0",
        ),
    ],
)
def test_a_bad_shape_or_config_is_one_line(args, line, capsys):
    with pytest.raises(ConfigError) as refused:
        k8s_main(args)
    assert refused.value.messages == [line]
    assert capsys.readouterr().out == ""


def test_the_dockerfile_installs_this_checkout():
    """What the wheel is built from is copied in (pyproject's package and force-included
    folders), and pip installs the copy, not a package of that name from PyPI."""
    text = (REPO / "Dockerfile").read_text()
    copied = {
        p.strip("./") for line in re.findall(r"^COPY (.+) \S+$", text, re.M) for p in line.split()
    }
    assert {"pyproject.toml", "README.md", "tfrecipe", "conf", "recipes"} <= copied
    assert re.search(r"^RUN pip install --no-cache-dir \.$", text, re.M)


def test_the_docs_commands_write_manifests_that_fit_the_schema(capsys):
    """docs/strategies.md's `tfrecipe k8s` lines, run as shown up to the pipe or redirection."""
    page = (REPO / "docs" / "strategies.md").read_text()
    block = page.split("<!-- shell: runs in tests/test_k8s_manifests.py")[1].split("```bash\n")[1]
    lines = block.split("```")[0].replace("\\\n", " ").splitlines()
    commands = [shlex.split(line, comments=True) for line in lines if line.strip()]
    assert len(commands) == 2
    for words in commands:
        assert words[:2] == ["tfrecipe", "k8s"]
        args = list(itertools.takewhile(lambda w: w not in ("|", ">"), words[2:]))
        documents = _written(capsys, *args)
        assert [d["kind"] for d in documents] == ["PersistentVolumeClaim", "Service", "Job"]
        assert all(schema_problems(d) == [] for d in documents)
