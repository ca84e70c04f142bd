"""The README's three-minute tour, run as written: its commands are read from README.md, made tiny
(TINY's overrides appended) and run in order in a fresh directory, each one's output checked the
way the README describes it. A tour command that stops working, or a README that stops showing
one, fails here."""

from __future__ import annotations

import csv
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import REPO, TINY

README = REPO / "README.md"


def _tour() -> str:
    text = README.read_text()
    return text.split("## A three-minute tour", 1)[1].split("\n## ", 1)[0]


def _commands(section: str) -> list[list[str]]:
    """Each `python -m tfrecipe ...` / `tfrecipe ...` line of the section's code blocks (a `$ `
    prompt dropped, continuation lines joined, comments cut), as arguments after `tfrecipe`."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", section, re.S | re.M)
    commands = []
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        line = line.removeprefix("$ ").strip()
        for prefix in ("python -m tfrecipe ", "tfrecipe "):
            if line.startswith(prefix):
                commands.append(shlex.split(line[len(prefix) :], comments=True))
    return commands


def _ok(result) -> None:
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(cli, tmp_path):
    one_run, sweep, compare, train_table, predict = _commands(_tour())
    data = tmp_path / "tests" / "data"
    data.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "data" / "customers.csv", data)

    # One run: its run dir holds the files the README names, and the last line says how it ended.
    _ok(result := cli(*one_run, *TINY))
    run_dir = tmp_path / "outputs" / "tour"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert {"config.yaml", "history.csv", "model.keras"} <= {p.name for p in run_dir.iterdir()}
    assert "done: completed" in result.stderr + result.stdout

    # A sweep: one run dir per job (the recipe's 3 x 2), one table at the end. (TINY's batch
    # size would replace the sweep's.)
    assert "-m" in sweep
    _ok(result := cli(*sweep, *[o for o in TINY if not o.startswith("batching.")]))
    (sweep_dir,) = (tmp_path / "multirun").glob("*/*")
    summaries = [json.loads((sweep_dir / str(i) / "summary.json").read_text()) for i in range(6)]
    assert [s["status"] for s in summaries] == ["completed"] * 6
    # No config tree per job; one table at the end, a row per job with what differs.
    assert "├── strategy" not in result.stdout
    table = result.stdout.split("sweep: 6 jobs (6 completed)\n", 1)[1].splitlines()[:7]
    assert table[0].split()[:4] == [
        "job",
        "optimizer.learning_rate",
        "batching.per_replica_batch_size",
        "status",
    ]
    assert [row.split()[:4] for row in table[1:]] == [
        [str(i), rate, batch, "completed"]
        for i, (rate, batch) in enumerate(
            (r, b) for r in ("0.001", "0.003", "0.01") for b in ("32", "64")
        )
    ]

    # Compare: the README's dated directory is whatever this sweep's is.
    assert compare[0] == "compare" and compare[2:] == ["--sort", "val_accuracy"]
    compare[1] = str(sweep_dir)
    _ok(compared := cli(*compare))
    with open(sweep_dir / "compare.csv") as file:
        rows = list(csv.DictReader(file))
    accuracies = [float(r["val_accuracy"]) for r in rows]
    assert len(rows) == 6 and accuracies == sorted(accuracies, reverse=True)
    assert (sweep_dir / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert compared.stdout.count("completed") == 6

    # Predict: train on the table, then score its rows with the run's own model.
    _ok(cli(*train_table, *TINY))
    assert predict[0] == "predict"
    _ok(predicted := cli(*predict))
    assert predicted.stdout.startswith("predict: wrote "), predicted.stdout  # -o says it is done
    with open(tmp_path / "scores.csv") as scores:
        rows = list(csv.DictReader(scores))
    assert rows and {"prediction", "prob_yes"} <= set(rows[0])
    assert {row["prediction"] for row in rows} <= {"no", "yes"}


def test_the_tour_shows_each_of_its_steps():
    """One run, a sweep, compare, a table's training and predict, in that order (what the test
    above unpacks)."""
    commands = _commands(_tour())
    assert [c[0] if c[0] in ("compare", "predict") else "-m" in c for c in commands] == [
        False,
        True,
        "compare",
        False,
        "predict",
    ]
    assert Path("outputs/churn") == Path(commands[4][1])
