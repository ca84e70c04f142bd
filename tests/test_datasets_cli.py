"""Bad data files through the real command line: exit code 2, one message naming the file,
no traceback, before any training. (Each case starts a process that imports TensorFlow.)"""

from __future__ import annotations

import pytest
from helpers.datafiles import write_image_folder, write_npz, write_tfrecord

TINY = ["loop.epochs=1", "loop.steps_per_epoch=1", "loop.verbose=0", "model=mlp"]
TFRECORD = ["dataset=tfrecord", "dataset.feature_shape=[8,8,1]", "dataset.num_classes=2"]


def _truncated(path):
    path.write_bytes(path.read_bytes()[:-7])
    return path


def _tfrecord_case(case: str, tmp_path):
    """(overrides, the file the message must name)"""
    good = write_tfrecord(tmp_path / "good.tfrecord", 4)
    if case == "missing":
        missing = tmp_path / "nothere.tfrecord"
        return [f"dataset.train_files={missing}"], missing
    if case == "empty_glob":
        return [f"dataset.train_files={tmp_path}/*.tfr"], f"{tmp_path}/*.tfr"
    if case == "empty_file":
        empty = tmp_path / "empty.tfrecord"
        empty.write_bytes(b"")
        return [f"dataset.train_files={tmp_path}/*.tfrecord"], empty
    if case == "corrupt":
        bad = _truncated(write_tfrecord(tmp_path / "bad.tfrecord", 4))
        return [f"dataset.train_files={tmp_path}/*.tfrecord"], bad
    if case == "wrong_key":
        return [f"dataset.train_files={good}", "dataset.feature_key=pixels"], good
    if case == "label_out_of_range":
        bad = write_tfrecord(tmp_path / "labels.tfrecord", 4, label_offset=5)
        return [f"dataset.train_files={good}", f"dataset.validation_files={bad}"], bad
    raise AssertionError(case)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["missing", "empty_glob", "empty_file", "corrupt", "wrong_key", "label_out_of_range"]
)
def test_bad_tfrecord_files(case, cli, tmp_path):
    overrides, named = _tfrecord_case(case, tmp_path)
    _assert_config_error(cli(*TINY, *TFRECORD, *overrides), named)


def _npz_case(case: str, tmp_path):
    good = write_npz(tmp_path / "good.npz", 20)
    if case == "missing":
        missing = tmp_path / "nothere.npz"
        return [f"dataset.path={missing}"], missing
    if case == "wrong_key":
        return [f"dataset.path={good}", "dataset.x_key=images"], good
    if case == "corrupt":
        bad = tmp_path / "bad.npz"
        bad.write_bytes(good.read_bytes()[:100])
        return [f"dataset.path={bad}"], bad
    if case == "label_out_of_range":
        bad = write_npz(tmp_path / "test.npz", 4, label_offset=3)
        return [f"dataset.path={good}", "dataset.num_classes=2", f"dataset.test_path={bad}"], bad
    raise AssertionError(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "wrong_key", "corrupt", "label_out_of_range"])
def test_bad_npz_files(case, cli, tmp_path):
    overrides, named = _npz_case(case, tmp_path)
    _assert_config_error(cli(*TINY, "dataset=npz", *overrides), named)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "corrupt_image", "empty_class"])
def test_bad_image_folders(case, cli, tmp_path):
    root = write_image_folder(tmp_path / "pics")
    named = root
    if case == "missing":
        named = root = tmp_path / "nothere"
    elif case == "corrupt_image":
        named = root / "light" / "broken.png"
        named.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    elif case == "empty_class":
        named = root / "empty"
        named.mkdir()
    _assert_config_error(cli(*TINY, "dataset=image_folder", f"dataset.path={root}"), named)


@pytest.mark.slow
def test_unprepared_tfds_dataset(cli, tmp_path):
    result = cli(*TINY, "dataset=mnist", f"dataset.data_dir={tmp_path}", timeout=120)
    _assert_config_error(result, tmp_path)
    assert "'mnist'" in result.stderr and "tfds build mnist" in result.stderr


def _assert_config_error(result, named) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "tfrecipe: invalid configuration: dataset:" in result.stderr
    assert str(named) in result.stderr, result.stderr[-2000:]


def test_gzipped_tfrecord_files_train_and_predict(cli, tmp_path):
    for i in range(2):
        write_tfrecord(tmp_path / f"train-{i}.tfrecord.gz", 16, first_id=16 * i)
    run_dir = tmp_path / "run"
    trained = cli(
        *TFRECORD,
        f"dataset.train_files={tmp_path}/train-*.tfrecord.gz",
        "batching.per_replica_batch_size=8",
        "loop.epochs=1",
        f"hydra.run.dir={run_dir}",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    predicted = cli("predict", str(run_dir), str(tmp_path / "train-0.tfrecord.gz"))
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    assert len(predicted.stdout.strip().splitlines()) == 1 + 16  # a header and a row each
