"""Secrets are redacted in every form they are written in (raw, escaped by repr, JSON or YAML,
percent-encoded), a URL's password wherever a URL is written, and a secret is refused where
Hydra itself would write it (the run and sweep dirs' names, the job's name)."""

from __future__ import annotations

import json
import os

import pytest
from helpers.probes import redacted_log
from omegaconf import OmegaConf

# Holds the characters repr, JSON and YAML escape.
NASTY = "pa\\ss'wo\"rd-0123"
TOKEN = "hf_0123456789abcdefXYZ"


@pytest.mark.parametrize(
    "name",
    [
        "DB_PWD",
        "MYSQL_PWD",
        "WAREHOUSE_DSN",
        "SSH_PRIVATE_KEY",
        "GCP_CREDENTIALS",
        "SMTP_PASSWD",
        "MY_PRIVATEKEY_PEM",
        "HF_TOKEN",
        "WANDB_API_KEY",
    ],
)
def test_names_holding_secrets_look_secret(name):
    from tfrecipe.config.secrets import looks_secret

    assert looks_secret(name) and looks_secret(name.lower())


@pytest.mark.parametrize("name", ["PWD", "OLDPWD", "PATH", "HOME", "WANDB_MODE", "LOGNAME"])
def test_the_current_directory_and_ordinary_names_are_not_secrets(name):
    from tfrecipe.config.secrets import looks_secret

    assert not looks_secret(name)


def test_a_secret_is_redacted_raw_and_escaped_by_repr_json_and_yaml(monkeypatch):
    from tfrecipe.config.secrets import redact, redact_config, redact_text
    from tfrecipe.errors import Problem

    monkeypatch.setenv("DB_PWD", NASTY)
    written = [
        NASTY,
        repr(NASTY),
        repr({"password": NASTY}),
        str(Problem("loop.epochs", NASTY, "input should be a valid integer")),
        json.dumps({"x": NASTY}),
        json.dumps({"x": f"a{NASTY}é"}, ensure_ascii=True),
        OmegaConf.to_yaml({"x": NASTY}),
        f"postgres://me:{NASTY}@db",
    ]
    for text in written:
        assert NASTY not in redact_text(text) and "***" in redact_text(text), text
        inner = json.dumps(NASTY)[1:-1]
        assert inner not in redact_text(text) and repr(NASTY)[1:-1] not in redact_text(text)
    summary = redact({"error": repr(NASTY)})
    assert summary == {"error": "'***'"}
    assert redact_config({"notes": f"see {NASTY}"}) == {"notes": "***"}


def test_a_url_password_is_redacted_whatever_the_variables_name(monkeypatch):
    from tfrecipe.config.secrets import redact_config, redact_text

    url = "postgresql://alice:s3cr3t-pw@db.internal:5432/sales"
    monkeypatch.setenv("DATABASE_URL", url)  # an innocent name
    public = redact_config({"dataset": {"uri": url, "mirror": "https://bob:hunter2@mirror/x"}})
    assert public["dataset"]["uri"] == "***"  # the password is a secret of this environment
    assert public["dataset"]["mirror"] == "https://bob:***@mirror/x"  # any URL's password
    line = redact_text(f"connect failed: {url}; password s3cr3t-pw was refused")
    assert "s3cr3t-pw" not in line and "db.internal" in line
    encoded = "redis://:p%40ss%3Aword@cache:6379"
    assert redact_text(encoded) == "redis://:***@cache:6379"
    kept = "http://host:8080/a@b and user@example.org and s3://bucket/key"
    assert redact_text(kept) == kept, "no password there"


def test_the_log_and_the_console_never_show_an_escaped_secret(monkeypatch):
    monkeypatch.setenv("SERVICE_PRIVATE_KEY", NASTY)
    with redacted_log("test_secrets") as (logger, stream):
        logger.warning("options %r", {"key": NASTY})
    assert "***" in stream.getvalue() and "wo" not in stream.getvalue(), stream.getvalue()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("hydra.run.dir=out/r_${oc.env:HF_TOKEN}", "hydra.run.dir"),
        ("hydra.sweep.dir=multirun/${oc.env:HF_TOKEN}", "hydra.sweep.dir"),
        ("hydra.sweep.subdir=${hydra.job.num}_${oc.env:HF_TOKEN}", "hydra.sweep.subdir"),
        ("hydra.job.name=job-${oc.env:HF_TOKEN}", "hydra.job.name"),
        ("hydra.run.dir=out/" + TOKEN, "hydra.run.dir"),  # the value itself, typed out
    ],
)
def test_a_secret_in_a_value_hydra_writes_is_refused(monkeypatch, override, key):
    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(ConfigError) as refused:
        validate([override])
    assert str(refused.value).startswith(f"{key}="), refused.value
    assert "hydra.yaml" in str(refused.value) and TOKEN not in str(refused.value)


def test_ordinary_hydra_dirs_pass(monkeypatch):
    from tfrecipe.cli.commands import validate

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    validate(["hydra.run.dir=out/${oc.env:USER,me}_${now:%H}", "hydra.job.name=plain"])


def test_a_run_dir_named_by_a_secret_is_refused_before_anything_is_written(cli, tmp_path):
    """The probe: `hydra.run.dir: out/r_${oc.env:HF_TOKEN}` wrote the token into the dir's name
    and three times into .hydra/hydra.yaml."""
    env = {**os.environ, "HF_TOKEN": TOKEN}
    result = cli("hydra.run.dir=out/r_${oc.env:HF_TOKEN}", "loop.epochs=1", env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("tfrecipe:")]
    assert len(lines) == 1 and "hydra.run.dir=" in lines[0], result.stderr[-3000:]
    assert TOKEN not in result.stderr + result.stdout
    assert not (tmp_path / "out").exists() and not list(tmp_path.rglob("hydra.yaml"))


def test_config_yaml_and_the_trackers_config_hold_no_url_or_pwd_secret(monkeypatch, compose_cfg):
    """The probe: DATABASE_URL's password and *_PWD, *_DSN, *PRIVATE_KEY* values reached
    config.yaml and the W&B run file (both are `public_config`)."""
    from tfrecipe.rundir import public_config

    values = {
        "DATABASE_URL": "mysql://etl:Zq9-pass-77@warehouse/prod",
        "DB_PWD": NASTY,
        "SENTRY_DSN": "https://abc123def456@o1.ingest/42",
        "DEPLOY_PRIVATE_KEY": "-----BEGIN KEY-----MIIEv",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    cfg = compose_cfg(
        "logger=[wandb]",
        "logger.wandb.notes=db ${oc.env:DATABASE_URL}",
        "logger.wandb.name=${oc.env:DB_PWD}",
        "logger.wandb.group=${oc.env:SENTRY_DSN}",
        "logger.wandb.job_type=${oc.env:DEPLOY_PRIVATE_KEY}",
    )
    written = json.dumps(public_config(cfg)) + OmegaConf.to_yaml(public_config(cfg))
    for value in (*values.values(), "Zq9-pass-77", json.dumps(NASTY)[1:-1]):
        assert value not in written, value
    assert public_config(cfg)["logger"]["wandb"]["project"] == "tfrecipe", "other values stay"


@pytest.mark.parametrize(
    "args",
    [
        ["cat", "{recipe}"],
        ["recipe={recipe}", "--cfg", "job", "--resolve"],
        ["recipe={recipe}", "--cfg", "job", "-p", "logger.mlflow.tags.note"],  # select resolves
        ["help", "recipe={recipe}", "--resolve"],
    ],
)
def test_a_printed_config_shows_no_secret_a_shared_recipe_names(cli, tmp_path, args):
    """The probe: a shared recipe whose tag is `${oc.env:HF_TOKEN}`; `tfrecipe cat` (and Hydra's
    --cfg with --resolve or -p) printed the token on the console."""
    recipe = tmp_path / "shared.yaml"
    recipe.write_text(
        "# @package _global_\n"
        "defaults:\n  - override /logger: mlflow\n"
        "logger:\n  mlflow:\n    tags:\n      note: ${oc.env:HF_TOKEN}\n"
    )
    args = [a.replace("{recipe}", str(recipe)) for a in args]
    result = cli(*args, env={**os.environ, "HF_TOKEN": TOKEN})
    assert result.returncode == 0, result.stderr[-3000:]
    assert TOKEN not in result.stdout + result.stderr
    assert "***" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize(
    "typed",
    [
        "logger.mlflow.tracking_uri=http://me:pw-0123456789@db:5000",  # a URL's password
        "+logger.mlflow.tags.api_token=" + TOKEN,  # under a secret-looking key
        "+logger.mlflow.tags.note=" + TOKEN,  # the environment's secret, typed out
    ],
)
def test_tfrecipe_k8s_writes_no_typed_secret_into_the_job(cli, typed):
    """The probe: `tfrecipe k8s ... logger.mlflow.tracking_uri=http://me:PASSWORD@db` printed
    the password twice: in the manifest's comment line and in the pods' args, which whoever
    may read the Job or its pods sees (a run's own command line moves it into the environment,
    where no pod of the Job has it)."""
    result = cli(
        "k8s",
        "strategy=multi_worker_mirrored",
        "logger=mlflow",
        typed,
        env={**os.environ, "HF_TOKEN": TOKEN},
    )
    assert result.returncode == 2, result.stdout[-3000:]
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert TOKEN not in result.stderr and "pw-0123456789" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("tfrecipe: invalid configuration: k8s: ") and "Secret" in line, line
