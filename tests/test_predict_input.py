"""`tfrecipe predict`'s input is checked before TensorFlow is imported: a cell that is no number
the run's model takes is one line naming the file, the line, the column, the value and what the
model expects, in words for new input (issue 32). The run dir is written by hand (its signature
and config; a model.keras nobody loads): nothing trains here."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.no_tensorflow import SCRIPT as _NO_TF

from tfrecipe.cli.main import main
from tfrecipe.errors import ConfigError

HEADER = "age,income,city\n30,1000,Paris\n"


def _run_dir(
    tmp_path: Path,
    *,
    na_values: str = "[]",
    delimiter: str = ",",
    columns: dict[str, str] | None = None,
) -> Path:
    """A binary run on `columns`: by default age, income (numbers) and city (a string)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    signature = {
        "task": "binary",
        "threshold": 0.5,
        "outputs": ["no", "yes"],
        "positive_class": "yes",
        "inputs": {
            "kind": "columns",
            "columns": columns or {"age": "float32", "income": "float32", "city": "string"},
        },
        "normalize": "scale",
    }
    (run_dir / "signature.json").write_text(json.dumps(signature))
    (run_dir / "config.yaml").write_text(
        f"dataset:\n  _target_: tfrecipe.data.tabular.csv\n  na_values: {na_values}\n"
        f"  delimiter: {json.dumps(delimiter)}\n"
    )
    with zipfile.ZipFile(run_dir / "model.keras", "w") as archive:
        archive.writestr("config.json", "{}")
    return run_dir


def _refused(capsys, run_dir: Path, table: Path) -> str:
    with pytest.raises(SystemExit) as stop:
        main(["predict", str(run_dir), str(table)])
    assert stop.value.code == 2
    report = capsys.readouterr().err.strip()
    assert len(report.splitlines()) == 1, report
    return report.removeprefix("tfrecipe: invalid configuration: ")


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        (
            "lots",
            "'lots' is not a number; the run's model takes a number (float32) in this "
            "column: correct the cell, or leave the row out",
        ),
        (
            "",
            "missing value; the run's model was trained without a missing-value marker for "
            "this column (dataset.na_values) and takes a number in every cell: fill the cell, or "
            "leave the row out",
        ),
        (
            "nan",
            "'nan' is not a finite number; the run's model takes finite numbers in this "
            "column: correct the cell, or leave the row out",
        ),
        (
            "1e39",
            "'1e39' is beyond float32's range (at most 3.403e+38 in size); the run's model "
            "takes float32 numbers in this column: correct the cell, or leave the row out",
        ),
    ],
)
def test_a_bad_cell_names_file_line_column_value_and_what_the_model_takes(
    tmp_path, capsys, cell, expected
):
    table = tmp_path / "new.csv"
    table.write_text(f"{HEADER}31,{cell},Nice\n")
    report = _refused(capsys, _run_dir(tmp_path), table)
    assert report == f"predict: {table}:3: column 'income': {expected}"
    assert "dataset.categorical" not in report  # training's advice: a run's config is done


def test_a_marker_the_run_was_trained_with_is_a_missing_number_not_a_mistake(tmp_path, capsys):
    table = tmp_path / "new.csv"
    table.write_text(f"{HEADER}31,,Nice\n32,x,Lyon\n")
    report = _refused(capsys, _run_dir(tmp_path, na_values="['']"), table)
    assert report.startswith(f"predict: {table}:4: column 'income': 'x' is not a number;")


@pytest.mark.parametrize(
    ("name", "delimiter"), [("new.csv.gz", ","), ("new.tsv", "\t"), ("new.tsv.gz", "\t")]
)
def test_tables_of_every_suffix_training_reads_are_tables(tmp_path, capsys, name, delimiter):
    """dataset=csv trains on `.csv.gz`, `.tsv` and `.tsv.gz` files: predict reads them too (it
    refused them as "an unknown kind of file"); here it finds the bad cell on the third line."""
    table = tmp_path / name
    text = f"{HEADER}31,lots,Nice\n".replace(",", delimiter).encode()
    table.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    report = _refused(capsys, _run_dir(tmp_path, delimiter=delimiter), table)
    assert report.startswith(f"predict: {table}:3: column 'income': 'lots' is not a number;")


@pytest.mark.heavy  # starts a process
def test_a_bad_cell_is_refused_before_tensorflow_is_imported(tmp_path):
    """The last cell of the file: every cell is read before TensorFlow, not batch by batch."""
    table = tmp_path / "new.csv"
    table.write_text(HEADER + "31,2000,Nice\n" * 5000 + "32,lots,Lyon\n")
    result = subprocess.run(
        [sys.executable, "-c", _NO_TF, "predict", str(_run_dir(tmp_path)), str(table)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.split() == ["NO-TENSORFLOW", "2"], result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"tfrecipe: invalid configuration: predict: {table}:5003: column 'income': 'lots' is "
        "not a number; the run's model takes a number (float32)"
    ), result.stderr


def test_a_text_that_is_not_utf8_is_refused_as_training_refuses_it(tmp_path):
    """Training's text folders refuse a file that is not UTF-8 (its bytes would be scored as
    some other text): predict refuses it too, naming it, before TensorFlow loads a model."""
    from tfrecipe.data import text_folder
    from tfrecipe.data.readers import open_sources

    folder = tmp_path / "reviews"
    (folder / "neg").mkdir(parents=True)
    (folder / "pos").mkdir()
    for name in ("neg/a.txt", "neg/b.txt", "pos/a.txt", "pos/b.txt"):
        (folder / name).write_text("fine")
    latin = folder / "pos" / "latin.txt"
    latin.write_bytes("un café".encode("latin-1"))
    with pytest.raises(ValueError) as trained:
        text_folder.load(path=str(folder))
    with pytest.raises(ConfigError) as predicted:
        open_sources([folder], {"inputs": {"kind": "text"}}, dataset={})
    (line,) = predicted.value.messages
    assert line == f"predict: {trained.value}"
    assert line.startswith(f"predict: {latin}: not UTF-8 text")


def test_quoted_line_breaks_read_as_training_reads_them(tmp_path, capsys):
    """A spreadsheet's notes of several lines past the first 4 MiB: predict refused the file
    (`<file>:?: expected 3 values`); it reads every row, and a bad cell after them is named by
    the line an editor shows."""
    from helpers.tables import spreadsheet_export

    from tfrecipe.data.readers import open_sources

    table = tmp_path / "visits.csv"
    rows = spreadsheet_export(table)
    run_dir = _run_dir(tmp_path, columns={"x": "float32", "note": "string"})
    signature = json.loads((run_dir / "signature.json").read_text())
    source = open_sources([table], signature, dataset={}, keep=["y"])
    (batch,) = source.batches(len(rows))
    assert batch.features["note"].tolist() == [note for _, note, _ in rows]
    assert batch.features["x"].tolist() == [float(x) for x, _, _ in rows]
    assert batch.passthrough["y"].tolist() == [y for _, _, y in rows]

    spreadsheet_export(table, bad_last_row=True)
    line = len(table.read_text().splitlines()) - 1  # as an editor numbers them
    report = _refused(capsys, run_dir, table)
    assert report.startswith(f"predict: {table}:{line}: column 'x': 'old' is not a number;")


@pytest.mark.parametrize(
    ("name", "separator", "trained_with", "shown"),
    [("new.tsv", "\t", ",", "'\\t'"), ("new.csv", ",", "\t", "','"), ("new.csv", ";", ",", "';'")],
    ids=["tsv_for_a_comma_run", "csv_for_a_tab_run", "semicolons_for_a_comma_run"],
)
def test_a_file_of_another_delimiter_says_which_one_the_run_reads(
    tmp_path, capsys, name, separator, trained_with, shown
):
    """A TSV for a run trained on commas was "missing the model's column(s) age, income, city"
    with no hint: the line now says what the header holds and what the run reads, as training
    does (predict has no delimiter to set: the file must use the run's)."""
    table = tmp_path / name
    table.write_text(HEADER.replace(",", separator))
    report = _refused(capsys, _run_dir(tmp_path, delimiter=trained_with), table)
    ran = repr(trained_with)
    assert report == (
        f"predict: {table}: missing the model's column(s) age, income, city; the model takes "
        f"age, income, city; the header has {shown} between its names, not {ran}: the run was "
        f"trained with dataset.delimiter={ran} and predict reads its input with it: write the "
        f"file with {ran} between the values"
    )
