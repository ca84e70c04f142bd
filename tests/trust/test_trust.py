"""One `Trust`, from this invocation's command line, is the only thing that grants code: a run
dir's config.yaml, a recipe, a sweep's params in any spelling and a sweep job's own config
grant nothing, whichever command reads them (tfrecipe/config/trust.py)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import TINY
from omegaconf import OmegaConf

from tfrecipe.config.grants import allowed_prefix_problem
from tfrecipe.config.trust import TRUST_ENV, Trust
from tfrecipe.errors import ConfigError

MAKO = "<%! import pathlib; pathlib.Path({marker!r}).write_text('ran') %>"


def _received_run_dir(tmp_path, compose_cfg):
    """A run dir someone sent: its config.yaml grants Mako and names a template as the dataset."""
    marker = tmp_path / "ran"
    run_dir = tmp_path / "received"
    run_dir.mkdir()
    config = OmegaConf.to_container(compose_cfg(), resolve=True)
    config["allowed_targets"] = ["mako"]
    config["dataset"] = {
        "_target_": "mako.template.Template",
        "text": MAKO.format(marker=str(marker)),
    }
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(config))
    return run_dir, marker


@pytest.mark.parametrize("command", ["export", "evaluate"])
def test_a_received_run_dirs_config_grants_nothing(command, tmp_path, compose_cfg):
    from tfrecipe.runs import RunDir

    run_dir, marker = _received_run_dir(tmp_path, compose_cfg)
    with pytest.raises(ConfigError) as refused:
        RunDir.at(run_dir).config([], command=command)
    assert "allowed_targets" in str(refused.value) and "'mako'" in str(refused.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    "package",
    [
        "mako",
        "jinja2",
        "sqlalchemy",
        "alembic",
        "optuna",
        "pytest",
        "pip",
        "onnx",
        "tf2onnx",
        "submitit",
        "setuptools",
        "yaml",
        "wandb",
    ],
)
def test_packages_tfrecipe_installs_cannot_be_granted_even_on_the_command_line(package):
    trust = Trust.from_command_line([f"allowed_targets=[{package}]"])
    problem = allowed_prefix_problem(package, trust=trust)
    assert problem is not None and problem.key == "allowed_targets", package


def test_the_users_own_package_is_granted_by_name_and_only_by_the_command_line():
    typed = Trust.from_command_line(["allowed_targets=[mypkg.models]", "seed=1"])
    assert allowed_prefix_problem("mypkg.models", trust=typed) is None
    assert allowed_prefix_problem("mypkg", trust=typed) is not None, "the grant names a prefix"
    assert allowed_prefix_problem("mypkg.models", trust=Trust.NOTHING) is not None
    # A package that shares a name with one an installed distribution ships (tf2onnx has a
    # top-level `tests`) stays the user's where the user's folder holds it.
    assert (
        allowed_prefix_problem(
            "tests.helpers", trust=Trust.from_command_line(["allowed_targets=[tests.helpers]"])
        )
        is None
    )


def test_a_sweep_job_has_its_sweeps_trust_and_a_bare_process_none(monkeypatch, compose_cfg):
    from tests.helpers.configs import validate

    cfg = compose_cfg(
        "allowed_targets=[tests.helpers]", "model._target_=tests.helpers.user_models.tiny"
    )
    monkeypatch.delenv(TRUST_ENV, raising=False)
    assert Trust.of_this_process() == Trust.NOTHING
    with pytest.raises(ConfigError, match="allowed_targets"):
        validate(cfg)  # what a job saw before: no command line, and it vouched for itself
    parent = Trust.from_command_line(["-m", "allowed_targets=[tests.helpers]", "seed=1,2"][1:])
    monkeypatch.setenv(*next(iter(parent.environ().items())))
    inherited = Trust.of_this_process()
    assert inherited.grants_prefix("tests.helpers") and inherited.origin != parent.origin
    monkeypatch.setenv(TRUST_ENV, "not json")
    assert Trust.of_this_process() == Trust.NOTHING


def _sweep_args(*overrides):
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(["-m", *overrides])


def _check(args):
    from tfrecipe.cli.precheck import _check_hydra_configs

    _check_hydra_configs(args, Trust.from_command_line(args.overrides))


@pytest.mark.parametrize(
    "sweeper",
    [
        # Optuna's older spelling of `params`.
        {"search_space": {"allowed_targets": {"type": "categorical", "choices": ["[mypkg]"]}}},
        {"params": {"allowed_targets": "[mypkg]"}},
    ],
    ids=["search_space", "params"],
)
def test_optunas_every_spelling_is_checked_job_by_job(sweeper, tmp_path):
    recipe = tmp_path / "shared.yaml"
    node = {"defaults": [{"override /hydra/sweeper": "optuna"}], "hydra": {"sweeper": sweeper}}
    recipe.write_text("# @package _global_\n" + OmegaConf.to_yaml(node))
    from tfrecipe.config.compose import recipe_file_overrides

    with pytest.raises(ConfigError) as refused:
        _check(_sweep_args(*recipe_file_overrides([f"recipe={recipe}"]), *TINY))
    assert "'mypkg'" in str(refused.value) and "command line" in str(refused.value)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("+hydra.sweeper.ax_config.params.allowed_targets=[x]", "hydra.sweeper.ax_config"),
        ("hydra.sweeper._target_=hydra_plugins.other.Sweeper", "hydra.sweeper._target_"),
    ],
)
def test_what_a_sweeper_could_pass_unchecked_is_refused(override, named):
    with pytest.raises(ConfigError) as refused:
        _check(_sweep_args(override, "seed=1,2"))
    assert named in str(refused.value)


def test_validate_refuses_the_sweep_recipes_the_run_refuses(tmp_path):
    from tfrecipe.cli.commands import validate

    recipe = tmp_path / "shared.yaml"
    recipe.write_text(
        textwrap.dedent("""\
        # @package _global_
        hydra:
          mode: MULTIRUN
          sweeper:
            params:
              allowed_targets: "[mako]"
        """)
    )
    with pytest.raises(ConfigError, match="'mako'"):
        validate([str(recipe)])
