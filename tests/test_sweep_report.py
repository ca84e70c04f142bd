"""The end of a sweep on job dirs written by hand (summary.json, Hydra's overrides): sweep.json,
the table, sweep.png and `tfrecipe compare` name the best job and the command that reruns it; a
failed, preempted or unfinished job never wins; a resumed sweep keeps one file. No TensorFlow."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tfrecipe.cli import compare
from tfrecipe.cli.sweep_report import (
    SweepSetup,
    console_text,
    invocation,
    plan_from,
    read_report,
    write_report,
)

PNG = b"\x89PNG\r\n\x1a\n"


def _job(sweep: Path, number: int, overrides: list[str], status: str | None, **metrics) -> Path:
    run_dir = sweep / str(number)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if status is not None:
        summary = {
            "status": status,
            "metrics": metrics,
            "wall_time_s": 3.25 + number,
            "test": {"loss": 0.3, "accuracy": metrics.get("val_accuracy", 0.0)},
        }
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Five jobs: the two best by val_accuracy failed or were preempted, one never started."""
    sweep = tmp_path / "sweep"
    base = ["loop.epochs=2", "recipe=my recipe.yaml"]
    _job(
        sweep,
        0,
        [*base, "model=mlp", "optimizer.learning_rate=0.001"],
        "completed",
        val_accuracy=0.80,
        val_loss=0.5,
    )
    _job(
        sweep,
        1,
        [*base, "model=mlp", "optimizer.learning_rate=0.1"],
        "failed",
        val_accuracy=0.99,
        val_loss=0.1,
    )
    _job(
        sweep,
        2,
        [*base, "model=cnn", "optimizer.learning_rate=0.001"],
        "completed",
        val_accuracy=0.90,
        val_loss=0.7,
    )
    _job(
        sweep,
        3,
        [*base, "model=cnn", "optimizer.learning_rate=0.1"],
        "preempted",
        val_accuracy=0.95,
        val_loss=0.2,
    )
    _job(sweep, 4, [*base, "model=mlp", "optimizer.learning_rate=0.01"], None)
    return sweep


def _plan(sweep: Path, metric="val_accuracy", direction="max") -> SweepSetup:
    return SweepSetup(sweep, metric, direction, "task=classification's main metric")


def test_the_best_completed_job_wins_and_its_command_reruns_it(sweep):
    report = write_report(_plan(sweep), invocation=invocation(["-m", "x=1,2"], 0.0))

    assert [(j["job"], j["status"]) for j in report["jobs"]] == [
        (0, "completed"),
        (1, "failed"),
        (2, "completed"),
        (3, "preempted"),
        (4, "not started"),
    ]
    best = report["best"]
    assert best["job"] == 2 and best["val_accuracy"] == 0.90 and best["wall_time_s"] == 5.25
    assert report["varied"] == ["model", "optimizer.learning_rate"]
    assert report["counts"] == {"completed": 2, "failed": 1, "preempted": 1, "not started": 1}
    # The command is the job's own overrides, quoted for a shell: it reruns exactly this job.
    assert shlex.split(best["command"]) == [
        "python",
        "-m",
        "tfrecipe",
        "loop.epochs=2",
        "recipe=my recipe.yaml",
        "model=cnn",
        "optimizer.learning_rate=0.001",
    ]
    assert json.loads((sweep / "sweep.json").read_text()) == report
    assert (sweep / "sweep.png").read_bytes()[:8] == PNG

    lines = console_text(report).splitlines()
    assert lines[0] == "sweep: 5 jobs (2 completed, 1 failed, 1 preempted, 1 not started)"
    assert lines[1].split() == [
        "job",
        "model",
        "optimizer.learning_rate",
        "status",
        "val_accuracy",
        "test_accuracy",
        "wall_s",
    ]
    assert lines[2].split() == ["0", "mlp", "0.001", "completed", "0.8", "0.8", "3.2"]
    assert lines[3].split() == ["1", "mlp", "0.1", "failed", "0.99", "0.99", "4.2"]
    assert lines[4].split()[-1] == "*" and lines[4].startswith("2 ")
    assert lines[6].split() == ["4", "mlp", "0.01", "not", "started"]
    assert lines[7] == (
        "best: job 2 (model=cnn optimizer.learning_rate=0.001): val_accuracy=0.9 "
        "(max; task=classification's main metric)"
    )
    assert lines[8] == f"rerun: {best['command']}"


def test_a_metric_that_improves_downwards_picks_the_lowest(sweep):
    report = write_report(_plan(sweep, "val_loss", "min"), invocation={})
    assert report["best"]["job"] == 0  # 0.5 beats 0.7; the failed 0.1 and preempted 0.2 never win


def test_no_completed_job_means_no_winner(tmp_path):
    sweep = tmp_path / "sweep"
    _job(sweep, 0, ["model=mlp"], "failed", val_accuracy=0.9)
    report = write_report(_plan(sweep), invocation={})
    assert report["best"] is None
    assert "best: none (no completed job has val_accuracy)" in console_text(report)


def test_a_resumed_or_extended_sweep_keeps_one_file(sweep):
    """The same sweep dir run again (a preempted job resumed, more jobs added): one sweep.json
    with every job there and each invocation."""
    write_report(_plan(sweep), invocation={"argv": ["first"]})
    summary = json.loads((sweep / "3" / "summary.json").read_text())
    (sweep / "3" / "summary.json").write_text(json.dumps({**summary, "status": "completed"}))
    _job(sweep, 5, ["model=cnn", "optimizer.learning_rate=0.01"], "completed", val_accuracy=0.5)

    report = write_report(_plan(sweep), invocation={"argv": ["second"]})

    assert list(sweep.glob("sweep*.json")) == [sweep / "sweep.json"]
    assert [i["argv"] for i in report["invocations"]] == [["first"], ["second"]]
    assert len(report["jobs"]) == 6
    assert report["best"]["job"] == 3  # completed now: its 0.95 wins


def test_jobs_in_a_nested_sweep_subdir_are_found_and_nothing_inside_a_job_is_one(tmp_path):
    """hydra.sweep.subdir=runs/${hydra.job.num}: the jobs are SWEEP_DIR/runs/N. An ensemble's
    members inside a job and MLflow's copies of a run's files are no jobs."""
    sweep = tmp_path / "sweep"
    _job(sweep / "runs", 0, ["optimizer.learning_rate=0.1"], "completed", val_accuracy=0.7)
    first = _job(sweep / "runs", 1, ["optimizer.learning_rate=0.01"], "completed", val_accuracy=0.9)
    _job(first / "members", 0, ["seed=0"], "completed", val_accuracy=0.99)
    _job(
        sweep / "mlartifacts" / "1" / "abc" / "artifacts", 0, ["x=1"], "completed", val_accuracy=1.0
    )

    report = write_report(_plan(sweep), invocation={})

    assert [(j["job"], j["overrides"]) for j in report["jobs"]] == [
        (0, {"optimizer.learning_rate": "0.1"}),
        (1, {"optimizer.learning_rate": "0.01"}),
    ]
    assert report["best"]["run_dir"] == str(first.resolve())


def test_the_metric_comes_from_sweep_metric_the_optuna_objective_or_the_task():
    def plan(**config):
        return plan_from(OmegaConf.create(config), Path("s"), command=["tfrecipe"], run_mode=False)

    named = plan(sweep={"metric": "test_mae", "objective": "val_loss"})
    assert (named.metric, named.direction, named.chosen_by) == ("test_mae", "min", "sweep.metric")
    optuna = plan(
        sweep={"metric": None, "objective": "val_accuracy"},
        hydra={
            "sweeper": {
                "_target_": "hydra_plugins.tfrecipe_optuna_sweeper.optuna_sweeper.OptunaSweeper",
                "direction": "maximize",
            }
        },
    )
    assert (optuna.metric, optuna.direction) == ("val_accuracy", "max")
    regression = plan(task={"name": "regression"}, sweep={"metric": None})
    assert (regression.metric, regression.direction) == ("val_mae", "min")
    binary = plan(task={"name": "binary"})
    assert (binary.metric, binary.direction) == ("val_auc", "max")
    # the throughput tracking.md names as a sweep.metric: the fastest job wins, not the slowest
    fastest = plan(sweep={"metric": "examples_per_sec"})
    assert (fastest.metric, fastest.direction) == ("examples_per_sec", "max")
    assert plan(sweep={"metric": "wall_time_s"}).direction == "min"


def test_compare_reads_sweep_json(sweep, capsys):
    report = write_report(_plan(sweep), invocation={})
    compare.main([str(sweep)])  # no --sort: the sweep's metric
    out = capsys.readouterr().out
    assert "sorted by val_accuracy" in out
    assert f"sweep {sweep}: best job 2 (val_accuracy=0.9, max; * in the table)" in out
    assert f"rerun: {report['best']['command']}" in out
    rows = (sweep / "compare.csv").read_text().splitlines()
    assert rows[1].startswith("1,") and rows[3].startswith("2 *,")  # failed 0.99 first, unmarked
    assert read_report(sweep / "0") is None  # a job dir is no sweep


def test_compare_marks_the_best_job_of_a_sweep_dir_copied_from_where_it_ran(sweep, tmp_path):
    """A sweep dir fetched from a cluster: its sweep.json names the run dirs where they ran."""
    import shutil

    write_report(_plan(sweep), invocation={})
    copy = shutil.copytree(sweep, tmp_path / "fetched" / "sweep")
    compare.main([str(copy)])
    rows = (copy / "compare.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["1", "3", "2 *", "0"]


def test_the_compare_legend_fits_the_figure_however_long_the_labels(tmp_path):
    """Labels longer than the figure is wide (a list override) are wrapped, never cut."""
    import matplotlib

    matplotlib.use("Agg")
    for number in range(4):
        units = ",".join(["512"] * (8 + 12 * number))
        run_dir = _job(
            tmp_path,
            number,
            [f"model.hidden_units=[{units}]"],
            "completed",
            val_loss=0.5,
            val_accuracy=0.5,
        )
        (run_dir / "history.csv").write_text("epoch,val_loss,val_accuracy\n1,0.6,0.4\n2,0.5,0.5\n")
    runs = compare.find_runs([tmp_path])
    fig = compare.curves_figure(runs, compare.differing_keys(runs))
    fig.canvas.draw()
    (legend,) = fig.legends
    box, page = legend.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0, (box, page)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent())
    assert any("\n" in text.get_text() for text in legend.get_texts())  # the longest wrapped
