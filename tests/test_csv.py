"""dataset=csv and the in-model encoders of tabular data: a user's CSV (numbers on different
scales, categories, a string target) trains from the command line, the exported model takes raw
rows, every bad file is refused with one `file:line: column` line, and the bundled tabular sets'
exported models take unscaled rows too."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import REPO

from tfrecipe.errors import ConfigError

CUSTOMERS = REPO / "tests" / "data" / "customers.csv"
COLUMNS = ["age", "income", "visits", "city", "plan"]
CSV_RUN = [
    "dataset=csv",
    f"dataset.path={CUSTOMERS}",
    "dataset.label=churned",
    f"dataset.features=[{','.join(COLUMNS)}]",
    "dataset.categorical=[city,plan]",
    "task=binary",
    "model=mlp",
]


def _load(run_dir):
    import keras

    from tfrecipe import tasks

    tasks.register_custom_objects()
    return keras.saving.load_model(run_dir / "model.keras")


def _customers_splits(**options):
    from tfrecipe.data.tabular import csv as load_csv

    return load_csv(
        path=str(CUSTOMERS),
        label="churned",
        features=COLUMNS,
        categorical=["city", "plan"],
        validation_fraction=0.1,
        test_fraction=0.2,
        split_seed=0,
        **options,
    )


def _raw_rows(**changes) -> dict[str, np.ndarray]:
    """Two customers as a user would write them: numbers and category names."""
    rows = {
        "age": [72.0, 25.0],
        "income": [25_400.0, 70_000.0],
        "visits": [10.0, 3.0],
        "city": ["Lille", "Paris"],
        "plan": ["basic", "pro"],
    } | changes
    return {
        name: np.array(values, dtype=object if isinstance(values[0], str) else "float32")
        for name, values in rows.items()
    }


def test_a_csv_trains_from_the_command_line_and_its_model_takes_raw_rows(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(*CSV_RUN, "loop.epochs=6", "loop.verbose=0", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dataset"] == "tfrecipe.data.tabular.csv"
    assert summary["test"]["auc"] > 0.85  # the target depends on every column; chance is 0.5

    model = _load(run_dir)
    # The exported model scores the raw test rows exactly as the run did.
    splits = _customers_splits()
    model.compile(loss=model.loss, metrics=[])
    loss = model.evaluate(splits.test.batch(64), verbose=0)
    assert loss == pytest.approx(summary["test"]["loss"], abs=1e-5)
    # Raw rows: an old Lille customer on the basic plan churns, a young rich Paris pro stays;
    # the categories are read (a city the data never had is accepted and moves the logit).
    logits = model.predict(_raw_rows(), verbose=0)[:, 0]
    assert logits[0] > 0 > logits[1]
    unseen = model.predict(_raw_rows(city=["Atlantis", "Atlantis"]), verbose=0)[:, 0]
    assert np.isfinite(unseen).all() and not np.allclose(unseen, logits)


def test_raw_columns_train_the_same_on_two_replicas_with_either_loop(train_run):
    """Dict features through the pipeline, mirrored (2 logical CPUs) and the custom loop: the
    same numbers as one replica with fit."""
    one, _ = train_run(*CSV_RUN, "batching.per_replica_batch_size=32")  # the same global batch
    two, _ = train_run(*CSV_RUN, "strategy=mirrored", "strategy.logical_cpus=2", "loop=custom")
    assert two["num_replicas"] == 2
    assert two["test"]["loss"] == pytest.approx(one["test"]["loss"], abs=1e-4)


def test_string_labels_become_class_ids_in_sorted_order(train_run):
    splits = _customers_splits()
    assert splits.info.class_names == ("no", "yes")
    assert (splits.info.target_kind, splits.info.num_classes) == ("binary", 2)
    # as classes too: two logits, one per name
    summary, _ = train_run(*CSV_RUN, "task=classification")
    assert summary["status"] == "completed"


def test_a_float_column_is_a_regression_target_and_missing_cells_are_filled(train_run, tmp_path):
    from tfrecipe.data.tabular import csv as load_csv

    rows = list(csv.reader(CUSTOMERS.open()))
    rows[3][1] = rows[9][4] = "NA"  # an income and a plan
    gaps = tmp_path / "gaps.csv"
    with gaps.open("w", newline="") as file:
        csv.writer(file).writerows(rows)
    options = {"categorical": ["city", "plan", "churned"], "na_values": ["NA"]}
    summary, run_dir = train_run(
        "dataset=csv",
        f"dataset.path={gaps}",
        "dataset.label=spend",
        *(f"dataset.{key}=[{','.join(values)}]" for key, values in options.items()),
        "task=regression",
        "model=mlp",
    )
    assert summary["status"] == "completed" and "r2" in summary["test"]
    splits = load_csv(
        path=str(gaps),
        label="spend",
        validation_fraction=0.1,
        test_fraction=0.2,
        split_seed=0,
        **options,
    )
    assert (splits.info.target_kind, splits.info.target_shape) == ("float", (1,))
    incomes = np.concatenate([x["income"] for x, _ in splits.train.batch(512).as_numpy_iterator()])
    mean = float(np.nanmean(incomes))
    # A missing income is the training mean; a missing plan is the unseen category.
    model = _load(run_dir)
    churned = {"churned": np.array(["yes", "yes"], dtype=object)}
    same = {"age": [40.0, 40.0], "visits": [5.0, 5.0], "city": ["Lyon", "Lyon"]}
    missing = model.predict(
        _raw_rows(**same, income=[np.nan, mean], plan=["NA", "gold"]) | churned, verbose=0
    )
    assert np.isfinite(missing).all()
    assert missing[0, 0] == pytest.approx(missing[1, 0], abs=1e-4)


def test_several_0_1_label_columns_make_a_multi_hot_target(tmp_path):
    from tfrecipe.data.tabular import csv as load_csv

    path = tmp_path / "tags.csv"
    path.write_text("x,a,b\n" + "".join(f"{i},{i % 2},{i // 2 % 2}\n" for i in range(20)))
    splits = load_csv(
        path=str(path), label=["a", "b"], validation_fraction=0, test_fraction=0, split_seed=0
    )
    assert (splits.info.target_kind, splits.info.target_shape) == ("multi_hot", (2,))


BAD_FILES = {
    "ragged": ("age,city,y\n1,Lyon,0\n2,Nice\n", {}, "bad.csv:3: expected 3 values"),
    "unknown": (
        "age,city,y\n1,Lyon,0\n",
        {"features": ["age", "town"]},
        "dataset: features='town': ",
    ),
    "text_in_number": (
        "age,city,y\n1,Lyon,0\nold,Nice,1\n",
        {},
        "bad.csv:3: column 'age': 'old' is not a number",
    ),
    "missing": (
        "age,city,y\n1,Lyon,0\n,Nice,1\n",
        {},
        "bad.csv:3: column 'age': missing value; list its marker in dataset.na_values",
    ),
}


@pytest.mark.parametrize("problem", sorted(BAD_FILES))
def test_a_bad_file_is_refused_naming_file_line_and_column(train_run, tmp_path, problem):
    text, options, message = BAD_FILES[problem]
    path = tmp_path / "bad.csv"
    path.write_text(text)
    overrides = [f"dataset.{key}=[{','.join(value)}]" for key, value in options.items()]
    with pytest.raises(ConfigError) as error:
        train_run(
            "dataset=csv",
            f"dataset.path={path}",
            "dataset.label=y",
            "dataset.categorical=[city]",
            *overrides,
            "task=binary",
            "model=mlp",
        )
    (line,) = error.value.messages
    assert message in line
    if problem == "unknown":
        assert line.endswith("has no such column; its columns are: age, city, y")
    assert not (tmp_path / "run0").exists()


def _refused_line(cli, tmp_path, path) -> str:
    """The one line `python -m tfrecipe dataset=csv` on `path` exits 2 with, no traceback and
    no run dir."""
    run_dir = tmp_path / "run"
    result = cli(
        "dataset=csv", f"dataset.path={path}", "dataset.label=y", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and not run_dir.exists()
    (line,) = [line for line in result.stderr.splitlines() if path.name in line]
    return line


def test_a_bad_file_exits_2_with_one_line_and_no_run_dir(cli, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("age,city,y\n1,Lyon,0\n2,Nice\n")
    line = _refused_line(cli, tmp_path, path)
    assert f"{path}:3: expected 3 values (age, city, y), found 2" in line


def test_regression_on_string_labels_is_refused(train_run, tmp_path):
    with pytest.raises(ConfigError) as error:
        train_run(*CSV_RUN, "task=regression")
    (line,) = error.value.messages
    assert line.startswith(
        "task=regression: dataset tfrecipe.data.tabular.csv has string labels (e.g. 'no')"
    )
    assert not (tmp_path / "run0").exists()


def test_a_bundled_sets_model_takes_unscaled_rows(train_run):
    from tfrecipe.data.bundled import breast_cancer

    summary, run_dir = train_run("dataset=breast_cancer", "task=binary", "model=mlp")
    splits = breast_cancer(
        standardize=True, validation_fraction=0.15, test_fraction=0.2, split_seed=0
    )
    features = np.concatenate([x for x, _ in splits.test.batch(512).as_numpy_iterator()])
    assert features.max() > 1000  # raw areas, not standardized values
    model = _load(run_dir)
    model.compile(loss=model.loss, metrics=[])
    loss = model.evaluate(splits.test.batch(64), verbose=0)
    assert loss == pytest.approx(summary["test"]["loss"], abs=1e-5)


@pytest.mark.slow
def test_two_workers_read_disjoint_rows_of_a_csv(tmp_path):
    """Two real MultiWorkerMirroredStrategy workers read one CSV through the loader, the
    pipeline and the distribute helper: each sees its own rows, together every one once."""
    from helpers.two_workers import ids_each_worker_saw

    path = tmp_path / "rows.csv"
    path.write_text("id,city,y\n" + "".join(f"{i},c{i % 3},{i % 2}\n" for i in range(24)))
    seen = ids_each_worker_saw(tmp_path, "csv_shard_worker.py", str(path))
    first, second = (set(ids) for ids in seen)
    assert first and second and not first & second
    assert sorted(seen[0] + seen[1]) == list(range(24))


def test_a_tsv_read_with_commas_says_to_set_the_tab_delimiter(cli, tmp_path):
    """A TSV file under the default `,` is one column named `age<TAB>city<TAB>y`: the line says
    which delimiter to set, and that setting reads the file."""
    from tfrecipe.data.table_layout import CSV_TARGET, check_table

    path = tmp_path / "people.tsv"
    path.write_text("age\tcity\ty\n1\tLyon\t0\n2\tNice\t1\n")
    line = _refused_line(cli, tmp_path, path)
    assert line.endswith("set dataset.delimiter='\\t'")
    assert "label='y'" in line
    check_table(CSV_TARGET, {"path": str(path), "label": "y", "delimiter": "\\t"})  # no error


@pytest.mark.parametrize(
    ("bad_row", "says"),
    [
        ("old,Nice,1", "column 'age': 'old' is not a number"),
        (",Nice,1", "column 'age': missing value"),
        ("inf,Nice,1", "column 'age': 'inf' is not a finite number"),
        ("3,Nice,", "column 'y': missing label"),
        ("3,Nice", "expected 3 values"),
    ],
    ids=["text", "missing", "inf", "no_label", "ragged"],
)
def test_a_bad_cell_after_blank_lines_names_the_line_an_editor_shows(tmp_path, bad_row, says):
    """Blank lines before the header and between rows: the line in the message is the bad
    row's own line in the file."""
    from tfrecipe.data.tabular import csv as load_csv

    lines = ["", "", "age,city,y", "1,Lyon,0", "", "2,Paris,1", bad_row, "4,Lyon,0"]
    path = tmp_path / "gaps.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as error:
        load_csv(path=str(path), label="y", categorical=["city"], split_seed=0)
    assert str(error.value).startswith(f"{path}:{lines.index(bad_row) + 1}: {says}")


@pytest.mark.parametrize("stream", ["false", "true"], ids=["in_memory", "streamed"])
def test_class_ids_from_1_are_refused_with_the_fix_not_given_an_empty_class_0(
    train_run, compose_cfg, tmp_path, stream
):
    """Labels 1..3 gave 4 classes, class 0 an output no row teaches (and a prob_0 column in
    predict's output): one line says so and how to number them; regression on them is fine."""
    from tests.helpers.configs import validate
    from tfrecipe import tasks
    from tfrecipe.data.tabular import csv as load_csv

    path = tmp_path / "scores.csv"
    path.write_text("x,y\n" + "".join(f"{i / 7:.3f},{1 + i % 3}\n" for i in range(60)))
    overrides = ["dataset=csv", f"dataset.path={path}", "dataset.label=y", "model=mlp"]
    with pytest.raises(ConfigError) as error:
        train_run(*overrides, f"dataset.stream={stream}", "batching.per_replica_batch_size=8")
    (line,) = error.value.messages
    assert line.startswith("task=classification: dataset tfrecipe.data.tabular.csv has class ids")
    assert line.endswith(
        "1..3, none of them 0: the model would get 4 outputs, 1 of them for class 0 that no "
        "example has; number the classes from 0 (subtract 1: 0..2), or use task=regression to "
        "predict the number"
    )
    assert not (tmp_path / "run0").exists()
    splits = load_csv(path=str(path), label="y", split_seed=0, stream=stream == "true")
    regression = validate(compose_cfg(*overrides, "task=regression")).task
    tasks.check_targets(regression, splits.info, dataset="csv")  # a number: no error


@pytest.mark.parametrize("stream", [False, True], ids=["in_memory", "streamed"])
def test_booleans_train_the_same_from_csv_as_from_parquet(tmp_path, stream):
    """pandas writes a bool column to CSV as True/False and to Parquet as bool: both give the
    same classes ("false", "true") and the same 0/1 feature, and predict reads either alike."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tfrecipe.data.readers import open_sources
    from tfrecipe.data.tabular import csv as load_csv
    from tfrecipe.data.tabular import parquet as load_parquet

    rows = [(i / 10, i % 3 == 0, "NA" if i == 5 else f"c{i % 2}", i % 4 < 2) for i in range(40)]
    x, flag, city, y = (list(column) for column in zip(*rows, strict=True))
    (tmp_path / "t.csv").write_text(
        "x,flag,city,y\n" + "".join(f"{a},{b},{c},{d}\n" for a, b, c, d in rows)
    )
    pq.write_table(pa.table({"x": x, "flag": flag, "city": city, "y": y}), tmp_path / "t.parquet")
    options = {"label": "y", "categorical": ["city"], "stream": stream, "split_seed": 0}
    options |= {"validation_fraction": 0, "test_fraction": 0}  # hash splits differ by file name
    read = {
        "csv": load_csv(path=str(tmp_path / "t.csv"), **options),
        "parquet": load_parquet(path=str(tmp_path / "t.parquet"), **options),
    }
    for splits in read.values():
        assert splits.info.class_names == ("false", "true")
        assert (splits.info.num_classes, splits.info.target_kind) == (2, "binary")
    batches = {
        name: next(iter(splits.train.rebatch(64) if stream else splits.train.batch(64)))
        for name, splits in read.items()
    }
    for column in ("x", "flag", "city"):
        assert batches["csv"][0][column].numpy().tolist() == (
            batches["parquet"][0][column].numpy().tolist()
        )
    assert batches["csv"][1].numpy().tolist() == batches["parquet"][1].numpy().tolist()
    assert set(batches["csv"][0]["flag"].numpy().tolist()) == {0.0, 1.0}
    inputs = {"kind": "columns", "columns": {"x": "float32", "flag": "float32"}}
    flags = [
        next(open_sources([tmp_path / f"t.{kind}"], {"inputs": inputs}, dataset={}).batches(40))
        for kind in ("csv", "parquet")
    ]
    assert flags[0].features["flag"].tolist() == flags[1].features["flag"].tolist() == flag


@pytest.mark.parametrize("stream", [False, True], ids=["in_memory", "streamed"])
def test_quoted_line_breaks_read_as_pythons_csv_module_reads_them(tmp_path, stream):
    """A spreadsheet's notes of several lines, in quotes, past the first 4 MiB: Arrow's reader
    refused the file ("<file>:?: expected 3 values ..., found 2") where a block ended inside a
    note. Every row now reads as Python's csv module (and pandas) read it."""
    from helpers.tables import spreadsheet_export

    from tfrecipe.data.tabular import csv as load_csv

    path = tmp_path / "visits.csv"
    rows = spreadsheet_export(path)
    splits = load_csv(
        path=str(path),
        label="y",
        categorical=["note"],
        validation_fraction=0,
        test_fraction=0,
        split_seed=0,
        stream=stream,
    )
    assert splits.info.num_train == len(rows)
    train = splits.train.rebatch(len(rows)) if stream else splits.train.batch(len(rows))
    (features, targets), *_ = list(train)
    read = sorted(
        zip(features["x"].numpy(), features["note"].numpy(), targets.numpy(), strict=True)
    )
    expected = sorted((float(x), note.encode(), int(y)) for x, note, y in rows)
    assert read == expected


def test_a_bad_cell_after_quoted_line_breaks_names_the_line_an_editor_shows(tmp_path):
    from helpers.tables import spreadsheet_export

    from tfrecipe.data.tabular import csv as load_csv

    path = tmp_path / "visits.csv"
    spreadsheet_export(path, bad_last_row=True)
    lines = path.read_text().splitlines()  # as an editor numbers them
    assert lines[-2:] == ['old,"one', 'more",1']
    with pytest.raises(ValueError) as error:
        load_csv(path=str(path), label="y", categorical=["note"], split_seed=0)
    assert str(error.value).startswith(f"{path}:{len(lines) - 1}: column 'x': 'old' is not a")
