"""A sweep's mistakes are found before its first job: `tfrecipe validate -m ...` and the sweep's
own pre-check refuse them in one line each (exit code 2), with nothing written. No training."""

from __future__ import annotations

import pytest


def test_validate_checks_a_sweep_typed_on_the_command_line(capsys):
    """`validate -m model=mlp,cnn` composed the sweep as one run's config, which Hydra refuses
    ("Ambiguous value for argument 'model=mlp,cnn'"): no sweep typed on a command line could
    be validated, only one a recipe's `hydra.sweeper.params` holds."""
    from tfrecipe.cli.commands import validate

    validate(["-m", "model=mlp,cnn", "optimizer.learning_rate=0.001,0.01"])
    assert capsys.readouterr().out.startswith("valid: -m model=mlp,cnn")
    validate(["-m", "hydra/sweeper=optuna", "optimizer.learning_rate=interval(0.001,0.1)"])
    validate(["sweep_lr_batch", "-m", "seed=1,2"])
    _refused(["validate", "-m", "model=mlp,nosuch"], capsys, "model=nosuch: unknown option")


def _one_line(result) -> str:
    """The command's one line on stderr: exit code 2, no traceback."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    return line


def _refused(argv: list[str], capsys, words: str) -> str:
    """The command's one line (exit code 2, no traceback), which holds `words`."""
    from tfrecipe.cli.main import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and words in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("space", "words"),
    [
        ("tag(log,interval(0,1.0))", "a log scale needs low > 0"),
        ("interval(1.0,0.1)", "expected low <= high"),
        ("tag(lgo,interval(1e-5,1.0))", "unknown tag lgo"),
    ],
)
def test_a_bad_interval_is_one_line_before_the_study_starts(cli, tmp_path, capsys, space, words):
    """Optuna's ValueError came as a traceback (exit code 1) after the sweep dir and its study
    were made; an unknown tag (a typo of log) was ignored: the study sampled on a linear scale."""
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/sweeper=optuna", f"optimizer.learning_rate={space}"]
    line = _one_line(cli(*args, f"hydra.sweep.dir={sweep}"))
    assert line.startswith(f"tfrecipe: invalid configuration: optimizer.learning_rate='{space}': ")
    assert words in line, line
    assert not sweep.exists()
    _refused(["validate", *args], capsys, words)


@pytest.mark.parametrize(
    ("mistake", "words"),
    [
        ("loop.epochs=-1", "loop.epochs=-1: "),
        ("sweep.objective=val_nosuch", "sweep.objective=val_nosuch: task=classification does"),
    ],
)
def test_a_mistake_every_job_shares_stops_the_sweep_before_its_first_job(
    cli, tmp_path, capsys, mistake, words
):
    """Each job found it itself: the sweep imported TensorFlow, failed every job one after
    another and exited 1 with a failed summary.json per job, where the same mistake in a single
    run is one line and exit code 2. (A mistake only some jobs make still fails just those:
    test_commands.py::test_a_failing_sweep_job_does_not_stop_the_others.)"""
    sweep = tmp_path / "sweep"
    args = ["-m", "model=mlp", "seed=1,2", mistake]
    line = _one_line(cli(*args, "loop.verbose=0", f"hydra.sweep.dir={sweep}"))
    assert words in line, line
    assert not sweep.exists()
    _refused(["validate", *args], capsys, words)


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        (
            ["hydra/sweeper/pruner=percentile", "hydra.sweeper.pruner.percentile=150"],
            "hydra.sweeper.pruner.percentile=150.0: Optuna's PercentilePruner refuses it: "
            "Percentile must be between 0 and 100",
        ),
        (
            ["hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_warmup_steps=-3"],
            "hydra.sweeper.pruner.n_warmup_steps=-3: Optuna's MedianPruner refuses it",
        ),
        (["hydra.sweeper.storage=foo:///x.db"], "hydra.sweeper.storage=foo:///x.db: cannot open"),
    ],
)
def test_optunas_refusal_of_a_pruner_or_storage_is_one_line(cli, tmp_path, setting, words):
    """Optuna's (or SQLAlchemy's) error came as a traceback with exit code 1."""
    result = cli(
        "-m",
        "hydra/sweeper=optuna",
        "optimizer.learning_rate=interval(0.001,0.1)",
        *setting,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    line = _one_line(result)
    assert words in line, line


def test_an_interval_over_a_key_the_config_lacks_is_refused_before_the_study(cli, tmp_path):
    """The pre-check left an interval's key out of every job: a misspelt key became a study,
    a trial that failed in its job (after TensorFlow loaded) and a sweep dir."""
    sweep = tmp_path / "sweep"
    result = cli(
        "-m",
        "hydra/sweeper=optuna",
        "optimizer.learning_rat=tag(log,interval(0.0001,0.1))",
        f"hydra.sweep.dir={sweep}",
    )
    line = _one_line(result)
    assert "optimizer.learning_rat" in line and "unknown key" in line, line
    assert not sweep.exists()
