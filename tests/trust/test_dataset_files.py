"""One list of a dataset's files serves the readers, the data fingerprint and `predict`, hidden
files left out by all alike; every command that reads a finished run's data (`evaluate`,
`baseline`, `export`'s check examples) refuses data changed since the run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tfrecipe.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CUSTOMERS = REPO / "tests" / "data" / "customers.csv"


def _text_folder(root: Path) -> Path:
    for label in ("neg", "pos"):
        (root / label / ".ipynb_checkpoints").mkdir(parents=True)
        (root / label / "a.txt").write_text(f"{label} review")
        (root / label / ".hidden.txt").write_text("trained on, never fingerprinted")
        (root / label / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text("a copy")
    return root


def test_a_text_folders_reader_and_fingerprint_list_the_same_files(tmp_path):
    from tfrecipe.data import fingerprint, text_folder

    root = _text_folder(tmp_path / "reviews")
    files, _, classes = text_folder._list(root)
    read = sorted(str(Path(f).relative_to(root)) for f in files)
    fingerprinted = sorted(fingerprint.take({"path": str(root)})["files"]["dataset.path"])

    assert read == fingerprinted == ["neg/a.txt", "pos/a.txt"]
    assert classes == ["neg", "pos"]


def test_predict_and_a_tables_folder_leave_out_what_the_fingerprint_leaves_out(tmp_path):
    from tfrecipe.data import fingerprint
    from tfrecipe.data.readers import _list_files
    from tfrecipe.data.table_files import _files

    folder = tmp_path / "table"
    (folder / ".cache").mkdir(parents=True)
    for name in ("part-0.csv", ".part-1.csv", ".cache/part-2.csv"):
        (folder / name).write_text("x,y\n1,2\n")
    fingerprinted = sorted(fingerprint.take({"path": str(folder)})["files"]["dataset.path"])
    listed, _ = _files(str(folder), format="csv", key="dataset.path")
    predicted = _list_files([folder], (".csv",), "tables", limit=1 << 20)

    assert fingerprinted == ["part-0.csv"]
    assert [Path(f).name for f in listed] == [p.name for p in predicted] == ["part-0.csv"]


@pytest.fixture
def csv_run(train_run, tmp_path) -> tuple[Path, Path]:
    """A finished run on a copy of the customers table: (run dir, its data file)."""
    data = tmp_path / "data" / "customers.csv"
    data.parent.mkdir()
    shutil.copy(CUSTOMERS, data)
    table = [f"dataset.path={data}", "dataset.label=churned", "dataset.categorical=[city,plan]"]
    _, run_dir = train_run(
        "dataset=csv",
        *table,
        "dataset.features=[age,income,visits,city,plan]",
        "task=binary",
        "model=linear",
        "loop.epochs=1",
        "loop.steps_per_epoch=2",
    )
    return run_dir, data


def test_baseline_and_export_refuse_data_changed_since_the_run(csv_run):
    from tfrecipe.cli.baseline import baselines_of_run
    from tfrecipe.cli.export import main as export_main

    run_dir, data = csv_run
    rows = data.read_text().splitlines()
    data.write_text("\n".join([rows[0], *reversed(rows[1:])]) + "\n")  # the same size
    before = (run_dir / "summary.json").read_text()

    with pytest.raises(ConfigError, match=r"^baseline: dataset.path file .* changed"):
        baselines_of_run(run_dir, [])
    with pytest.raises(ConfigError, match=r"^export: dataset.path file .* changed"):
        export_main([str(run_dir), "--format", "saved_model"])
    assert (run_dir / "summary.json").read_text() == before
    assert not (run_dir / "exports").exists()

    # allowed, as a resume allows it: the baselines are fitted and recorded
    fitted = baselines_of_run(run_dir, ["resume_allow_changes=[dataset.path]"])
    assert json.loads((run_dir / "summary.json").read_text())["baselines"] == fitted
