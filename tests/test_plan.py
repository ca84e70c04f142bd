"""`RunPlan` (tfrecipe/config/plan.py): what a run decides from its config, once, before
TensorFlow: the loop, backups and rollbacks, hook intervals, steps per call, precision."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.configs import validate

from tfrecipe.config.plan import RunPlan


def _plan(compose_cfg, *overrides: str) -> RunPlan:
    return RunPlan.from_config(validate(compose_cfg(*overrides)))


def test_the_plan_is_made_without_tensorflow():
    script = (
        "import sys\n"
        "from tfrecipe.config.compose import compose\n"
        "from tfrecipe.config import schema\n"
        "from tfrecipe.config.trust import Trust\n"
        "from tfrecipe.config.plan import RunPlan\n"
        "run = schema.validate(compose(['loop=custom', 'logger=none']), trust=Trust.from_command_line([]))\n"
        "plan = RunPlan.from_config(run)\n"
        "print(plan.loop, plan.steps_per_call(num_params=1, replicas=1, steps_per_epoch=8))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["custom 8", "[]"]  # no call runs past its epoch


@pytest.mark.parametrize(
    ("overrides", "loop", "in_cluster"),
    [
        ((), "fit", False),
        (("loop=custom",), "custom", False),
        (("strategy=multi_worker_mirrored", "cluster=tf_config"), "fit", True),
        (
            ("strategy=parameter_server", "loop=custom", "cluster=tf_config"),
            "parameter_server",
            True,
        ),
    ],
)
def test_the_plan_picks_the_loop_and_says_whether_the_run_is_in_a_cluster(
    compose_cfg, overrides, loop, in_cluster
):
    plan = _plan(compose_cfg, *overrides)
    assert (plan.loop, plan.in_cluster) == (loop, in_cluster)
    assert plan.parameter_servers == (loop == "parameter_server")


def test_auto_precision_is_float32_on_a_cluster_and_kept_on_one_process(compose_cfg):
    assert _plan(compose_cfg, "precision=auto").precision == "auto"
    clustered = ("precision=auto", "strategy=multi_worker_mirrored", "cluster=tf_config")
    assert _plan(compose_cfg, *clustered).precision == "float32"
    assert _plan(compose_cfg, "precision=mixed_bfloat16").precision == "mixed_bfloat16"


@pytest.mark.parametrize(
    ("overrides", "periodic", "backup_interval_kept"),
    [
        ((), False, False),  # one process, no rollbacks: a backup on preemption only
        (("strategy=multi_worker_mirrored", "cluster=tf_config"), True, True),
        (("callbacks.terminate_on_nan.max_rollbacks=2",), True, True),
        (("callbacks.backup.enabled=true",), True, True),
        (
            (
                "strategy=multi_worker_mirrored",
                "cluster=tf_config",
                "callbacks.backup.enabled=false",
            ),
            False,
            False,
        ),
    ],
)
def test_one_rule_decides_periodic_backups_and_the_steps_they_keep(
    compose_cfg, overrides, periodic, backup_interval_kept
):
    plan = _plan(compose_cfg, "callbacks.backup.every_n_steps=7", *overrides)
    assert plan.periodic_backups == periodic
    assert (7 in plan.hook_intervals) == backup_interval_kept
    if periodic:  # a call of several steps ends on each backup's step
        assert plan.steps_per_call(num_params=1, replicas=1, steps_per_epoch=14) in (1, 7)


def test_a_fresh_run_that_rolls_back_backs_up_its_first_step(compose_cfg):
    plan = _plan(compose_cfg, "callbacks.terminate_on_nan.max_rollbacks=2")
    assert plan.max_rollbacks == 2
    assert plan.save_at_start(resumed=False) and not plan.save_at_start(resumed=True)
    assert not _plan(compose_cfg).save_at_start(resumed=False)


def test_profiled_and_parameter_server_runs_take_one_step_per_call(compose_cfg):
    numbers = {"num_params": 1, "replicas": 1, "steps_per_epoch": 8}
    assert _plan(compose_cfg, "logger=none").steps_per_call(**numbers) == 8
    profiled = _plan(compose_cfg, "logger=tensorboard", "logger.tensorboard.profile_batch=2")
    assert profiled.one_step_per_call and profiled.steps_per_call(**numbers) == 1
    # the custom loop takes only its profiler window one step per call (StepProfiler)
    custom = _plan(
        compose_cfg, "loop=custom", "logger=tensorboard", "logger.tensorboard.profile_batch=2"
    )
    assert custom.one_step_per_call is None and custom.steps_per_call(**numbers) == 8
    fixed = _plan(compose_cfg, "batching.steps_per_execution=4")
    assert fixed.steps_per_call(**numbers) == 4
    assert (
        fixed.steps_per_execution(4) == 4
        and _plan(compose_cfg, "loop=custom").steps_per_execution(4) is None
    )


def test_validate_prints_the_plan(capsys):
    from tfrecipe.cli.commands import validate as validate_command

    validate_command(["callbacks.terminate_on_nan.max_rollbacks=1", "loop=custom"])
    out = capsys.readouterr().out
    plan = out[out.index("plan:") :].splitlines()
    assert plan[0] == "plan:"
    assert plan[1] == "  loop: custom (one process)"
    assert "backups: every 100 steps; rollbacks on NaN/Inf: up to 1" in plan[3]


def test_auto_precision_picks_bfloat16_on_a_cpu_only_where_it_pays(compose_cfg):
    """Measured on the AVX512_BF16 EPYC: convolutions gain, an MLP's casts cost more than its
    small matmuls save (docs/benchmarks.md). A GPU or TPU decides by itself."""
    from tfrecipe.precision import resolve_policy

    cnn, mlp = (
        _plan(compose_cfg, "precision=auto"),
        _plan(compose_cfg, "precision=auto", "model=mlp"),
    )
    assert cnn.cpu_bfloat16_pays and not mlp.cpu_bfloat16_pays
    assert "float32 for this model" in "\n".join(mlp.lines())
    assert resolve_policy("auto", {"CPU"}, cpu_bfloat16_pays=False) == "float32"
    assert resolve_policy("auto", {"GPU"}, cpu_bfloat16_pays=False) == "mixed_bfloat16"
    assert resolve_policy("mixed_bfloat16", {"CPU"}, cpu_bfloat16_pays=False) == "mixed_bfloat16"


def test_the_plan_names_the_hooks_that_keep_an_auto_call_short(compose_cfg):
    """20-step epochs under 10-step rows: calls of 10, and the perf line names why; under the
    default 50-step rows, one call per epoch. An 8-step epoch is one call: its rows come at the
    first call end past each 10 steps (tests/test_custom_loop.py), so the log no longer cuts its
    calls to 2."""
    numbers = {"num_params": 1, "replicas": 1}
    default = _plan(compose_cfg)
    assert default.hook_keys == ("logger.csv.every_n_steps",) and default.hook_intervals == (50,)
    assert default.steps_per_call(steps_per_epoch=20, **numbers) == 20
    assert default.call_bounds(20) == ()
    plan = _plan(compose_cfg, "logger.csv.every_n_steps=10")
    assert plan.steps_per_call(steps_per_epoch=20, **numbers) == 10
    assert plan.call_bounds(20) == ("logger.csv.every_n_steps=10",)
    assert plan.steps_per_call(steps_per_epoch=8, **numbers) == 8
    assert plan.call_bounds(8) == () and plan.call_bounds(5) == ()
    assert _plan(compose_cfg, "batching.steps_per_execution=4").call_bounds(20) == ()
