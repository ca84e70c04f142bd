"""One reader for every file tfrecipe reads (tfrecipe/reading.py, issue 30): regular files only,
size caps counted before anything is read or inflated, and the same finite-number check for
training and `tfrecipe predict` (tfrecipe/data/values.py). In-process and fast: no TensorFlow."""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tfrecipe import reading
from tfrecipe.data.values import check_finite_array
from tfrecipe.reading import UnreadableFile


def _link_to_dev_zero(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


def test_a_link_to_dev_zero_is_refused_naming_the_file_and_its_target(tmp_path):
    link = _link_to_dev_zero(tmp_path / "signature.json")
    for read in (
        lambda: reading.read_json(link),
        lambda: reading.read_bytes(link, limit=10),
        lambda: reading.check_file(link),
    ):
        with pytest.raises(UnreadableFile) as refused:
            read()
        assert str(refused.value) == (
            f"{link}: a link to /dev/zero, a character device; a file tfrecipe reads must be a "
            "regular file"
        )


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with pytest.raises(
        UnreadableFile, match=r"config.yaml: a FIFO \(named pipe\); a file tfrecipe reads must be"
    ):
        reading.read_yaml(fifo)  # would block forever if the open waited for a writer


def test_a_directory_and_a_missing_file_are_refused(tmp_path):
    with pytest.raises(
        UnreadableFile, match="a directory; a file tfrecipe reads must be a regular file"
    ):
        reading.read_text(tmp_path)
    with pytest.raises(UnreadableFile, match=r"nope.txt: cannot be read \(No such file"):
        reading.read_text(tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError):  # "not written yet" stays a case of its own
        reading.read_json(tmp_path / "summary.json")


def test_sizes_are_capped_before_reading(tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(UnreadableFile, match=r"big.txt: 2.0 KB, more than a text example can be"):
        reading.read_bytes(big, limit=1024, what="a text example")
    assert reading.read_bytes(big, limit=2048) == b"x" * 2048


def test_damaged_json_and_yaml_are_one_line_naming_the_file(tmp_path):
    damaged = tmp_path / "signature.json"
    damaged.write_text('{"task": "binary", "outputs": [')
    with pytest.raises(UnreadableFile, match=r"signature.json: damaged JSON \(Expecting value at"):
        reading.read_json(damaged)
    config = tmp_path / "config.yaml"
    config.write_text("dataset: {_target_: [unclosed\n")
    with pytest.raises(UnreadableFile, match=r"config.yaml: damaged YAML \(") as refused:
        reading.read_yaml(config)
    assert "\n" not in str(refused.value)
    binary = tmp_path / "summary.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(UnreadableFile, match=r"summary.json: not UTF-8 text"):
        reading.read_json(binary)


def _declare_inflated_size(archive: Path, size: int) -> None:
    """Rewrites the central directory's uncompressed sizes (as a zip bomb's directory would say)."""
    data = bytearray(archive.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at != -1:
        struct.pack_into("<I", data, at + 24, size)  # uncompressed size
        at = data.find(b"PK\x01\x02", at + 4)
    archive.write_bytes(bytes(data))


def test_an_archive_that_would_inflate_to_gigabytes_is_refused_before_inflating(tmp_path):
    model = tmp_path / "model.keras"
    with zipfile.ZipFile(model, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("config.json", "{}")
        archive.writestr("model.weights.h5", b"\0" * 4096)
    assert reading.check_archive(model) == 4098
    _declare_inflated_size(model, 0xF000_0000)  # 3.75 GiB each from a file of a few hundred bytes
    with pytest.raises(UnreadableFile) as refused:
        reading.check_archive(model, what="model.keras")
    message = str(refused.value)
    assert (
        message.startswith(f"{model}: a ") and "archive whose members inflate to 7.5 GB" in message
    )
    assert message.endswith("100x its own size); refused before inflating anything")
    (tmp_path / "not.keras").write_bytes(b"not a zip")
    with pytest.raises(UnreadableFile, match=r"not.keras: not a readable zip archive"):
        reading.check_archive(tmp_path / "not.keras", what="model.keras")


def test_an_npz_header_declaring_more_than_its_member_holds_is_refused(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, x=np.zeros((4, 3), "float32"), y=np.zeros(4, "int64"))
    reading.check_npz(path)
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 3)}
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", buffer.getvalue())
    with pytest.raises(
        UnreadableFile, match=r"x.npy declares an array of shape \[1000000000000, 3\]"
    ):
        reading.check_npz(path)


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        ([[1.0, np.nan]], "x[0, 1]=nan"),
        ([[1.0, 2.0], [np.inf, 0.0]], "x[1, 0]=inf"),
        ([[-np.inf, 0.0]], "x[0, 0]=-inf"),
        ([[1e39, 0.0]], "x[0, 0]=1e+39"),  # finite in float64, Inf once the model reads it
    ],
    ids=["nan", "inf", "-inf", "1e39"],
)
def test_the_finite_check_names_file_place_and_value(values, shown):
    with pytest.raises(ValueError) as refused:
        check_finite_array("data.npy", "x", np.asarray(values, "float64"))
    assert str(refused.value).startswith("data.npy: x holds 1 non-finite value (NaN, Inf or")
    assert shown in str(refused.value)
    check_finite_array("data.npy", "x", np.asarray([[3e38, -1.0]], "float64"))
    check_finite_array("data.npy", "x", np.asarray([[2**62]], "int64"))


def test_a_chunk_checked_later_names_the_row_in_the_file():
    with pytest.raises(ValueError, match=r"x\[257, 0\]=nan"):
        check_finite_array("data.npy", "x", np.full((3, 2), np.nan), first_row=257)


def test_json_round_trips(tmp_path):
    path = tmp_path / "data_stats.json"
    path.write_text(json.dumps({"a": [1, 2]}))
    assert reading.read_json(path) == {"a": [1, 2]}


# --- predict's run dir: every file read through the reader, each mistake one line, exit 2 -------
SIGNATURE = {
    "task": "binary",
    "threshold": 0.5,
    "outputs": ["no", "yes"],
    "inputs": {"kind": "columns", "columns": {"age": "float32"}},
    "normalize": "scale",
}


def _run_dir(tmp_path: Path) -> Path:
    """A run dir as predict reads it, up to the model (which nothing here loads)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "signature.json").write_text(json.dumps(SIGNATURE))
    (run / "config.yaml").write_text("dataset:\n  _target_: tfrecipe.data.tabular.csv\n")
    with zipfile.ZipFile(run / "model.keras", "w") as archive:
        archive.writestr("config.json", "{}")
    (tmp_path / "new.csv").write_text("age\n30\n")
    return run


def _predict_refuses(capsys, *args: str) -> str:
    from tfrecipe.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["predict", *args])
    assert stop.value.code == 2
    report = capsys.readouterr().err.strip()
    assert len(report.splitlines()) == 1 and "Traceback" not in report, report
    return report.removeprefix("tfrecipe: invalid configuration: predict: ")


@pytest.mark.parametrize(
    ("file", "content", "expected"),
    [
        (
            "signature.json",
            '{"task": "binary", "outp',
            "signature.json: damaged JSON (Unterminated",
        ),
        ("signature.json", "[1, 2]", "signature.json: holds a JSON list, not an object; not a"),
        ("signature.json", json.dumps({**SIGNATURE, "task": "x"}), "signature.json: task='x', "),
        ("config.yaml", "dataset: {_target_: [unclosed\n", "config.yaml: damaged YAML ("),
        ("config.yaml", "- a list\n", "config.yaml: holds no mapping of keys with a `dataset`"),
        ("config.yaml", None, "config.yaml: no such file; a tfrecipe run dir holds the config"),
    ],
    ids=["json", "not-an-object", "task", "yaml", "yaml-list", "no-config"],
)
def test_a_damaged_signature_or_config_is_one_line(tmp_path, capsys, file, content, expected):
    run = _run_dir(tmp_path)
    if content is None:
        (run / file).unlink()
    else:
        (run / file).write_text(content)
    report = _predict_refuses(capsys, str(run), str(tmp_path / "new.csv"))
    assert report.startswith(f"{run / file}"), report
    assert expected in report, report


@pytest.mark.parametrize("file", ["signature.json", "config.yaml", "model.keras"])
def test_run_dir_files_linked_to_dev_zero_are_refused_not_read(tmp_path, capsys, file):
    run = _run_dir(tmp_path)
    (run / file).unlink()
    _link_to_dev_zero(run / file)
    report = _predict_refuses(capsys, str(run), str(tmp_path / "new.csv"))
    assert report.startswith(f"{run / file}: a link to /dev/zero, a character device; "), report


def test_a_model_that_would_inflate_to_gigabytes_is_refused_before_keras_opens_it(tmp_path, capsys):
    run = _run_dir(tmp_path)
    with zipfile.ZipFile(run / "model.keras", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model.weights.h5", b"\0" * 4096)
    _declare_inflated_size(run / "model.keras", 0xF000_0000)
    report = _predict_refuses(capsys, str(run), str(tmp_path / "new.csv"))
    assert "archive whose members inflate to 3.8 GB" in report, report


def test_an_output_that_is_a_directory_is_one_line(tmp_path, capsys):
    run = _run_dir(tmp_path)
    (tmp_path / "out.csv").mkdir()
    report = _predict_refuses(
        capsys, str(run), str(tmp_path / "new.csv"), "-o", str(tmp_path / "out.csv")
    )
    assert report == (
        f"--output={tmp_path / 'out.csv'}: a directory; name a file (e.g. "
        f"{tmp_path / 'out.csv' / 'predictions.csv'})"
    )


# --- training's files: the same reader, the same one-line refusals ------------------------------
def test_a_table_file_linked_to_dev_zero_is_refused_for_training_and_predict(tmp_path):
    from tfrecipe.data import table_files

    folder = tmp_path / "table"
    folder.mkdir()
    (folder / "a.csv").write_text("x,y\n1,0\n")
    _link_to_dev_zero(folder / "b.csv")
    with pytest.raises(ValueError) as refused:
        table_files.open_table(str(folder), format="csv")
    assert str(refused.value) == (
        f"{folder / 'b.csv'}: a link to /dev/zero, a character device; a csv file of path must "
        "be a regular file"
    )


def test_a_corrupt_parquet_page_names_the_file_row_group_and_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tfrecipe.data import table_files

    path = tmp_path / "t.parquet"
    rng = np.random.default_rng(0)
    pq.write_table(
        pa.table({"x": rng.random(1000), "y": rng.random(1000)}), path, row_group_size=500
    )
    column = pq.ParquetFile(path).metadata.row_group(1).column(1)
    data = bytearray(path.read_bytes())
    for at in range(column.data_page_offset + 40, column.data_page_offset + 240):
        data[at] ^= 0x5A  # a damaged page header in the second row group
    path.write_bytes(bytes(data))
    table = table_files.open_table(str(path), format="parquet")
    units = table.units()
    assert len(list(table_files.read(table, units[0], numeric=["x", "y"], strings=[]))) == 1
    with pytest.raises(ValueError) as refused:
        list(table_files.read(table, units[1], numeric=["x", "y"], strings=[]))
    message = str(refused.value)
    assert message.startswith(f"{path}: row group 1 (rows 501-1000) cannot be read ("), message
    assert (
        message.endswith("the file is damaged: rewrite it, or leave it out") and "\n" not in message
    )


def test_training_refuses_a_number_beyond_float32_with_its_line(tmp_path):
    from tfrecipe.data import values

    assert values.number_problem("1e39", "x", frozenset()) == (
        "column 'x': '1e39' is beyond float32's range (at most 3.403e+38 in size); rescale the "
        "column"
    )
    assert values.number_problem("-3e38", "x", frozenset()) is None


def test_an_npz_for_training_with_values_beyond_float32_is_refused(tmp_path):
    from tfrecipe.data import npz

    x = np.zeros((20, 3), "float64")
    x[7, 2] = -1e39
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20) % 2)
    with pytest.raises(ValueError, match=r"d.npz: x holds 1 non-finite value .*x\[7, 2\]=-1e\+39"):
        npz.load(path=str(tmp_path / "d.npz"))
    _link_to_dev_zero(tmp_path / "z.npz")
    with pytest.raises(ValueError, match=r"z.npz: a link to /dev/zero, a character device; an"):
        npz.load(path=str(tmp_path / "z.npz"))


def test_a_dev_zero_link_in_a_text_folder_is_refused_not_skipped(tmp_path):
    from tfrecipe.data import text_folder

    for name in ("neg", "pos"):
        (tmp_path / name).mkdir()
        for i in range(5):
            (tmp_path / name / f"{i}.txt").write_text(f"{name} {i}")
    _link_to_dev_zero(tmp_path / "pos" / "zero.txt")
    with pytest.raises(ValueError) as refused:
        text_folder.load(path=str(tmp_path))
    assert str(refused.value) == (
        f"{tmp_path / 'pos' / 'zero.txt'}: a link to /dev/zero, a character device; a text "
        "example must be a regular file"
    )


def test_a_recipe_file_that_is_a_fifo_or_damaged_is_one_line(tmp_path):
    from tfrecipe.config.compose import recipe_file_overrides
    from tfrecipe.errors import ConfigError

    os.mkfifo(tmp_path / "piped.yaml")
    with pytest.raises(ConfigError, match=r"piped.yaml: a FIFO \(named pipe\); a recipe must be a"):
        recipe_file_overrides([f"recipe={tmp_path / 'piped.yaml'}"])
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: damaged YAML \(ParserError: "):
        recipe_file_overrides([f"recipe={tmp_path / 'bad.yaml'}"])


def test_a_backup_state_file_linked_to_dev_zero_reads_as_no_state(tmp_path):
    from tfrecipe.distribute.cluster import latest_backup_step

    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-12"\n')
    assert latest_backup_step(tmp_path) == 12
    (tmp_path / "checkpoint").unlink()
    _link_to_dev_zero(tmp_path / "checkpoint")  # read whole, it never ended
    assert latest_backup_step(tmp_path) is None
