"""`tfrecipe compare` on run dirs written by hand (summary.json, history.csv, Hydra's overrides):
the table shows every override value, and compare.png gives each run one colour, a panel per
task metric and a legend that covers no curve; nothing is warned. No TensorFlow needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tfrecipe.cli.compare import curves_figure, differing_keys, find_runs

# Three runs of three tasks; the binary one stopped after one epoch.
RUNS = {
    "0": (["task=classification", "dataset.features=[district,kind]"], "accuracy", 3),
    "1": (["task=regression", "dataset.features=[age,income]"], "mae", 3),
    "2": (["task=binary", "dataset.features=[a]"], "auc", 1),
}


def _write_run(run_dir: Path, overrides: list[str], metric: str, epochs: int) -> None:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    final = {"loss": 0.5, metric: 0.8, "val_loss": 0.6, f"val_{metric}": 0.7}
    summary = {"status": "completed", "metrics": final, "test": {"loss": 0.6, metric: 0.7}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    rows = [f"{e},{1 - e / 10},{e / 10},{1.1 - e / 10},{e / 10 - 0.1}" for e in range(epochs)]
    header = f"epoch,loss,{metric},val_loss,val_{metric}"
    (run_dir / "history.csv").write_text("\n".join([header, *rows]) + "\n")


@pytest.fixture
def sweep(tmp_path) -> Path:
    for name, (overrides, metric, epochs) in RUNS.items():
        _write_run(tmp_path / "sweep" / name, overrides, metric, epochs)
    return tmp_path / "sweep"


def test_the_table_shows_list_values_and_nothing_is_warned(sweep):
    """`[district,kind]` is a value, not rich markup: it shows as written. Python's development
    mode shows every warning (an unclosed file, matplotlib's slow `loc="best"`): none."""
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "always", "-m", "tfrecipe", "compare", str(sweep)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == ""
    for value in ("[district,kind]", "[age,income]", "[a]"):
        assert value in result.stdout
    assert "[district,kind]" in (sweep / "compare.csv").read_text()


def test_each_run_has_one_colour_and_the_legend_covers_no_panel(sweep):
    import matplotlib

    matplotlib.use("Agg")
    runs = find_runs([sweep])
    fig = curves_figure(runs, differing_keys(runs))
    fig.canvas.draw()
    # val_loss of each task (a regression's loss is no classification's scale), then each
    # task's own metric, each in a panel of its own.
    assert [ax.get_title() for ax in fig.axes] == [
        "val_loss (runs logging val_accuracy)",
        "val_loss (runs logging val_mae)",
        "val_loss (runs logging val_auc)",
        "val_accuracy",
        "val_mae",
        "val_auc",
    ]
    # One line per run and panel where the run has the metric, in the run's one colour.
    assert [len(ax.lines) for ax in fig.axes] == [1, 1, 1, 1, 1, 1]
    by_run = {}
    for ax in fig.axes:
        for line in ax.lines:
            by_run.setdefault(ax.get_title().split(" ")[-1].rstrip(")"), []).append(
                line.get_color()
            )
    classification, regression, binary = (
        by_run["val_accuracy"],
        by_run["val_mae"],
        by_run["val_auc"],
    )
    assert classification[0] == classification[1]
    assert regression[0] == regression[1] and binary[0] == binary[1]
    assert len({classification[0], regression[0], binary[0]}) == 3
    # One legend, for the figure, naming each run once, below every panel.
    assert not any(ax.get_legend() for ax in fig.axes)
    (legend,) = fig.legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == [
        "dataset.features=[district,kind] task=classification",
        "dataset.features=[age,income] task=regression",
        "dataset.features=[a] task=binary",
    ]
    box = legend.get_window_extent()
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent()), ax.get_title()


@pytest.mark.parametrize("out", ["a_file", "a_file/below"])
def test_an_out_that_is_no_directory_is_one_line(sweep, tmp_path, out):
    """`--out` names a file (or a path under one): exit 2, one line naming it; no traceback."""
    (tmp_path / "a_file").write_text("mine\n")
    result = subprocess.run(
        [sys.executable, "-m", "tfrecipe", "compare", str(sweep), "--out", str(tmp_path / out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stdout == ""  # refused before the table
    (line,) = result.stderr.splitlines()
    assert f"compare --out={tmp_path / out}: " in line, line
    assert (tmp_path / "a_file").read_text() == "mine\n"


def test_an_ensembles_members_are_part_of_its_run_not_runs_of_their_own(sweep, tmp_path):
    """docs/baselines.md: compare reads an ensemble's run dir as a single run's. Its members
    (RUN_DIR/members/I, each with a summary.json) were rows of their own, sorted among the
    sweep's jobs, their empty overrides shown as differing from every job's."""
    for index in (0, 1):
        _write_run(sweep / "0" / "members" / str(index), [], "accuracy", 3)
    runs = find_runs([sweep])
    assert [run.path.name for run in runs] == ["0", "1", "2"]
    assert differing_keys(runs) == ["dataset.features", "task"]
    assert len(find_runs([sweep / "0" / "members"])) == 2  # asked for: the members are runs
    assert len(find_runs([sweep / "0"])) == 1
