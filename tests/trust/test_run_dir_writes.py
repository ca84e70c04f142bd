"""Every file a run writes is the run's (tfrecipe/files.py): written through the one writer, or
inside a folder the run listed in its manifest before a library filled it (`files.library_dir`).
So a received run dir cannot aim a write elsewhere, and a new writer that bypasses the one writer
shows up here as a file the manifest does not own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_backup import _interrupted_at

from tfrecipe import files

# Every writer a run has, on: logs, TensorBoard, backups, the best weights, periodic exports.
ALL_WRITERS = [
    "loop.epochs=2",
    "loop.steps_per_epoch=3",
    "loop.verbose=0",
    "batching.per_replica_batch_size=16",
    "model=mlp",
    "logger=[csv,tensorboard]",
    "logger.csv.every_n_steps=1",
    "callbacks.backup.enabled=true",
    "callbacks.backup.every_n_steps=2",
    "callbacks.backup.max_to_keep=10",
    "callbacks.export.every_n_epochs=1",
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    from tfrecipe.config.compose import compose
    from tfrecipe.config.trust import Trust
    from tfrecipe.train import train

    run_dir = tmp_path_factory.mktemp("writes") / "run"
    summary = train(compose(ALL_WRITERS), run_dir=run_dir, trust=Trust.from_command_line([]))
    assert summary["status"] == "completed"
    return run_dir


def test_every_file_a_run_writes_is_listed_in_its_manifest(finished_run):
    written = [p for p in finished_run.rglob("*") if p.name != files.MANIFEST]
    assert {"best.weights.h5", "steps.csv", "backup", "tensorboard"} <= {p.name for p in written}
    not_the_runs = [
        str(p.relative_to(finished_run))
        for p in written
        if not files.Manifest.of(finished_run).owns(p)
    ]
    assert not not_the_runs, (
        "written without tfrecipe.files (write_atomic, replace_with, write_weights, open_log, "
        f"library_dir): {not_the_runs}"
    )


@pytest.mark.parametrize(
    "planted", ["best.weights.h5", "steps.csv", "tensorboard", "backup", "tensorboard/train"]
)
def test_a_received_run_dir_with_a_link_out_is_refused_before_anything_is_written(
    finished_run, tmp_path, cli, planted
):
    """A run dir someone sent, with one of the names a run writes linked to a file of yours:
    resuming it is refused at once (exit 2, one line), and your file is untouched."""
    received = tmp_path / "received"
    shutil.copytree(finished_run, received, symlinks=True)
    _interrupted_at(received, 2)  # a failed run, which the same command resumes
    yours = tmp_path / "yours"
    if (received / planted).is_dir():
        shutil.rmtree(received / planted)
        yours.mkdir()
    else:
        (received / planted).unlink()
        yours.write_text("your file\n")
    (received / planted).symlink_to(yours)
    before = sorted(os.listdir(received))

    done = cli(*ALL_WRITERS, f"hydra.run.dir={received}")

    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{planted} is a link to {yours}" in done.stderr
    assert "Traceback" not in done.stderr
    assert (yours.is_dir() and not any(yours.iterdir())) or yours.read_text() == "your file\n"
    assert sorted(os.listdir(received)) == before


def test_links_that_stay_inside_or_are_w_and_bs_own_are_left_alone_a_fifo_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "wandb" / "run-1").mkdir(parents=True)
    (run_dir / "wandb" / "latest-run").symlink_to("run-1")  # W&B's own links
    (run_dir / "wandb" / "run-1" / "debug-core.log").symlink_to(tmp_path / "wandb-cache.log")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "latest").symlink_to("../wandb")  # a link that stays inside
    files.check_tree(run_dir)
    (run_dir / "logs" / "out").symlink_to(tmp_path)
    with pytest.raises(files.NotOurs, match="logs/out is a link to"):
        files.check_tree(run_dir)
    (run_dir / "logs" / "out").unlink()
    os.mkfifo(run_dir / "wandb" / "run-1" / "events")
    with pytest.raises(files.NotOurs, match="wandb/run-1/events is not a regular file"):
        files.check_tree(run_dir)


def test_a_log_is_a_new_file_never_one_linked_or_hard_linked_elsewhere(tmp_path):
    yours = tmp_path / "yours.txt"
    yours.write_text("your file\n")
    os.link(yours, tmp_path / "hard.csv")
    with files.open_log(tmp_path / "hard.csv", "kept\n") as log:
        log.write("row\n")
    assert (tmp_path / "hard.csv").read_text() == "kept\nrow\n"
    assert yours.read_text() == "your file\n"
    (tmp_path / "soft.csv").symlink_to(yours)
    with pytest.raises(files.NotOurs, match="symbolic link"):
        files.open_log(tmp_path / "soft.csv")
    assert yours.read_text() == "your file\n"


def test_the_best_weights_are_replaced_whole_only_by_a_better_scored_epoch(tmp_path, monkeypatch):
    import keras

    from tfrecipe import compat
    from tfrecipe.callbacks import BestCheckpoint

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    path = tmp_path / "best.weights.h5"
    best = BestCheckpoint(path, monitor="val_loss", mode="min", best_so_far=None)
    best.set_model(model)
    best.on_epoch_end(0, {"val_loss": 1.0})
    best.on_train_end()  # the file is on disk (a thread writes it)
    first = path.read_bytes()
    model.set_weights([w + 1 for w in model.get_weights()])
    best.on_epoch_end(1, {"loss": 0.1})  # not validated: not scored
    best.on_epoch_end(2, {"val_loss": 1.0})  # equal: the first of equals stays
    best.on_epoch_end(3, {"val_loss": float("nan")})
    best.on_train_end()
    assert path.read_bytes() == first

    store = compat.saving_private

    def dies_mid_write(scratch, mode):  # a kill while h5py writes: half a file
        Path(scratch).write_bytes(b"\x89HDF half")
        raise KeyboardInterrupt

    monkeypatch.setattr(
        compat,
        "saving_private",
        lambda name: dies_mid_write if name == "H5IOStore" else store(name),
    )
    with pytest.raises(KeyboardInterrupt):
        best.on_epoch_end(4, {"val_loss": 0.5})
        best.on_train_end()
    assert path.read_bytes() == first, "the previous best survives a crash mid-save"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.weights.h5"], "no scratch left"
    restored = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    restored.load_weights(path)
    assert not np.array_equal(restored.get_weights()[0], model.get_weights()[0])


def test_the_disk_reserve_is_a_file_of_its_own(tmp_path):
    """A `.reserve` left in a run dir (a crash's; a hard link in a received one) is removed, not
    grown to the reserve's size."""
    from tfrecipe.fault import disk

    yours = tmp_path / "yours.txt"
    yours.write_text("your file\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.link(yours, run_dir / disk.RESERVE)
    disk.reserve(run_dir)
    assert yours.read_text() == "your file\n"
    assert (run_dir / disk.RESERVE).stat().st_size == disk.RESERVE_BYTES
    disk.release(run_dir)


def test_a_sweep_never_replaces_files_of_its_records_names_that_it_did_not_write(cli, tmp_path):
    """The probe: a shared recipe's `hydra.sweep.dir` named a folder of the user's, and the sweep
    replaced its multirun.yaml (Hydra's record) and sweep.png (tfrecipe's report). Refused
    before Hydra writes anything, as a run dir holding a run's file names but no run is."""
    from conftest import TINY

    folder = tmp_path / "mine"
    folder.mkdir()
    for name in ("multirun.yaml", "sweep.png"):
        (folder / name).write_text("precious\n")
    recipe = tmp_path / "shared.yaml"
    recipe.write_text(f"# @package _global_\nhydra:\n  sweep:\n    dir: {folder}\n")

    result = cli("-m", f"recipe={recipe}", *TINY, "model=mlp", "seed=1")

    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("tfrecipe:")]
    assert f"hydra.sweep.dir={folder}: holds multirun.yaml, sweep.png" in line, line
    assert sorted(p.name for p in folder.iterdir()) == ["multirun.yaml", "sweep.png"]
    assert all((folder / n).read_text() == "precious\n" for n in ("multirun.yaml", "sweep.png"))


def test_a_sweep_dir_a_sweep_wrote_is_taken_again(tmp_path):
    """A rerun resumes a sweep in its own dir: its records are on the dir's manifest (claimed
    before Hydra writes them), or the dir holds a sweep.json (a version that kept no manifest)."""
    from tfrecipe.cli.precheck import claim_sweep_dir

    listed = tmp_path / "listed"
    claim_sweep_dir(listed)  # a first sweep there
    (listed / "multirun.yaml").write_text("hydra: {}\n")
    claim_sweep_dir(listed)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in ("multirun.yaml", "sweep.json", "sweep.png"):
        (earlier / name).write_text("{}\n")
    claim_sweep_dir(earlier)
    assert "multirun.yaml" in files.Manifest.of(earlier).owned()
