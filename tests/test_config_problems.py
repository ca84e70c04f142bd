"""Config problems as data (key, received value, hint): the line a user reads names the key they
set, each slot's problem is reported once, and checking a target twice gives the same answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.configs import validate
from tfrecipe.cli import commands
from tfrecipe.config.grants import Grants
from tfrecipe.config.instantiate import iter_targets
from tfrecipe.errors import ConfigError, Problem


def _problems(compose_cfg, *overrides: str) -> list[Problem]:
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(*overrides))
    return error.value.problems


def test_a_problem_reads_key_value_then_hint():
    assert str(Problem("loop.epochs", 0, "input should be greater than 0")) == (
        "loop.epochs=0: input should be greater than 0"
    )
    assert str(Problem("loop.epochs", hint="required value is missing")) == (
        "loop.epochs: required value is missing"
    )
    assert str(Problem("model._target_", "x.y", "expected ...")).startswith("model._target_=x.y: ")
    assert ConfigError("written as a whole").messages == ["written as a whole"]


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "strategy.intra_op_threads=many",
            "strategy.intra_op_threads=many: input should be 'auto' or a valid integer",
        ),
        (
            "strategy.graph_optimizer=sometimes",
            "strategy.graph_optimizer=sometimes: input should be 'auto' or a valid boolean",
        ),
        (
            "batching.steps_per_execution=0",
            "batching.steps_per_execution=0: input should be greater than 0 or 'auto'",
        ),
        (
            "pipeline.num_parallel_calls=-3",
            "pipeline.num_parallel_calls=-3: input should be 'autotune' or greater than 0",
        ),
    ],
)
def test_a_value_no_member_of_a_union_takes_is_one_line_naming_each(compose_cfg, override, line):
    # pydantic reports each member it tried, at a location ending in the member's name
    # ("constrained-int"): the user set one key, and reads one line naming what it takes.
    [problem] = _problems(compose_cfg, override)
    assert str(problem) == line


def test_allowed_targets_is_named_as_the_user_wrote_it(compose_cfg):
    [problem] = _problems(compose_cfg, "allowed_targets=5")
    assert (problem.key, problem.received) == ("allowed_targets", 5)
    assert str(problem).startswith("allowed_targets=5: input should be a valid list"), problem


def test_a_missing_target_is_named_target(compose_cfg):
    [problem] = _problems(compose_cfg, "~model._target_")
    assert str(problem) == "model._target_: required value is missing (set model._target_=...)"


def test_a_target_of_the_wrong_type_is_one_problem(compose_cfg):
    # The schema's type error and the allow-list's path check are about one slot: one line.
    [problem] = _problems(compose_cfg, "model._target_=5")
    assert (problem.key, problem.received) == ("model._target_", 5)


def test_a_refused_target_carries_its_slot_and_value(compose_cfg):
    [problem] = _problems(compose_cfg, "+callbacks.extra.x._target_=keras.utils.get_file")
    assert problem.key == "callbacks.extra.x._target_" and problem.slot == "callbacks.extra.x"
    assert problem.received == "keras.utils.get_file"
    assert "a keras.callbacks.Callback subclass" in problem.hint


def test_validating_one_class_twice_gives_the_same_answer(capsys):
    # The source of a class is parsed once and cached; checking its __init__ must not change it.
    right = [
        "+callbacks.extra.stop._target_=keras.callbacks.EarlyStopping",
        "+callbacks.extra.stop.monitor=loss",
    ]
    wrong = [*right, "+callbacks.extra.stop.nope=1"]
    for _ in range(2):
        commands.validate(right)
        assert capsys.readouterr().out.startswith("valid:")
        with pytest.raises(ConfigError) as error:
            commands.validate(wrong)
        assert error.value.messages == [
            "callbacks.extra.stop: keras.callbacks.EarlyStopping unexpected argument 'nope'"
        ]


def test_iter_targets_finds_every_target_with_its_slot():
    config = {
        "model": {"_target_": "a.b", "units": 3},
        "callbacks": {"extra": {"x": {"_target_": "c.D"}}},
        "nested": [{"deeper": {"_target_": "e.f"}}],
        "seed": 0,
    }
    found = [(key, target) for key, target, _ in iter_targets(config)]
    assert found == [("model", "a.b"), ("callbacks.extra.x", "c.D"), ("nested.0.deeper", "e.f")]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("tfrecipe.data.digits", "tfrecipe.data.bundled.digits"),
        ("tfrecipe.datasets.npz.load", "tfrecipe.data.npz.load"),
    ],
)
def test_a_saved_config_with_a_target_from_before_the_packages_names_the_new_path(
    compose_cfg, old, new
):
    """Dataset builders moved when tfrecipe grouped its modules by concern: an old run's
    config.yaml (tfrecipe evaluate) or a user's copy says where the target lives now."""
    [problem] = _problems(compose_cfg, f"dataset._target_={old}")
    assert (
        str(problem) == f"dataset._target_={old}: tfrecipe moved it to {new!r}; update your config"
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["task.class_weight={0: inf}"], "task.class_weight={0: inf}: expected null, balanced"),
        (["model.freeze=.*"], "model.freeze='.*': matches every layer name, so nothing would"),
        (["model.freeze='^|conv'"], "model.freeze='^|conv': matches every layer name"),
        (
            ["+task.metrics=[{_target_: keras.metrics.MeanSquaredError, name: val_loss}]"],
            "task.metrics.0._target_=keras.metrics.MeanSquaredError: would be reported as 'val_loss'; "
            "val_",
        ),
        (
            ["logger=[mlflow]", "logger.mlflow.experiment=''"],
            "logger.mlflow.experiment='': string should have at least 1 character",
        ),
    ],
    ids=[
        "infinite class weight",
        "freeze everything",
        "freeze everything too",
        "val_ metric",
        "an MLflow experiment with no name",  # MLflow refused it, the run logged nothing there
    ],
)
def test_settings_that_would_fail_late_are_refused_by_the_config_check(
    compose_cfg, overrides, expected
):
    [problem] = _problems(compose_cfg, *overrides)
    assert str(problem).startswith(expected), problem


def test_a_freeze_pattern_that_happens_to_match_every_layer_is_refused_when_built(compose_cfg):
    """What a pattern matches is known once the model is built: before anything trains."""
    from tfrecipe.models.build import build_model
    from tfrecipe.training.dataset import load_splits

    run = validate(
        compose_cfg("model=mlp", "model.freeze=dense|logits", "model.freeze_random=true")
    )
    splits = load_splits(run.dataset, grants=Grants())
    with pytest.raises(ConfigError, match=r"freezes all 3 layers that have weights"):
        build_model(run.model, splits, task=run.task, grants=Grants())


def test_tfrecipes_builders_are_allowed_by_the_mark_where_they_are_defined(compose_cfg):
    """Every model and dataset YAML names a marked builder; a public function of the same modules
    without the mark is refused, so a new dataset is its module, its YAML and `@config_target`."""
    from tfrecipe.config.instantiate import DATASET, MODEL

    conf = Path(__file__).resolve().parents[1] / "conf"
    for group, kind in (("model", MODEL), ("dataset", DATASET)):
        for yaml in sorted((conf / group).glob("*.yaml")):
            target = OmegaConf.load(yaml).get("_target_")
            assert target in kind.builders, (yaml.name, target, kind.builders)
    assert "tfrecipe.models.mlp" in MODEL.builders  # by the package's name, not builders.mlp
    [problem] = _problems(compose_cfg, "dataset._target_=tfrecipe.data.bundled.human_bytes")
    assert (problem.key, problem.received) == (
        "dataset._target_",
        "tfrecipe.data.bundled.human_bytes",
    )
    assert "tfrecipe.data.tabular.parquet" in problem.hint  # the allowed ones are listed
