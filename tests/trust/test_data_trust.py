"""What a run's data may do to it: sizes are checked before anything is allocated (class counts,
multi-hot width, both cgroup versions' memory limits); the files a run trains on are
fingerprinted at its start, so a resume or `evaluate` on changed data is refused and cached
statistics are used only for the data they were computed from, as computed; a label found only
in a test file is refused by a class task."""

from __future__ import annotations

import json
import logging
import os
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from helpers.probes import peak_memory_growth

from tfrecipe.errors import ConfigError

MB = 1 << 20


def _peak_bytes(fn):
    """Runs fn; returns (its result or the exception it raised, peak bytes allocated meanwhile)."""
    tracemalloc.start()
    try:
        try:
            outcome = fn()
        except Exception as error:  # the caller asserts on it
            outcome = error
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- sizes, before anything is allocated ----------------------------------------------------------
# 2e9 classes of shape [2] are more classes than examples, and their means take 16 GB: a machine
# with less memory free refuses them for that first (both name the key and the value).
BILLIONS_REFUSED = (
    r"dataset.num_classes=2000000000: (more classes than|classes data .* of memory is available)"
)


def test_synthetic_classes_in_the_billions_are_refused_before_any_allocation():
    """The probe: num_classes=2e9 (a small shape) passed the float32 estimate, then drew 32 GB of
    float64 means."""
    from tfrecipe.data.bundled import synthetic

    def make():
        return synthetic(
            num_examples=2048,
            shape=[2],
            num_classes=2_000_000_000,
            validation_fraction=0.1,
            test_fraction=0.1,
            split_seed=0,
        )

    refused, peak = _peak_bytes(make)
    assert isinstance(refused, ValueError), refused
    assert re.match(BILLIONS_REFUSED, str(refused)), refused
    assert peak < 16 * MB, peak


def test_the_synthetic_estimate_counts_the_float64_draws():
    from tfrecipe.data.bundled import _CHUNK, synthetic_class_bytes

    # a float32 mean per class, and a chunk of them drawn as float64 meanwhile
    means = synthetic_class_bytes(num_examples=10, shape=[4], num_classes=5000)
    assert means == 5000 * 4 * 4 + _CHUNK * 4 * 8
    # multi-hot: float32 codes (n x n) and targets (examples x n, split and made tensors as the
    # features are: 3.5 times), a float64 chunk of codes
    codes = synthetic_class_bytes(num_examples=10, shape=[4], num_classes=5000, targets="multi_hot")
    assert codes == (5000 * 4 + 5000 * 5000 + 35 * 5000) * 4 + _CHUNK * 5000 * 8


def test_the_multi_hot_estimate_is_not_below_what_the_data_take():
    """6,000 examples of 3,000 multi-hot labels, made for real in a fresh process: the peak it
    measures stays under the estimate (counted once, the codes were under-estimated 2.1x)."""
    from tfrecipe.data.bundled import synthetic_class_bytes

    peak = peak_memory_growth(
        setup="import tensorflow\nfrom tfrecipe.data import bundled",
        measured="bundled.synthetic(num_examples=6000, shape=[8], num_classes=3000, "
        "validation_fraction=0.1, test_fraction=0.1, split_seed=0, targets='multi_hot')",
    )
    estimate = synthetic_class_bytes(
        num_examples=6000, shape=[8], num_classes=3000, targets="multi_hot"
    )
    assert peak <= estimate


def test_chunked_draws_give_the_same_synthetic_data():
    from tfrecipe.data.bundled import _normal_float32

    expected = np.random.default_rng(3).normal(0.0, 1.0, size=(2500, 3)).astype("float32")
    np.testing.assert_array_equal(_normal_float32(np.random.default_rng(3), (2500, 3)), expected)


def _cgroups(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake cgroup tree and /proc (self/cgroup, meminfo: 64 GB available)."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(proc_cgroup)
    (proc / "meminfo").write_text("MemTotal: 99999999 kB\nMemAvailable: 62500000 kB\n")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root, proc


def test_a_cgroup_v1_memory_limit_bounds_the_estimate(tmp_path):
    from tfrecipe.data.bundled import available_memory

    root, proc = _cgroups(
        tmp_path,
        "12:memory:/slurm/job_7\n3:cpu,cpuacct:/slurm/job_7\n",
        {
            "memory/slurm/job_7/memory.limit_in_bytes": str(4 << 30),
            "memory/slurm/job_7/memory.usage_in_bytes": str(1 << 30),
            "memory/memory.limit_in_bytes": "9223372036854771712",  # unlimited at the root
            "memory/memory.usage_in_bytes": str(50 << 30),
        },
    )
    assert available_memory(cgroup_root=root, proc=proc) == 3 << 30


def test_a_cgroup_v2_limit_above_the_process_bounds_the_estimate(tmp_path):
    from tfrecipe.data.bundled import available_memory

    root, proc = _cgroups(
        tmp_path,
        "0::/user.slice/job/step\n",
        {
            "user.slice/job/step/memory.max": "max",
            "user.slice/job/step/memory.current": str(1 << 30),
            "user.slice/job/memory.max": str(2 << 30),  # the job's limit, a level up
            "user.slice/job/memory.current": str(1 << 29),
        },
    )
    assert available_memory(cgroup_root=root, proc=proc) == (2 << 30) - (1 << 29)


def test_without_a_cgroup_limit_the_kernels_available_memory_counts(tmp_path):
    from tfrecipe.data.bundled import available_memory

    root, proc = _cgroups(tmp_path, "0::/\n", {"memory.max": "max", "memory.current": "5"})
    assert available_memory(cgroup_root=root, proc=proc) == 62500000 * 1024
    assert available_memory(cgroup_root=tmp_path / "none", proc=tmp_path / "none") is None


def _labels_csv(path: Path, labels: list[str]) -> Path:
    rng = np.random.default_rng(0)
    rows = [f"{rng.normal():.4f},{rng.normal():.4f},{label}" for label in labels]
    path.write_text("a,b,y\n" + "\n".join(rows) + "\n")
    return path


def test_csv_label_ids_in_the_billions_count_no_list_and_the_head_check_refuses_them(
    tmp_path, compose_cfg
):
    """The probe: a label of 2000000000 built a 2e9-long count list before any check."""
    from tests.helpers.configs import validate
    from tfrecipe.data import tabular
    from tfrecipe.training.dataset import check_targets

    path = _labels_csv(tmp_path / "ids.csv", ["0", "1", "2000000000"] * 20)
    splits, peak = _peak_bytes(lambda: tabular.csv(path=str(path), label="y", stream=False))
    assert splits.info.num_classes == 2_000_000_001 and peak < 64 * MB, peak
    run = validate(
        compose_cfg("dataset=csv", f"dataset.path={path}", "dataset.label=y", "model=mlp")
    )
    with pytest.raises(ConfigError, match=r"2000000001 classes .* of memory is available"):
        check_targets(run.dataset, splits.info, task=run.task, global_batch=32)


# --- a label only in the test file ----------------------------------------------------------------
def test_a_label_only_in_the_test_file_is_refused_naming_it_and_where(tmp_path, compose_cfg):
    from tests.helpers.configs import validate
    from tfrecipe import tasks
    from tfrecipe.data import tabular

    train = _labels_csv(tmp_path / "train.csv", ["cat", "dog"] * 30)
    test = _labels_csv(tmp_path / "test.csv", ["cat", "dog", "cat", "zebra", "dog"])
    splits = tabular.csv(path=str(train), label="y", test_path=str(test), validation_fraction=0)
    assert splits.info.untrained_labels == (f"'zebra' (first at {test}:5)",)
    run = validate(compose_cfg("dataset=csv", f"dataset.path={train}", "dataset.label=y"))
    with pytest.raises(ConfigError) as refused:
        tasks.check_targets(run.task, splits.info, dataset="csv")
    message = str(refused.value)
    assert "'zebra' (first at" in message and f"{test}:5" in message, message
    assert "no training rows" in message and len(message.splitlines()) == 1


def test_an_integer_target_only_in_the_test_file_is_fine_for_regression(tmp_path, compose_cfg):
    from tests.helpers.configs import validate
    from tfrecipe import tasks
    from tfrecipe.data import tabular

    train = _labels_csv(tmp_path / "train.csv", ["0", "3", "5"] * 20)
    test = _labels_csv(tmp_path / "test.csv", ["3", "7"])
    splits = tabular.csv(path=str(train), label="y", test_path=str(test), validation_fraction=0)
    assert splits.info.untrained_labels == (f"'7' (first at {test}:3)",)
    run = validate(
        compose_cfg("dataset=csv", f"dataset.path={train}", "dataset.label=y", "task=regression")
    )
    tasks.check_targets(run.task, splits.info, dataset="csv")  # a number, not a class
    classify = validate(compose_cfg("dataset=csv", f"dataset.path={train}", "dataset.label=y"))
    with pytest.raises(ConfigError, match=r"'7' .* no training rows"):
        tasks.check_targets(classify.task, splits.info, dataset="csv")


# --- the fingerprint ------------------------------------------------------------------------------
def _rewrite_keeping_size_and_mtime(path: Path, offset: int, data: bytes) -> None:
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns


def test_a_small_file_is_hashed_whole_and_a_large_one_by_sampled_blocks(tmp_path):
    from tfrecipe.data.fingerprint import BLOCK_BYTES, file_digest

    small = tmp_path / "small.csv"
    small.write_bytes(b"x" * 1000)
    large = tmp_path / "large.bin"
    with open(large, "wb") as f:  # sparse: 64 MB of zeros, no disk used
        f.truncate(64 * MB)
    (digest, sampled), (big_digest, big_sampled) = file_digest(small), file_digest(large)
    assert not sampled and big_sampled
    _rewrite_keeping_size_and_mtime(small, 500, b"y")
    assert file_digest(small)[0] != digest
    _rewrite_keeping_size_and_mtime(large, 32 * MB - BLOCK_BYTES // 2, b"y")  # the middle block
    assert file_digest(large)[0] != big_digest


def test_the_files_a_dataset_config_names_are_found_by_key(tmp_path):
    from tfrecipe.data.fingerprint import data_files

    (tmp_path / "imgs" / "cat").mkdir(parents=True)
    (tmp_path / "imgs" / "cat" / "a.png").write_bytes(b"png")
    (tmp_path / "imgs" / ".hidden").write_bytes(b"")
    for name in ("t-0.tfrecord", "t-1.tfrecord", "v.tfrecord"):
        (tmp_path / name).write_bytes(b"r")
    found = data_files(
        {
            "_target_": "x",
            "path": str(tmp_path / "imgs"),
            "test_path": None,
            "train_files": str(tmp_path / "t-*.tfrecord"),
            "validation_files": [str(tmp_path / "v.tfrecord")],
            "split_seed": 0,
        }
    )
    assert {key: sorted(files) for key, files in found.items()} == {
        "dataset.path": ["cat/a.png"],
        "dataset.train_files": ["t-0.tfrecord", "t-1.tfrecord"],
        "dataset.validation_files": ["v.tfrecord"],
    }
    assert data_files({"_target_": "tfrecipe.data.bundled.digits", "split_seed": 0}) == {}


def test_changed_data_is_refused_on_resume_naming_the_file_unless_allowed(tmp_path):
    from tfrecipe.config.changes import Resuming
    from tfrecipe.data import fingerprint
    from tfrecipe.rundir import RunFiles

    (tmp_path / "data").mkdir()
    data = _labels_csv(tmp_path / "data" / "train.csv", ["a", "b"] * 10)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dataset = {"_target_": "tfrecipe.data.tabular.csv", "path": str(tmp_path / "data")}
    home = RunFiles(run_dir)
    fingerprint.check_and_record(home, dataset, Resuming())
    saved = json.loads((run_dir / fingerprint.FILE).read_text())
    assert list(saved["files"]["dataset.path"]) == ["train.csv"]
    fingerprint.check_and_record(home, dataset, Resuming())  # unchanged: fine

    _rewrite_keeping_size_and_mtime(data, 8, b"9")  # the probe: rewritten, size and mtime kept
    with pytest.raises(ConfigError) as refused:
        fingerprint.check_and_record(home, dataset, Resuming())
    message = str(refused.value)
    assert message.startswith(f"resume=auto: dataset.path file {data} changed content"), message
    assert "resume_allow_changes=[dataset.path]" in message
    (tmp_path / "data" / "more.csv").write_text("a,b,y\n")
    with pytest.raises(ConfigError, match=r"more.csv is new since the run started;"):
        fingerprint.check_and_record(home, dataset, Resuming("auto", (str(data),)))
    with pytest.raises(ConfigError, match=r"more.csv is new since .*\(and 1 more files\)"):
        fingerprint.check_and_record(home, dataset, Resuming())
    fingerprint.check_and_record(home, dataset, Resuming("auto", ("dataset",)))
    fingerprint.check_and_record(home, dataset, Resuming())  # recorded anew


def test_data_moved_elsewhere_with_the_same_contents_is_the_same_data(tmp_path):
    from tfrecipe.config.changes import Resuming
    from tfrecipe.data import fingerprint

    first = _labels_csv(tmp_path / "a.csv", ["x", "y"] * 5)
    moved = tmp_path / "elsewhere" / "a.csv"
    moved.parent.mkdir()
    moved.write_bytes(first.read_bytes())  # a new modification time, the same bytes
    saved = fingerprint.take({"path": str(first)})
    fingerprint.check_unchanged(
        saved, fingerprint.take({"path": str(moved)}), Resuming(), command="evaluate"
    )


def test_a_large_file_modified_in_an_unsampled_place_counts_as_changed(tmp_path):
    from tfrecipe.data import fingerprint

    large = tmp_path / "big.bin"
    with open(large, "wb") as f:
        f.truncate(16 * MB)
    saved = fingerprint.take({"path": str(large)})
    with open(large, "r+b") as f:  # between the sampled blocks, the modification time moves
        f.seek(5 * MB)
        f.write(b"z")
    [(key, path, why)] = fingerprint.changes(saved, fingerprint.take({"path": str(large)}))
    assert (key, path) == ("dataset.path", str(large)) and "was modified" in why


def test_tampered_or_stale_statistics_are_computed_again(tmp_path, caplog):
    """The probes: swapped class names in data_stats.json were trusted (AUC 0.5), and a rewrite
    keeping size and modification time reused the old statistics."""
    from tfrecipe.data import table_stats, tabular

    path = _labels_csv(tmp_path / "t.csv", ["ant", "bee", "cow"] * 20)
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def load(chief=True):
        return tabular.csv(
            path=str(path),
            label="y",
            stream=True,
            stats_cache=tabular.StatsCache(run_dir, chief=chief),
        )

    assert load().info.class_names == ("ant", "bee", "cow")
    cache = run_dir / table_stats.STATS_FILE
    saved = json.loads(cache.read_text())
    swapped = {**saved, "stats": {**saved["stats"], "class_names": ["cow", "bee", "ant"]}}
    cache.write_text(json.dumps(swapped))
    with caplog.at_level(logging.WARNING, logger="tfrecipe"):
        assert load(chief=False).info.class_names == ("ant", "bee", "cow")
    assert "do not match their digest" in caplog.text
    # the digest recomputed too: the class names' order still gives the edit away
    import hashlib

    swapped["digest"] = hashlib.sha256(
        json.dumps(swapped["stats"], sort_keys=True).encode()
    ).hexdigest()
    cache.write_text(json.dumps(swapped))
    assert load(chief=False).info.class_names == ("ant", "bee", "cow")
    assert "class names not sorted" in caplog.text

    cache.write_text(json.dumps(saved))
    key = saved["fingerprint"]
    _rewrite_keeping_size_and_mtime(path, len("a,b,y\n"), b"-")  # a feature's sign flipped
    load()  # computed again for the new content, and kept under its own key
    assert json.loads(cache.read_text())["fingerprint"] != key


def test_a_resume_and_evaluate_on_rewritten_data_are_refused(tmp_path, train_run, compose_cfg):
    from tfrecipe.cli.evaluate import evaluate_run
    from tfrecipe.train import train

    path = _labels_csv(tmp_path / "t.csv", ["0", "1"] * 40)
    data = ["dataset=csv", f"dataset.path={path}", "dataset.label=y", "model=mlp", "task=binary"]
    summary, run_dir = train_run(*data, "loop.epochs=1")
    assert summary["status"] == "completed" and (run_dir / "data_fingerprint.json").is_file()
    _rewrite_keeping_size_and_mtime(path, len("a,b,y\n"), b"-")
    with pytest.raises(ConfigError, match=rf"^evaluate: dataset.path file {path} changed"):
        evaluate_run(run_dir)
    result = evaluate_run(run_dir, overrides=["resume_allow_changes=[dataset.path]"])
    assert "loss" in result["metrics"]

    summary = json.loads((run_dir / "summary.json").read_text()) | {"status": "preempted"}
    (run_dir / "summary.json").write_text(json.dumps(summary))  # as if stopped by SIGTERM
    with pytest.raises(ConfigError, match=rf"^resume=auto: dataset.path file {path} changed"):
        train(compose_cfg(*data, "loop.epochs=2"), run_dir=run_dir)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "preempted"


def test_synthetic_classes_in_the_billions_are_one_line_from_the_command_line(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(
        "dataset=synthetic",
        "dataset.num_classes=2000000000",
        "dataset.shape=[2]",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("tfrecipe:")]
    assert len(lines) == 1 and re.search(BILLIONS_REFUSED, lines[0]), lines
    assert not run_dir.exists()
