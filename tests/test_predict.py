"""`tfrecipe predict RUN_DIR INPUT...`: a trained run's predictions for new files, in the run's
class names and units, equal to what its model.keras predicts; bad input refused before
TensorFlow loads."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, TINY

from tfrecipe.cli.main import main
from tfrecipe.errors import ConfigError

pytestmark = pytest.mark.heavy  # trains (module fixtures)

CUSTOMERS = REPO / "tests" / "data" / "customers.csv"
COLUMNS = ["age", "income", "visits", "city", "plan"]


def _train(tmp_path_factory, name: str, *overrides: str) -> Path:
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    run_dir = tmp_path_factory.mktemp(name) / "run"
    train(compose([*TINY, "model=mlp", "model.hidden_units=[16]", *overrides]), run_dir=run_dir)
    return run_dir


@pytest.fixture(scope="module")
def customers_run(tmp_path_factory) -> Path:
    """A binary task on a CSV with string labels ("no"/"yes") and categorical columns."""
    return _train(
        tmp_path_factory,
        "customers",
        "dataset=csv",
        f"dataset.path={CUSTOMERS}",
        "dataset.label=churned",
        f"dataset.features=[{','.join(COLUMNS)}]",
        "dataset.categorical=[city,plan]",
        "task=binary",
    )


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    return _train(tmp_path_factory, "digits")


@pytest.fixture(scope="module")
def diabetes_run(tmp_path_factory) -> Path:
    return _train(
        tmp_path_factory,
        "diabetes",
        "dataset=diabetes",
        "task=regression",
        "task.standardize_targets=true",
    )


def _new_rows(path: Path, count: int = 40) -> list[dict[str, str]]:
    """`count` customers as new rows: an id column first, the label kept in (it is ignored)."""
    with open(CUSTOMERS, newline="") as f:
        rows = list(csv.DictReader(f))[:count]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["customer_id", *rows[0]])
        writer.writeheader()
        writer.writerows({"customer_id": f"c{i}", **row} for i, row in enumerate(rows))
    return rows


def _keras_probabilities(run_dir: Path, rows: list[dict[str, str]]) -> np.ndarray:
    import keras

    import tfrecipe.tasks

    tfrecipe.tasks.register_custom_objects()
    model = keras.saving.load_model(run_dir / "model.keras")
    columns = {
        name: np.array([r[name] for r in rows], dtype=object if name in ("city", "plan") else "f4")
        for name in COLUMNS
    }
    logits = np.asarray(model.predict(columns, verbose=0))[:, 0]
    return 1 / (1 + np.exp(-logits))


def test_a_csv_gets_class_names_and_keras_probabilities(customers_run, tmp_path, capsys):
    rows = _new_rows(tmp_path / "new.csv")
    main(["predict", str(customers_run), str(tmp_path / "new.csv"), "--keep", "customer_id"])
    out = list(csv.DictReader(capsys.readouterr().out.splitlines()))  # stdout: CSV

    assert list(out[0]) == ["customer_id", "prediction", "prob_no", "prob_yes"]
    assert [r["customer_id"] for r in out] == [f"c{i}" for i in range(len(rows))]
    probabilities = np.array([float(r["prob_yes"]) for r in out])
    np.testing.assert_allclose(probabilities, _keras_probabilities(customers_run, rows), atol=1e-6)
    expected = np.where(probabilities >= 0.5, "yes", "no")
    assert [r["prediction"] for r in out] == expected.tolist()
    signature = json.loads((customers_run / "signature.json").read_text())
    assert signature["outputs"] == ["no", "yes"] and signature["threshold"] == 0.5


def test_parquet_in_and_every_output_format_agree(customers_run, tmp_path):
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    _new_rows(tmp_path / "new.csv", count=300)
    pq.write_table(pa_csv.read_csv(tmp_path / "new.csv"), tmp_path / "new.parquet")
    outputs = {}
    for source in ("new.csv", "new.parquet"):
        for suffix in (".csv", ".parquet", ".jsonl"):
            out = tmp_path / f"{source}{suffix}"
            main(
                [
                    "predict",
                    str(customers_run),
                    str(tmp_path / source),
                    "-o",
                    str(out),
                    "--keep",
                    "customer_id",
                    "--batch-size",
                    "64",
                ]
            )
            outputs[out.name] = _read(out)
    first = outputs["new.csv.csv"]
    assert len(first) == 300
    for name, rows in outputs.items():
        assert [r["customer_id"] for r in rows] == [r["customer_id"] for r in first], name
        got = np.array([float(r["prob_yes"]) for r in rows])
        np.testing.assert_allclose(got, [float(r["prob_yes"]) for r in first], atol=1e-6)
    assert not list(tmp_path.glob(".*partial"))


def _read(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _refused(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as stop:
        main(["predict", *args])
    assert stop.value.code == 2
    report = capsys.readouterr().err.strip()
    assert len(report.splitlines()) == 1, report
    return report


def test_bad_input_is_one_line_and_writes_nothing(customers_run, tmp_path, capsys):
    run, out = str(customers_run), tmp_path / "out.csv"
    (tmp_path / "missing.csv").write_text("age,city\n30,Paris\n")
    report = _refused(capsys, run, str(tmp_path / "missing.csv"), "-o", str(out))
    assert "missing.csv: missing the model's column(s) income, visits, plan" in report

    (tmp_path / "bad.csv").write_text(
        "age,income,visits,city,plan\n30,1000,2,Paris,basic\n31,lots,2,Nice,pro\n"
    )
    report = _refused(capsys, run, str(tmp_path / "bad.csv"), "-o", str(out))
    assert f"{tmp_path / 'bad.csv'}:3: column 'income': 'lots' is not a number" in report

    _new_rows(tmp_path / "new.csv", count=3)
    assert "--output=out.txt" in _refused(capsys, run, str(tmp_path / "new.csv"), "-o", "out.txt")
    assert "--keep column(s) nope" in _refused(
        capsys, run, str(tmp_path / "new.csv"), "--keep", "nope"
    )
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("no table here\n")
    assert "notes: a folder without table (.csv" in _refused(capsys, run, str(tmp_path / "notes"))
    assert "model takes table columns" in _refused(capsys, run, str(tmp_path / "notes" / "a.txt"))
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_arguments_are_checked_without_tensorflow(customers_run, tmp_path):
    """A mistake is answered before TensorFlow is imported (seconds saved per typo)."""
    (tmp_path / "missing.csv").write_text("age\n1\n")
    code = (
        "import sys\nfrom tfrecipe.cli.main import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    print(e.code, 'tensorflow' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "predict", str(customers_run), str(tmp_path / "missing.csv")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.stdout.split() == ["2", "False"], result.stderr


def test_digits_from_npz_and_image_files(digits_run, tmp_path):
    import keras
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images[:50] / 16.0).astype("float32")[..., None]
    np.savez(tmp_path / "new.npz", x=x, y=digits.target[:50])
    main(["predict", str(digits_run), str(tmp_path / "new.npz"), "-o", str(tmp_path / "a.csv")])
    rows = _read(tmp_path / "a.csv")
    assert list(rows[0])[:3] == ["path", "index", "prediction"]
    assert [f"prob_{d}" for d in range(10)] == list(rows[0])[3:]
    model = keras.saving.load_model(digits_run / "model.keras")
    expected = np.asarray(model.predict(x, verbose=0)).argmax(axis=1)
    assert [int(r["prediction"]) for r in rows] == expected.tolist()

    folder = tmp_path / "images" / "batch1"
    folder.mkdir(parents=True)
    for i in range(5):  # 8-bit greys, as a scanner would give them
        Image.fromarray((x[i, ..., 0] * 255).round().astype("uint8")).save(folder / f"{i}.png")
    main(["predict", str(digits_run), str(tmp_path / "images"), "-o", str(tmp_path / "b.jsonl")])
    from_images = _read(tmp_path / "b.jsonl")
    assert [Path(r["path"]).name for r in from_images] == [f"{i}.png" for i in range(5)]
    assert [r["prediction"] for r in from_images] == [r["prediction"] for r in rows[:5]]


def test_regression_values_are_in_the_targets_units(diabetes_run, tmp_path):
    import keras
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes()
    table = tmp_path / "patients.csv"
    with open(table, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["patient", *bunch.feature_names])
        writer.writerows([f"p{i}", *row] for i, row in enumerate(bunch.data[:30]))
    main(
        [
            "predict",
            str(diabetes_run),
            str(table),
            "--keep",
            "patient",
            "-o",
            str(tmp_path / "o.csv"),
        ]
    )
    rows = _read(tmp_path / "o.csv")
    assert list(rows[0]) == ["patient", "prediction"]
    model = keras.saving.load_model(diabetes_run / "model.keras")
    expected = np.asarray(model.predict(bunch.data[:30].astype("float32"), verbose=0))[:, 0]
    np.testing.assert_allclose([float(r["prediction"]) for r in rows], expected, rtol=1e-5)
    # the model's rescaling puts them near the targets' mean (152), not near 0
    assert 50 < np.mean(expected) < 300


def test_numpy_string_arrays_are_model_input(customers_run):
    """np.array(["Paris", ...]) is `<U5`, which TensorFlow refuses (Invalid dtype: str160)."""
    import keras

    from tfrecipe.cli.predict import model_inputs

    model = keras.saving.load_model(customers_run / "model.keras")
    features = {
        "age": np.array([30.0, 60.0]),
        "income": np.array([1e4, 5e4]),
        "visits": np.array([1.0, 9.0]),
        "city": np.array(["Paris", "Nice"]),
        "plan": np.array(["basic", "pro"]),
    }
    assert features["city"].dtype.kind == "U"
    logits = np.asarray(model.predict_on_batch(model_inputs(features, normalize=None)))
    assert logits.shape == (2, 1) and np.isfinite(logits).all()


def test_a_run_dir_without_signature_is_refused():
    with pytest.raises(ConfigError, match=r"holds no signature.json"):
        from tfrecipe.runs import RunDir

        RunDir.at(REPO / "tests").trained_model("final")


def test_the_output_is_never_an_input_a_runs_file_or_a_planted_links_target(
    customers_run, tmp_path, capsys
):
    """The one writer (tfrecipe/files.py): -o naming the input, a file of the run dir or a
    folder is refused before anything is read; a link planted where a temporary output used to
    be written leads nowhere."""
    new = tmp_path / "new.csv"
    _new_rows(new, 5)
    (tmp_path / "folder.csv").mkdir()
    before = new.read_bytes()
    history = (customers_run / "history.csv").read_bytes()
    for output, named in [
        (new, "input"),
        (customers_run / "history.csv", "run"),
        (tmp_path / "folder.csv", "directory"),
    ]:
        assert named in _refused(capsys, str(customers_run), str(new), "-o", str(output))
    assert new.read_bytes() == before
    assert (customers_run / "history.csv").read_bytes() == history
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / ".scores.csv.partial").symlink_to(victim)
    main(["predict", str(customers_run), str(new), "-o", str(tmp_path / "scores.csv")])
    assert victim.read_text() == "keep"
    assert (tmp_path / "scores.csv").read_text().startswith('"prediction"')


# --- what training refuses, predict refuses (issue 30: one reader, one finite-number check) ------
@pytest.mark.parametrize("cell", ["nan", "inf", "-inf", "1e39"])
def test_cells_training_refuses_are_refused_naming_file_line_and_value(
    customers_run, tmp_path, capsys, cell
):
    table = tmp_path / "new.csv"
    table.write_text(f"age,income,visits,city,plan\n30,1000,2,Paris,basic\n31,{cell},2,Nice,pro\n")
    out = tmp_path / "out.csv"
    report = _refused(capsys, str(customers_run), str(table), "-o", str(out))
    assert report.startswith(f"tfrecipe: invalid configuration: predict: {table}:3: column "), (
        report
    )
    assert f"'income': '{cell}' is not a finite number" in report or (
        cell == "1e39" and "'income': '1e39' is beyond float32's range" in report
    ), report
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_all_nan_arrays_are_refused_before_tensorflow_loads(digits_run, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.full((3, 8, 8, 1), np.nan, "float32"))
    report = _refused(capsys, str(digits_run), str(tmp_path / "x.npy"))
    assert report == (
        f"tfrecipe: invalid configuration: predict: {tmp_path / 'x.npy'}: x holds 192 non-finite "
        "values (NaN, Inf or beyond float32's range; the first at x[0, 0, 0, 0]=nan); inputs must "
        "be finite numbers"
    )
    x = np.zeros((4, 8, 8, 1), "float64")
    x[2, 1, 3, 0] = 1e39  # finite in float64, Inf in the model's float32
    np.savez(tmp_path / "x.npz", x=x)
    report = _refused(capsys, str(digits_run), str(tmp_path / "x.npz"))
    assert "x.npz: x holds 1 non-finite value" in report and "x[2, 1, 3, 0]=1e+39" in report


def test_dev_zero_links_in_input_folders_are_refused_not_read(digits_run, tmp_path, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.png").symlink_to("/dev/zero")
    report = _refused(capsys, str(digits_run), str(folder))
    assert report == (
        f"tfrecipe: invalid configuration: predict: {folder / 'a.png'}: a link to /dev/zero, a "
        "character device; an input of predict must be a regular file"
    )


def test_a_file_output_says_where_the_rows_went(customers_run, tmp_path, capsys):
    """`predict -o FILE` ends with one line naming the rows, the file and its columns (stdout
    carries nothing else: without -o it is the CSV itself)."""
    _new_rows(tmp_path / "new.csv", count=40)
    out = tmp_path / "scores.csv"
    main(["predict", str(customers_run), str(tmp_path / "new.csv"), "-o", str(out)])
    said = capsys.readouterr().out.splitlines()
    assert said == [f"predict: wrote 40 rows to {out} (columns: prediction, prob_no, prob_yes)"]
    assert len(_read(out)) == 40


def test_a_table_of_a_header_alone_gets_the_header_written(customers_run, tmp_path, capsys):
    """No rows (a filter that kept none) is an output of no rows with its columns named: it said
    "wrote 0 rows to FILE" and wrote no file, and printed nothing to stdout."""
    (tmp_path / "none.csv").write_text("customer_id," + ",".join(COLUMNS) + "\n")
    args = [str(customers_run), str(tmp_path / "none.csv"), "--keep", "customer_id"]
    header = ["customer_id", "prediction", "prob_no", "prob_yes"]
    main(["predict", *args])
    assert capsys.readouterr().out.splitlines() == [",".join(f'"{c}"' for c in header)]
    for suffix in (".csv", ".parquet", ".jsonl"):
        out = tmp_path / f"scores{suffix}"
        main(["predict", *args, "-o", str(out)])
        assert capsys.readouterr().out.splitlines() == [
            f"predict: wrote 0 rows to {out} (columns: {', '.join(header)})"
        ]
        assert out.is_file() and _read(out) == []
    import pyarrow.parquet as pq

    assert pq.read_schema(tmp_path / "scores.parquet").names == header


def test_a_kept_column_named_as_an_output_column_is_refused(customers_run, tmp_path, capsys):
    """`--keep prediction` on a table that has one (last week's scores) is refused in one line:
    the model's column replaced the kept one, and the output had one `prediction` column."""
    rows = _new_rows(tmp_path / "new.csv", count=3)
    with open(tmp_path / "scored.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["prediction", *rows[0]])
        writer.writeheader()
        writer.writerows({"prediction": "old", **row} for row in rows)
    report = _refused(
        capsys, str(customers_run), str(tmp_path / "scored.csv"), "--keep", "prediction"
    )
    assert report == (
        "tfrecipe: invalid configuration: predict: --keep=prediction: the output has its own "
        "column(s) of that name (prediction, prob_no, prob_yes); rename the input's column to "
        "keep it"
    )


def test_a_folder_of_tables_is_read_as_training_reads_one(customers_run, tmp_path):
    """A table model takes a folder of CSV and Parquet parts (sorted, recursively, hidden files
    and other kinds left out), as `dataset.path` takes a folder; it was refused as "an unknown
    kind of file"."""
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    _new_rows(tmp_path / "whole.csv", count=30)
    whole = pa_csv.read_csv(tmp_path / "whole.csv")
    parts = tmp_path / "parts"
    (parts / "later").mkdir(parents=True)
    pa_csv.write_csv(whole.slice(0, 12), parts / "a.csv")
    pq.write_table(whole.slice(12), parts / "later" / "b.parquet")
    (parts / ".draft.csv").write_text("not,a,table\n")
    (parts / "README.txt").write_text("scored weekly\n")

    for source, out in ((tmp_path / "whole.csv", "of_whole.csv"), (parts, "of_parts.csv")):
        main(["predict", str(customers_run), str(source), "-o", str(tmp_path / out)])
    got = _read(tmp_path / "of_parts.csv")
    assert got == _read(tmp_path / "of_whole.csv") and len(got) == 30
