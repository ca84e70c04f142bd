"""Tables at any size (dataset=csv|parquet, tfrecipe/data/tabular.py): streamed in row chunks with
bounded memory, split by a seeded hash of (file, row) without materializing, statistics from one
pass (cached in the run dir), each worker reading its own share, every bad cell named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import tables

from tfrecipe.data import table_stats, tabular

REPO = Path(__file__).resolve().parents[1]
TABLE = ["task=binary", "model=mlp", "dataset.label=y", "dataset.categorical=[city]"]


def _ids(dataset) -> list[int]:
    """The ids of one pass over a split's chunks."""
    ids = []
    for features, _ in dataset.as_numpy_iterator():
        ids += [round(float(v)) for v in features["id"]]
    return ids


def _csv(tmp_path, rows=600, name="t.csv", **kwargs) -> Path:
    return tables.write(tmp_path / name, rows, **kwargs)


def test_a_streamed_table_splits_every_row_into_exactly_one_split_by_a_seeded_hash(tmp_path):
    path = _csv(tmp_path, 1000)
    splits = tabular.csv(path=str(path), label="y", categorical=["city"], stream=True)
    assert splits.batched and splits.for_worker is not None
    seen = {name: _ids(getattr(splits, name)) for name in ("train", "validation", "test")}
    every = [row for ids in seen.values() for row in ids]
    assert sorted(every) == list(range(1000))  # each row once, in one split
    info = splits.info
    assert (info.num_train, info.num_validation, info.num_test) == tuple(
        len(seen[name]) for name in ("train", "validation", "test")
    )
    assert 60 <= info.num_validation <= 140 and 60 <= info.num_test <= 140  # 10% each
    again = tabular.csv(path=str(path), label="y", categorical=["city"], stream=True)
    assert sorted(_ids(again.validation)) == sorted(seen["validation"])  # seeded: the same
    other = tabular.csv(path=str(path), label="y", categorical=["city"], stream=True, split_seed=1)
    assert sorted(_ids(other.validation)) != sorted(seen["validation"])


def test_the_training_order_is_reshuffled_each_epoch_and_seeded(tmp_path):
    from tfrecipe.data.pipeline import PipelineOptions, prepare

    path = _csv(tmp_path, 400)
    splits = tabular.csv(path=str(path), label="y", categorical=["city"], stream=True)
    shuffled = prepare(
        splits.train,
        PipelineOptions(shuffle_buffer=100),
        split="train",
        training=True,
        seed=3,
        chunks=True,
    )
    first, second = _ids(shuffled), _ids(shuffled)
    assert sorted(first) == sorted(second) == sorted(_ids(splits.train))
    assert first != second and first != sorted(first)


def test_csv_and_parquet_files_directories_partitions_and_globs_read_the_same_rows(tmp_path):
    import pyarrow.parquet as pq

    data = tables.table(900)
    pq.write_table(data, tmp_path / "one.parquet", row_group_size=100)
    for part, (start, stop) in enumerate([(0, 300), (300, 900)]):
        folder = tmp_path / "hive" / f"part={part}"
        folder.mkdir(parents=True)
        pq.write_table(data.slice(start, stop - start), folder / "data.parquet")
    _csv(tmp_path / "csvs", 450, name="a.csv")
    _gzip(tmp_path / "csvs" / "b.csv.gz", first_id=450)
    kinds = {
        "parquet file": (tabular.parquet, tmp_path / "one.parquet"),
        "hive directory": (tabular.parquet, tmp_path / "hive"),
        "parquet glob": (tabular.parquet, tmp_path / "hive" / "*" / "*.parquet"),
        "csv directory (.gz too)": (tabular.csv, tmp_path / "csvs"),
    }
    for name, (builder, path) in kinds.items():
        splits = builder(
            path=str(path),
            label="y",
            categorical=["city"],
            stream=True,
            validation_fraction=0,
            test_fraction=0,
        )
        assert sorted(_ids(splits.train)) == list(range(900)), name
    hive = tabular.parquet(
        path=str(tmp_path / "hive"), label="y", categorical=["city", "part"], stream=True
    )
    assert hive.info.input_shape == (6,)  # id, x0-x2, city and the partition column


def _gzip(path: Path, **kwargs) -> None:
    plain = tables.write(path.with_suffix(""), 450, **kwargs)
    with gzip.open(path, "wb") as out:
        out.write(plain.read_bytes())
    plain.unlink()


def test_statistics_come_from_the_training_split_and_are_cached_in_the_run_dir(
    tmp_path, monkeypatch
):
    path = _csv(tmp_path, 2000)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cache = tabular.StatsCache(run_dir, chief=True)
    splits = tabular.csv(
        path=str(path), label="y", categorical=["city"], stream=True, stats_cache=cache
    )
    train = [f for f, _ in splits.train.as_numpy_iterator()]
    x0 = np.concatenate([f["x0"] for f in train])
    stats = json.loads((run_dir / table_stats.STATS_FILE).read_text())["stats"]
    assert stats["numeric"]["x0"]["mean"] == pytest.approx(float(x0.mean()), abs=1e-5)
    assert stats["numeric"]["x0"]["count"] == len(x0) == splits.info.num_train
    assert stats["vocabularies"]["city"] == [f"c{i}" for i in range(8)]

    def recompute(*args, **kwargs):
        raise AssertionError("the statistics were computed again")

    monkeypatch.setattr(table_stats, "compute", recompute)
    for chief in (True, False):  # a resume, and another worker
        again = tabular.csv(
            path=str(path),
            label="y",
            categorical=["city"],
            stream=True,
            stats_cache=tabular.StatsCache(run_dir, chief=chief),
        )
        assert again.info == splits.info


@pytest.mark.parametrize("stream", [False, True], ids=["in_memory", "streamed"])
def test_the_statistics_line_shows_the_split_counts_the_table_uses(tmp_path, caplog, stream):
    """A table held in memory is split by stratified fractions, not by the pass's hash: its
    lines show the rows it trains on, never the hash's counts; a streamed table's, the hash's."""
    import logging

    path = _csv(tmp_path, 300)
    with caplog.at_level(logging.INFO, logger="tfrecipe"):
        splits = tabular.csv(path=str(path), label="y", categorical=["city"], stream=stream)
    lines = [r.getMessage() for r in caplog.records if r.name == "tfrecipe"]
    info = splits.info
    used = f"train {info.num_train}, validation {info.num_validation}, test {info.num_test}"
    stats_line = next(line for line in lines if line.startswith("statistics pass: 300 rows"))
    if stream:
        assert f"300 rows ({used}) in " in stats_line and stats_line.endswith("; streamed")
        assert not any(line.startswith("in memory") for line in lines)
    else:
        assert "train" not in stats_line and stats_line.endswith("; held in memory")
        assert f"in memory: {used} rows (seeded fractions, stratified by class)" in lines
        assert (info.num_train, info.num_validation, info.num_test) == (240, 30, 30)  # exact


def test_stats_rows_bounds_the_sample_and_a_vocabulary_cap_keeps_the_frequent_categories(tmp_path):
    path = _csv(tmp_path, 3000)
    splits = tabular.csv(
        path=str(path),
        label="y",
        categorical=["city"],
        stream=True,
        stats_rows=500,
        max_vocabulary=3,
    )
    _, encoded = splits.preprocessing(None)
    assert encoded.shape[-1] == 4 + 3 + 1  # 4 numbers, 3 categories and the any-other slot
    assert splits.info.num_train + splits.info.num_validation + splits.info.num_test == 3000


def test_a_large_table_streams_under_fit_custom_and_mirrored_with_the_same_losses(
    train_run, tmp_path
):
    path = _csv(tmp_path, 1200)
    data = ["dataset=csv", f"dataset.path={path}", *TABLE, "dataset.stream=true"]
    fit, _ = train_run(*data, "batching.per_replica_batch_size=32")  # the same global batch
    custom, _ = train_run(*data, "batching.per_replica_batch_size=32", "loop=custom")
    mirrored, _ = train_run(*data, "strategy=mirrored", "strategy.logical_cpus=2")
    assert fit["status"] == custom["status"] == mirrored["status"] == "completed"
    assert custom["test"]["loss"] == pytest.approx(fit["test"]["loss"], abs=1e-4)
    assert mirrored["test"]["loss"] == pytest.approx(fit["test"]["loss"], abs=1e-4)


def test_a_parquet_table_trains_and_its_model_takes_raw_rows(train_run, tmp_path):
    import keras

    import tfrecipe.tasks

    path = tables.write(tmp_path / "t.parquet", 1500)
    summary, run_dir = train_run(
        "dataset=parquet",
        f"dataset.path={path}",
        *TABLE,
        "loop.epochs=4",
        "loop.steps_per_epoch=20",
        "optimizer.learning_rate=0.01",
        tiny=False,
    )
    assert summary["status"] == "completed" and summary["test"]["auc"] > 0.9, summary["test"]
    tfrecipe.tasks.register_custom_objects()
    model = keras.saving.load_model(run_dir / "model.keras")
    rows = {
        "id": np.array([1.0, 2.0]),
        "x0": np.array([3.0, -3.0]),
        "x1": np.array([-1.0, 1.0]),
        "x2": np.array([0.0, 0.0]),
        "city": np.array(["c1", "c0"], dtype=object),
    }
    logits = model.predict(rows, verbose=0)
    assert logits[0, 0] > 0 > logits[1, 0]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "id,x0,city,y\n"
            + "".join(f"{i},{i}.5,c1,{i % 2}\n" for i in range(3000))
            + "3000,old,c1,0\n",
            "bad.csv:3002: column 'x0': 'old' is not a number",
        ),
        (
            "id,x0,city,y\n"
            + "".join(f"{i},{i}.5,c1,{i % 2}\n" for i in range(2000))
            + "2000,inf,c1,0\n",
            "bad.csv:2002: column 'x0': 'inf' is not a finite number",
        ),
        (
            "id,x0,city,y\n1,2,c1,0\n\n2,3,c1\n",
            "bad.csv:4: expected 4 values (id, x0, city, y), found 3",
        ),
        ("id,x0,id,y\n1,2,3,0\n", "bad.csv:1: column 'id' appears twice in the header"),
        ("id,x0,city,y\n1,2,c1,0\n2,3,c1,\n", "bad.csv:3: column 'y': missing label"),
    ],
    ids=["not-a-number-far-in", "infinite", "ragged-after-a-blank-line", "duplicate", "no-label"],
)
def test_a_bad_cell_anywhere_is_named_by_file_line_and_column(tmp_path, content, expected):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ValueError) as error:
        tabular.csv(path=str(path), label="y", categorical=["city"], stream=True)
    (line,) = str(error.value).splitlines()
    assert line.startswith(f"{tmp_path}/{expected}"), line


def test_a_directory_an_overlong_field_and_a_byte_order_mark_get_one_clear_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="a directory with no csv file in it"):
        tabular.csv(path=str(tmp_path / "empty"), label="y")
    with pytest.raises(ValueError, match="matches the directory"):
        tabular.csv(path=str(tmp_path / "*"), label="y")
    long_field = tmp_path / "long.csv"  # past Python csv's 128 KiB field limit, and a bad cell
    long_field.write_text(f"x,n,y\n{'a' * 200_000},1,1\nb,2,0\nc,z,1\n")
    with pytest.raises(ValueError) as error:
        tabular.csv(path=str(long_field), label="y", categorical=["x"])
    assert str(error.value).startswith(f"{long_field}:4: column 'n': 'z' is not a number")
    bom = tmp_path / "bom.csv"  # Excel writes one: the first column keeps its name
    bom.write_bytes(b"\xef\xbb\xbf" + _csv(tmp_path, 50, name="plain.csv").read_bytes())
    assert tabular.csv(path=str(bom), label="y", categorical=["city"]).info.num_train > 0


def test_a_bad_cell_is_exit_2_with_one_line_and_no_run_dir(cli, tmp_path):
    path = tmp_path / "bad.csv"
    rows = "".join(f"{i},{i}.5,c1,{i % 2}\n" for i in range(5000))
    path.write_text(f"id,x0,city,y\n{rows}5000,3..5,c1,0\n")
    run_dir = tmp_path / "run"
    result = cli(
        "dataset=csv",
        f"dataset.path={path}",
        *TABLE,
        "dataset.stream=true",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not run_dir.exists()
    (line,) = [line for line in result.stderr.splitlines() if "bad.csv" in line]
    assert line.endswith(
        f"{path}:5002: column 'x0': '3..5' is not a number; list the column in "
        "dataset.categorical if it holds categories, or the marker in "
        "dataset.na_values"
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["by-file", "by-row"])
def test_two_workers_read_disjoint_shares_of_a_streamed_table(tmp_path, layout):
    """Two real MultiWorkerMirroredStrategy workers: each reads its own files (4 Parquet files)
    or its own rows (one CSV), together every row once per epoch."""
    from helpers.two_workers import ids_each_worker_saw

    if layout == "by-file":
        for part in range(4):
            tables.write(tmp_path / "data" / f"p{part}.parquet", 40, first_id=40 * part)
        kind, path = "parquet", tmp_path / "data"
    else:
        kind, path = "csv", _csv(tmp_path, 160)
    seen = ids_each_worker_saw(tmp_path, "table_shard_worker.py", kind, str(path))
    first, second = (set(ids) for ids in seen)
    assert first and second and not first & second
    assert sorted(seen[0] + seen[1]) == list(range(160))


@pytest.fixture
def launch(tmp_path):
    from helpers.launch import launching

    yield from launching(tmp_path)


@pytest.mark.slow
def test_parameter_servers_train_on_a_streamed_table_fed_by_the_coordinator(launch, tmp_path):
    """A worker's tf.data graph cannot call a Python reader: the coordinator reads the table
    and sends each step its batch, so every scheduled step trains (exact step count)."""
    path = _csv(tmp_path, 800)
    run_dir = tmp_path / "run"
    run = launch(
        "strategy=parameter_server",
        "cluster=local",
        "cluster.num_workers=2",
        "cluster.num_ps=1",
        "loop=custom",
        "dataset=csv",
        f"dataset.path={path}",
        *TABLE,
        "dataset.stream=true",
        "loop.epochs=2",
        "loop.steps_per_epoch=10",
        "loop.verbose=0",
        "batching.per_replica_batch_size=32",
        f"hydra.run.dir={run_dir}",
    )
    assert run.finish(timeout=400) == 0, run.output[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == 20
    assert summary["test"]["auc"] > 0.8, summary["test"]


def test_a_streamed_run_caches_its_statistics_and_evaluate_scores_it_the_same(cli, tmp_path):
    path = _csv(tmp_path, 1500)
    run_dir = tmp_path / "run"
    result = cli(
        "dataset=csv",
        f"dataset.path={path}",
        *TABLE,
        "dataset.stream=true",
        "loop.epochs=2",
        "loop.steps_per_epoch=5",
        "loop.verbose=0",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ran out of data" not in result.stderr  # Keras counts the streamed splits' batches
    cached = json.loads((run_dir / table_stats.STATS_FILE).read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert cached["stats"]["rows"]["test"] > 0
    scored = cli("evaluate", str(run_dir))
    assert scored.returncode == 0, scored.stderr[-3000:]
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    assert evaluation["metrics"]["loss"] == pytest.approx(summary["test"]["loss"], abs=1e-5)


def test_delimiters_and_headerless_files_stream_like_the_others(tmp_path):
    rows = "".join(f"{i};{i / 10};c{i % 3};{i % 2}\n" for i in range(300))
    (tmp_path / "semi.csv").write_text(f"id;x0;city;y\n{rows}")
    (tmp_path / "bare.tsv").write_text(rows.replace(";", "\t"))
    semi = tabular.csv(
        path=str(tmp_path / "semi.csv"),
        label="y",
        categorical=["city"],
        delimiter=";",
        stream=True,
        validation_fraction=0,
        test_fraction=0,
    )
    bare = tabular.csv(
        path=str(tmp_path / "bare.tsv"),
        label="y",
        categorical=["city"],
        delimiter="\t",
        header=False,
        column_names=["id", "x0", "city", "y"],
        stream=True,
        validation_fraction=0,
        test_fraction=0,
    )
    assert sorted(_ids(semi.train)) == sorted(_ids(bare.train)) == list(range(300))


def test_a_file_cache_holds_a_streamed_split_and_gives_the_same_rows(tmp_path):
    from tfrecipe.data.pipeline import PipelineOptions, prepare

    path = _csv(tmp_path, 500)
    splits = tabular.csv(path=str(path), label="y", categorical=["city"], stream=True)
    options = PipelineOptions(cache=str(tmp_path / "cache"))
    cached = prepare(splits.test, options, split="test", training=False, seed=0, chunks=True)
    assert _ids(cached) == _ids(splits.test) == _ids(cached)
    assert list(tmp_path.glob("cache.test*")), "no cache file written"


def test_splits_with_their_own_files_read_only_those(tmp_path):
    train = _csv(tmp_path, 400, name="train.csv")
    validation = _csv(tmp_path, 50, name="val.csv", first_id=1000)
    splits = tabular.csv(
        path=str(train),
        label="y",
        categorical=["city"],
        stream=True,
        validation_path=str(validation),
        test_fraction=0.25,
    )
    assert sorted(_ids(splits.validation)) == list(range(1000, 1050))
    test = _ids(splits.test)
    assert 60 <= len(test) <= 140 and sorted(_ids(splits.train) + test) == list(range(400))
    train.unlink()  # the validation split never reads the training table
    assert len(_ids(splits.validation)) == 50


def test_a_tab_written_as_backslash_t_reads_a_tsv_and_a_long_delimiter_is_one_line(cli, tmp_path):
    # a tab cannot be typed in a Hydra override: `dataset.delimiter='\t'` arrives as two characters
    rows = "".join(f"{i}\t{i / 10}\tc{i % 3}\t{i % 2}\n" for i in range(300))
    (tmp_path / "t.tsv").write_text(f"id\tx0\tcity\ty\n{rows}")
    splits = tabular.csv(
        path=str(tmp_path / "t.tsv"), label="y", categorical=["city"], delimiter="\\t"
    )
    assert splits.info.num_train + splits.info.num_validation + splits.info.num_test == 300
    run_dir = tmp_path / "run"
    result = cli(
        "dataset=csv",
        f"dataset.path={tmp_path / 't.tsv'}",
        *TABLE,
        "dataset.delimiter=ab",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not run_dir.exists()
    assert "delimiter='ab': one character" in result.stderr


@pytest.mark.parametrize("stream", [False, True], ids=["in_memory", "streamed"])
def test_a_header_with_spaces_around_its_names_reads_by_the_trimmed_names(tmp_path, stream):
    rows = "".join(f"{i},{i / 10},c{i % 3},{i % 2}\n" for i in range(300))
    # as many exports write, after a blank line
    (tmp_path / "spaced.csv").write_text(f"\nid, x0, city , y\n{rows}")
    splits = tabular.csv(
        path=str(tmp_path / "spaced.csv"),
        label="y",
        categorical=["city"],
        stream=stream,
        validation_fraction=0,
        test_fraction=0,
    )
    ids = _ids(splits.train if stream else splits.train.batch(1000))
    assert sorted(ids) == list(range(300)) and splits.info.num_train == 300


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"features": ["x0", "x0", "city"]}, "features=['x0', 'x0', 'city']: 'x0' is named twice"),
        ({"label": ["y", "y"]}, "label=['y', 'y']: 'y' is named twice"),
        ({"max_vocabulary": 0}, "max_vocabulary=0: at least 1"),
        ({"stats_rows": 0}, "stats_rows=0: at least 1"),
    ],
    ids=["features", "label", "max_vocabulary", "stats_rows"],
)
def test_a_column_named_twice_or_a_count_below_one_is_one_line(tmp_path, options, expected):
    path = _csv(tmp_path, 100)
    arguments = {"path": str(path), "label": "y", "categorical": ["city"], **options}
    with pytest.raises(ValueError) as error:
        tabular.csv(**arguments)
    assert str(error.value).startswith(expected), error.value


@pytest.mark.parametrize("key", ["validation_path", "test_path"])
def test_a_split_file_without_rows_is_refused_not_silently_skipped(tmp_path, key):
    path = _csv(tmp_path, 100)
    empty = tmp_path / "empty.csv"
    empty.write_text(path.read_text().splitlines()[0] + "\n")  # the header only
    with pytest.raises(ValueError, match=f"^{key}='{empty}': no rows"):
        tabular.csv(path=str(path), label="y", categorical=["city"], **{key: str(empty)})
