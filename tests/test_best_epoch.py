"""The best epoch in summary.json and `compare`; best.weights.h5 survives a resume
(keras-team/keras#17012: Keras' restarted checkpoint forgets the earlier best)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from test_backup import BACKUP, _interrupted_at, train_in  # noqa: F401 (fixture)

from tfrecipe.cli.main import main


def test_summary_and_compare_give_the_best_and_the_stopped_epoch(train_run, capsys):
    summary, run_dir = train_run(
        "model=mlp",
        "loop.epochs=6",
        "callbacks.early_stopping.enabled=true",
        "callbacks.early_stopping.patience=0",
        "callbacks.early_stopping.min_delta=10",
    )  # no epoch improves by 10: stops after the second
    rows = list(csv.DictReader(io.StringIO((run_dir / "history.csv").read_text())))
    assert summary["epochs_completed"] == len(rows) == 2
    assert summary["stopped_epoch"] == 2
    best = min(rows, key=lambda r: float(r["val_loss"]))
    assert summary["best"]["epoch"] == int(best["epoch"])
    assert summary["best"]["monitor"] == "val_loss"
    assert summary["best"]["metrics"]["val_accuracy"] == pytest.approx(float(best["val_accuracy"]))

    main(["compare", str(run_dir)])
    header, row = list(csv.reader(io.StringIO((run_dir / "compare.csv").read_text())))[:2]
    shown = dict(zip(header, row, strict=True))
    assert shown["best_epoch"] == best["epoch"] and shown["stopped_epoch"] == "2"
    assert float(shown["best_val_loss"]) == pytest.approx(float(best["val_loss"]), rel=1e-3)
    capsys.readouterr()


def test_a_resumed_run_never_overwrites_the_best_weights_with_a_worse_epoch(train_in, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    train_in(run_dir, *BACKUP, "model=mlp")
    _interrupted_at(run_dir, 5)  # after epoch 1, which (say) was far better than epoch 2 will be
    history = (run_dir / "history.csv").read_text().splitlines()
    header = history[0].split(",")
    epoch1 = dict(zip(header, history[1].split(","), strict=True)) | {"val_loss": "0.001"}
    (run_dir / "history.csv").write_text(",".join(header) + "\n" + ",".join(epoch1.values()) + "\n")
    before = (run_dir / "best.weights.h5").read_bytes()

    resumed = train_in(run_dir, *BACKUP, "model=mlp")
    assert resumed["resumed_from_step"] == 5
    assert (run_dir / "best.weights.h5").read_bytes() == before  # epoch 2 was worse
    assert resumed["best"]["epoch"] == 1 and resumed["best"]["value"] == pytest.approx(0.001)


def test_the_checkpoint_saves_the_averaged_weights_under_ema_and_no_optimizer_state(train_run):
    import h5py
    import keras

    _, run_dir = train_run("model=mlp", "optimizer.ema=true", "loop.epochs=1")
    # Keras 3's save_weights adds the optimizer's slots (Adam: two per weight, the file 2.7x
    # larger): the best epoch's weights are what evaluate and predict load, a resume reads the
    # backup.
    with h5py.File(run_dir / "best.weights.h5", "r") as saved:
        assert set(saved) == {"layers", "vars"}
    model = keras.saving.load_model(run_dir / "model.keras")
    final = [np.asarray(w) for w in model.get_weights()]
    model.load_weights(run_dir / "best.weights.h5")  # one epoch: the best is the last
    for got, want in zip(model.get_weights(), final, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert json.loads((run_dir / "summary.json").read_text())["best"]["epoch"] == 1
