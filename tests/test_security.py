"""A config (a recipe shared by someone else) cannot touch the file system or run code.

Every probe is a real attempt: a target that would write, delete, copy, fetch or run something,
aimed at files inside the test's tmp dir. Each must end with exit code 2 and one line, from a
plain run and from `tfrecipe validate` alike, before anything is imported or called: the tmp dir
is left exactly as it was and no run dir exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, TINY
from omegaconf import OmegaConf

# name -> (overrides, what the one-line report must name); {tmp} is the test's tmp dir.
PROBES = {
    "write_file_as_callback": (
        [
            "+callbacks.extra.x._target_=tensorflow.io.write_file",
            "+callbacks.extra.x.filename={tmp}/written",
            "+callbacks.extra.x.contents=hi",
        ],
        ["callbacks.extra.x._target_", "tensorflow.io.write_file", "keras.callbacks.Callback"],
    ),
    "rmtree_as_callback": (
        [
            "+callbacks.extra.x._target_=tensorflow.io.gfile.rmtree",
            "+callbacks.extra.x.path={tmp}/keep",
        ],
        ["tensorflow.io.gfile.rmtree", "keras.callbacks.Callback"],
    ),
    "makedirs_as_model": (
        ["model._target_=tensorflow.io.gfile.makedirs", "+model.path={tmp}/made"],
        ["model._target_", "tensorflow.io.gfile.makedirs", "model builder"],
    ),
    "copy_as_dataset": (
        [
            "dataset._target_=tensorflow.io.gfile.copy",
            "+dataset.src={tmp}/keep/file",
            "+dataset.dst={tmp}/copied",
        ],
        ["dataset._target_", "tensorflow.io.gfile.copy", "dataset builder"],
    ),
    "load_library": (
        ["model._target_=tensorflow.load_library", "+model.library_location={tmp}/lib.so"],
        ["tensorflow.load_library", "model builder"],
    ),
    "get_file": (
        [
            "+callbacks.extra.x._target_=keras.utils.get_file",
            "+callbacks.extra.x.origin=http://127.0.0.1:9/x",
            "+callbacks.extra.x.fname={tmp}/fetched",
        ],
        ["keras.utils.get_file"],
    ),
    "keras_src_internals": (
        ["model._target_=keras.src.utils.file_utils.rmtree", "+model.path={tmp}/keep"],
        ["keras.src.utils.file_utils.rmtree", "private"],
    ),
    "tensorflow_python_internals": (
        [
            "dataset._target_=tensorflow.python.lib.io.file_io.delete_recursively_v2",
            "+dataset.path={tmp}/keep",
        ],
        ["tensorflow.python.lib.io.file_io.delete_recursively_v2", "private"],
    ),
    "a_callback_that_deletes_its_directory": (
        [
            "+callbacks.extra.x._target_=keras.callbacks.BackupAndRestore",
            "+callbacks.extra.x.backup_dir={tmp}/keep",
        ],
        ["keras.callbacks.BackupAndRestore", "EarlyStopping"],
    ),
    "posix_allowed": (
        [
            "allowed_targets=[posix]",
            "model._target_=posix.system",
            "+model.command=touch {tmp}/ran",
        ],
        ["allowed_targets", "'posix'", "standard library"],
    ),
    "runpy_allowed": (
        ["allowed_targets=[runpy]", "dataset._target_=runpy.run_path", "+dataset.path={tmp}/s.py"],
        ["allowed_targets", "'runpy'", "standard library"],
    ),
    "ctypes_allowed": (
        ["allowed_targets=[ctypes]", "model._target_=ctypes.CDLL", "+model.name={tmp}/lib.so"],
        ["'ctypes'", "standard library"],
    ),
    "tensorflow_allowed": (
        ["allowed_targets=[tensorflow]", "model._target_=tensorflow.io.write_file"],
        ["allowed_targets", "'tensorflow'", "framework"],
    ),
    "code_not_allowed": (
        ["+callbacks.extra.x._target_=code.InteractiveConsole"],
        ["code.InteractiveConsole", "keras.callbacks.Callback"],
    ),
    "a_private_name_under_the_users_prefix": (
        ["allowed_targets=[tests.helpers]", "model._target_=tests.helpers.user_models._hidden"],
        ["tests.helpers.user_models._hidden", "private"],
    ),
    "hydra_callback": (
        ["+hydra.callbacks.x._target_=tempfile.mkdtemp", "+hydra.callbacks.x.dir={tmp}"],
        ["hydra.callbacks.x", "Hydra callbacks are not supported"],
    ),
    "hydra_callback_running_source": (
        [
            "+hydra.callbacks.x._target_=tensorflow.python.autograph.pyct.loader.load_source",
            '+hydra.callbacks.x.source=\'open("{tmp}/ran", "w")\'',
            "+hydra.callbacks.x.delete_on_exit=false",
        ],
        ["hydra.callbacks.x", "Hydra callbacks are not supported"],
    ),
    "env_set_ld_preload": (
        ["+hydra.job.env_set.LD_PRELOAD={tmp}/evil.so"],
        ["hydra.job.env_set.LD_PRELOAD=", "evil.so'", "sets how processes load code"],
    ),
    "env_set_pythonpath": (
        ["+hydra.job.env_set.PYTHONPATH={tmp}"],
        ["hydra.job.env_set.PYTHONPATH=", "sets how processes load code"],
    ),
    "hydra_logging_factory": (
        ["hydra.job_logging.handlers.console.class=posix.system"],
        ["hydra.job_logging.handlers.console.class", "posix.system", "logging.StreamHandler"],
    ),
}


def _fill(overrides: list[str], tmp: Path) -> list[str]:
    return [o.replace("{tmp}", str(tmp)) for o in overrides]


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


@pytest.fixture
def victim(tmp_path) -> Path:
    """What a probe aims at: a directory holding a file, which must survive untouched."""
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "file").write_text("precious\n")
    (tmp_path / "s.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    return tmp_path


def _one_line_report(result) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("tfrecipe: invalid")]
    assert len(lines) == 1 and "problems)" not in lines[0], result.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_probe_is_refused_by_a_run_and_by_validate_with_no_side_effect(cli, victim, probe):
    overrides, fragments = PROBES[probe]
    overrides = _fill(overrides, victim)
    run_dir = victim / "run"
    before = _snapshot(victim)

    run = cli(*overrides, *TINY, f"hydra.run.dir={run_dir}", env={"PYTHONPATH": str(REPO)})
    validate = cli("validate", *overrides, env={"PYTHONPATH": str(REPO)})

    report = _one_line_report(run)
    for fragment in fragments:
        assert fragment in report, report
    assert _one_line_report(validate) == report, "validate reports the same problem"
    assert _snapshot(victim) == before, "nothing written, deleted or created"


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_probe_is_refused_by_validate_in_process_with_no_side_effect(victim, probe):
    """The test above without processes, so the fast tier (`pytest -m fast`) has every probe."""
    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    overrides, fragments = PROBES[probe]
    before = _snapshot(victim)
    with pytest.raises(ConfigError) as refused:
        validate(_fill(overrides, victim))
    for fragment in fragments:
        assert fragment in str(refused.value), refused.value
    assert _snapshot(victim) == before, "nothing written, deleted or created"


def test_a_target_outside_the_slots_is_refused(cli, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        "+model.head._target_=tensorflow.io.write_file",
        f"+model.head.filename={tmp_path}/x",
    ]
    for result in (cli(*overrides, f"hydra.run.dir={run_dir}"), cli("validate", *overrides)):
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "model.head._target_='tensorflow.io.write_file': a config names targets only in" in (
            result.stderr
        )
    assert sorted(tmp_path.iterdir()) == []


def test_a_sweep_is_refused_before_hydra_runs_its_callbacks(cli, victim):
    before = _snapshot(victim)
    result = cli(
        "-m", "loop.epochs=1,2", "+hydra.callbacks.x._target_=tempfile.mkdtemp",
        f"+hydra.callbacks.x.dir={victim}", f"hydra.sweep.dir={victim / 'sweep'}",
    )  # fmt: skip
    assert "hydra.callbacks.x" in _one_line_report(result)
    assert _snapshot(victim) == before


def test_each_value_of_a_sweep_is_checked(cli, victim):
    before = _snapshot(victim)
    result = cli(
        "-m", "+callbacks.extra.x._target_=keras.callbacks.EarlyStopping,keras.utils.get_file",
        f"hydra.sweep.dir={victim / 'sweep'}",
    )  # fmt: skip
    assert "keras.utils.get_file" in _one_line_report(result)
    assert _snapshot(victim) == before


def test_a_users_config_dir_is_checked_too(cli, victim):
    conf = victim / "my_conf"
    conf.mkdir()
    before = _snapshot(victim)
    result = cli(
        "--config-dir", str(conf), "+hydra.callbacks.x._target_=tempfile.mkdtemp",
        f"+hydra.callbacks.x.dir={victim}", f"hydra.run.dir={victim / 'run'}",
    )  # fmt: skip
    assert "hydra.callbacks.x" in _one_line_report(result)
    assert _snapshot(victim) == before


def test_the_kinds_tfrecipe_ships_are_valid(cli):
    result = cli(
        "validate",
        "+callbacks.extra.stop._target_=keras.callbacks.EarlyStopping",
        "+callbacks.extra.lr._target_=keras.callbacks.ReduceLROnPlateau",
        "hydra/launcher=joblib",
        "hydra/sweeper=optuna",
    )
    assert result.returncode == 0, result.stderr[-3000:]


# Variables that decide what code a process loads: each is refused in `hydra.job.env_set`.
CODE_ENV = [
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "PYTHONSTARTUP",
    "PYTHONPATH", "PYTHONHOME", "PYTHONWARNINGS", "BASH_ENV", "ENV", "PATH", "PERL5OPT",
    "PERL5LIB", "RUBYOPT", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "GCONV_PATH", "GLIBC_TUNABLES",
    "XLA_FLAGS", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "ld_preload",
]  # fmt: skip
PLAIN_ENV = [
    "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "WANDB_MODE", "OMP_NUM_THREADS",
    "PYTHONHASHSEED", "PYTHONUNBUFFERED",
]  # fmt: skip


@pytest.mark.parametrize("name", CODE_ENV)
def test_env_set_refuses_a_variable_that_loads_code(name):
    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        validate([f"+hydra.job.env_set.{name}=/tmp/x", "+hydra.job.env_set.WANDB_MODE=offline"])
    assert str(refused.value).startswith(f"hydra.job.env_set.{name}='/tmp/x': sets how"), (
        refused.value
    )
    assert "WANDB_MODE" not in str(refused.value)


def test_env_set_takes_ordinary_variables_and_env_copy_takes_code_ones():
    """env_copy only repeats this environment's own value (Hydra overwrites env_set with it)."""
    from tfrecipe.cli.commands import validate

    validate([f"+hydra.job.env_set.{name}=1" for name in PLAIN_ENV])
    validate(["hydra.job.env_copy=[PATH]", "+hydra.job.env_set.PATH=/elsewhere"])


def test_env_copy_refuses_a_secret(monkeypatch):
    """Hydra would write the copied value into the run dir's .hydra/hydra.yaml."""
    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef")
    with pytest.raises(ConfigError, match="env_copy='WANDB_API_KEY': would write that secret"):
        validate(["hydra.job.env_copy=[WANDB_API_KEY]"])


@pytest.mark.parametrize(
    ("storage", "valid"),
    [
        ("null", True),
        ("'sqlite:///study.db'", True),
        ("'postgresql://user:pw@203.0.113.1/db'", False),
        ("'redis://203.0.113.1'", False),
    ],
)
def test_optuna_storage_is_an_sqlite_file_or_nothing(storage, valid):
    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    overrides = ["hydra/sweeper=optuna", f"hydra.sweeper.storage={storage}"]
    if valid:
        validate(overrides)
    else:
        with pytest.raises(ConfigError, match=r"hydra\.sweeper\.storage=.*expected sqlite:///FILE"):
            validate(overrides)


def test_a_sweep_refuses_env_set_before_anything_runs(cli, victim):
    before = _snapshot(victim)
    result = cli(
        "-m", "+hydra.job.env_set.OMP_NUM_THREADS=1,2", f"+hydra.job.env_set.BASH_ENV={victim}/s.py",
        f"hydra.sweep.dir={victim / 'sweep'}",
    )  # fmt: skip
    assert "hydra.job.env_set.BASH_ENV=" in _one_line_report(result)
    assert _snapshot(victim) == before


def _tampered_run_dir(root: Path, **changes: str) -> Path:
    """A run dir as someone else might hand it over: its config.yaml edited."""
    from tfrecipe.config.compose import compose
    from tfrecipe.rundir import write_config

    cfg = compose(TINY)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    run_dir = root / "received"
    run_dir.mkdir()
    write_config(run_dir, cfg)
    return run_dir


def test_evaluate_refuses_a_tampered_run_dir(cli, victim):
    run_dir = _tampered_run_dir(
        victim,
        **{"model._target_": "tensorflow.io.write_file", "model.filename": str(victim / "x")},
    )
    before = _snapshot(victim)
    report = _one_line_report(cli("evaluate", str(run_dir)))
    assert "model._target_='tensorflow.io.write_file'" in report, report
    assert _snapshot(victim) == before, "nothing instantiated, no evaluation.json"


def test_evaluate_refuses_hydra_callbacks_slipped_into_a_run_dir(cli, victim):
    run_dir = _tampered_run_dir(victim)
    (run_dir / "config.yaml").write_text(
        (run_dir / "config.yaml").read_text()
        + f"hydra:\n  callbacks:\n    x:\n      _target_: tempfile.mkdtemp\n      dir: {victim}\n"
    )
    before = _snapshot(victim)
    assert "hydra.callbacks.x" in _one_line_report(cli("evaluate", str(run_dir)))
    assert _snapshot(victim) == before


SECRET = "sk-test-0123456789abcdef"


def test_a_secret_interpolated_under_any_key_is_redacted(monkeypatch, compose_cfg):
    from tfrecipe.rundir import public_config

    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    cfg = compose_cfg(
        "logger=[wandb]", "logger.wandb.notes=${oc.env:WANDB_API_KEY}",
        "logger.wandb.name=run-${oc.env:WANDB_API_KEY}",
    )  # fmt: skip
    public = public_config(cfg)
    assert public["logger"]["wandb"]["notes"] == "***"
    assert public["logger"]["wandb"]["name"] == "***"
    assert SECRET not in json.dumps(public)
    assert public["logger"]["wandb"]["project"] == "tfrecipe", "other values stay"


def test_a_secret_reaches_no_file_of_a_wandb_run(monkeypatch, tmp_path, train_run):
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    summary, run_dir = train_run(
        "logger=[wandb]", "logger.wandb.mode=offline", "model=mlp",
        "logger.wandb.notes=${oc.env:WANDB_API_KEY}", "loop.epochs=1",
    )  # fmt: skip
    assert summary["status"] == "completed"
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"the secret was written to {leaked}"
    assert (run_dir / "wandb").is_dir() and "notes: '***'" in (run_dir / "config.yaml").read_text()
