"""`tfrecipe validate` finds what a newcomer's first runs hit, all at once and before TensorFlow:
a builder argument of the wrong type (typed from the builder's signature), every unknown key and
group option (each on its line), and several fit steps per call under a mirrored strategy
(issue 49: items 1-3)."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from tests.helpers.configs import validate
from tfrecipe.config import argument_types
from tfrecipe.config.instantiate import iter_targets
from tfrecipe.config.plan import RunPlan
from tfrecipe.errors import ConfigError
from tfrecipe.perf import report


def _validate_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tfrecipe", "validate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _lines(compose_cfg, *overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(*overrides))
    return error.value.messages


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ("model=mlp", "model.hidden_units=512"),
            "model.hidden_units=512: tfrecipe.models.mlp takes hidden_units: Sequence[int]; a "
            "list, e.g. model.hidden_units=[512]",
        ),
        (
            ("model.filters=32",),
            "model.filters=32: tfrecipe.models.cnn takes filters: Sequence[int]; a list, e.g. "
            "model.filters=[32]",
        ),
        (
            ("model=mlp", "model.hidden_units=[a,b]"),
            "model.hidden_units=['a', 'b']: tfrecipe.models.mlp takes hidden_units: Sequence[int]",
        ),
        (
            ("model.dense_units=1.5",),
            "model.dense_units=1.5: tfrecipe.models.cnn takes dense_units: int",
        ),
        (
            ("dataset=csv", "dataset.path=x.csv", "dataset.label=y", "dataset.stream=maybe"),
            "dataset.stream=maybe: tfrecipe.data.tabular.csv takes stream: Literal['auto'] | bool",
        ),
    ],
)
def test_a_builder_argument_of_the_wrong_type_is_refused_naming_the_key(
    compose_cfg, overrides, line
):
    assert _lines(compose_cfg, *overrides) == [line]


def test_every_builder_argument_is_typed_from_its_signature_and_the_defaults_pass(compose_cfg):
    """Each shipped model and dataset option's defaults fit their builder's types, and each
    builder declares a type for every argument its YAML sets: nothing slips through untyped."""
    from tfrecipe.config import compose
    from tfrecipe.config.schema import MODEL_OPTIONS  # tfrecipe applies them, the schema types them
    from tfrecipe.config.targets import annotations_of

    groups = compose.config_dir()
    for group in ("model", "dataset"):
        for option in sorted(p.stem for p in (groups / group).glob("*.yaml")):
            cfg = compose.compose([f"{group}={option}"])
            container = {group: OmegaConf.to_container(cfg[group], resolve=True)}
            for key, target, node in iter_targets(container):
                assert argument_types.argument_type_problems([(key, target, node)]) == []
                _, annotated = annotations_of(target)
                untyped = set(node) - set(annotated) - {"_target_", *MODEL_OPTIONS}
                assert not untyped, f"{group}={option}: {target} does not type {untyped}"


def test_types_read_from_source_accept_and_refuse_as_python_would():
    import ast

    def accepts(annotation: str, value) -> bool:
        return argument_types._accepts(ast.parse(annotation, mode="eval").body, value, None, 0)

    assert accepts("int", 3) and not accepts("int", True) and not accepts("int", 1.5)
    assert accepts("float", 3) and not accepts("float", "3")
    assert accepts("str | None", None) and not accepts("str | None", 1)
    assert accepts("Sequence[int]", [1, 2]) and not accepts("Sequence[int]", 1)
    assert not accepts("Sequence[str]", "abc")  # a single string is not a list of them
    assert accepts("tuple[int, ...]", [1, 2, 3]) and not accepts("tuple[int, int]", [1, 2, 3])
    assert accepts("Mapping[str, float]", {"a": 1.0}) and not accepts("Mapping[str, float]", [1])
    assert accepts("Optional[Literal['a', 'b']]", None) and not accepts("Literal['a']", "c")
    assert accepts("SomeClass", object())  # what cannot be read is the builder's to check


def test_validate_refuses_a_list_key_given_one_value_in_under_a_second():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = _validate_cli("model=mlp", "model.hidden_units=512")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "tfrecipe: invalid configuration: model.hidden_units=512: tfrecipe.models.mlp takes "
        "hidden_units: Sequence[int]; a list, e.g. model.hidden_units=[512]"
    )
    assert "Traceback" not in result.stderr
    # CPU seconds, which a loaded machine does not stretch as it does wall time: ≈0.9 s
    # measured (a second on a quiet machine); importing TensorFlow alone costs ≈4 s
    assert cpu < 2.5, cpu


def test_validate_reports_every_unknown_key_and_option_each_on_its_line():
    result = _validate_cli(
        "loop=nope",
        "optimizer=zz",
        "foo=1",
        "model.bogus=3",
        "bar.x=1",
        "loop.epochs=0",
        "model.filters=32",
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "tfrecipe: invalid configuration (7 problems):"
    assert lines[1:] == [
        "  - loop=nope: unknown option for group 'loop'; available: custom, fit",
        "  - optimizer=zz: unknown option for group 'optimizer'; available: adam, adamw, sgd",
        "  - foo: unknown key (received foo=1); to add a new key use +foo=...",
        "  - model.bogus: unknown key (received model.bogus=3); to add a new key use +model.bogus=...",
        "  - bar.x: unknown key (received bar.x=1); to add a new key use +bar.x=...",
        "  - loop.epochs=0: input should be greater than 0",
        "  - model.filters=32: tfrecipe.models.cnn takes filters: Sequence[int]; a list, e.g. "
        "model.filters=[32]",
    ]


def test_a_run_reports_every_unknown_key_before_anything_starts(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tfrecipe", "foo=1", "model.zz=3", f"hydra.run.dir={tmp_path}/r"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "tfrecipe: invalid configuration (2 problems):",
        "  - foo: unknown key (received foo=1); to add a new key use +foo=...",
        "  - model.zz: unknown key (received model.zz=3); to add a new key use +model.zz=...",
    ]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker_mirrored"])
def test_fit_steps_per_call_under_a_mirrored_strategy_is_refused_naming_the_custom_loop(
    compose_cfg, strategy
):
    cluster = ["cluster=tf_config"] if strategy == "multi_worker_mirrored" else []
    lines = _lines(compose_cfg, f"strategy={strategy}", *cluster, "batching.steps_per_execution=10")
    assert lines == [
        f"batching.steps_per_execution=10: Keras' fit fails running several steps per call under "
        f"strategy={strategy}; use loop=custom loop.steps_per_loop=10 (it runs 10 steps per call "
        "there), or batching.steps_per_execution=auto"
    ]
    # what the line names is valid
    validate(compose_cfg(f"strategy={strategy}", *cluster, "loop=custom", "loop.steps_per_loop=10"))
    validate(compose_cfg("strategy=central_storage", "batching.steps_per_execution=10"))


def test_the_diagnosis_names_a_steps_setting_the_plan_accepts(compose_cfg):
    """Under fit across replicas the remedy is the custom loop's steps per call, which validate
    accepts; parameter servers run one step per closure and get no steps remedy at all."""
    fit = RunPlan.from_config(validate(compose_cfg("strategy=mirrored")))
    assert fit.steps_key(replicas=2) == "loop=custom loop.steps_per_loop"
    assert fit.steps_key(replicas=1) == "batching.steps_per_execution"
    knobs = report.Knobs(steps_per_call=1, steps_per_epoch=10, steps_key=fit.steps_key(2))
    line = report.diagnosis(0.5, knobs)
    assert "more steps per call (loop=custom loop.steps_per_loop: 1 of the epoch's 10)" in line
    assert "batching.steps_per_execution" not in line
    ps = RunPlan.from_config(
        validate(compose_cfg("strategy=parameter_server", "loop=custom", "cluster=tf_config"))
    )
    assert ps.steps_key(replicas=2) is None
    quiet = report.diagnosis(
        0.5, report.Knobs(steps_per_call=1, steps_per_epoch=10, steps_key=None)
    )
    assert "steps per call" not in quiet
