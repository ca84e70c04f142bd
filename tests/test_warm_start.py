"""`model.init_from`: a new run starts from what an earlier run wrote (run dir, model.keras,
*.weights.h5, a backup), body loaded, a different head skipped, and it learns faster for it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY
from helpers.failing_callback import fail_after_first_epoch

from tfrecipe.config.grants import Grants
from tfrecipe.config.trust import Trust

# The first six digits to pretrain on, the other four to fine-tune on: a head of another size.
PRETRAIN = "dataset.classes=[0,1,2,3,4,5]"
FINETUNE = "dataset.classes=[6,7,8,9]"
FAST = ["loop.verbose=0", "logger=[]", "batching.per_replica_batch_size=32"]
CNN_TENSORS = 12  # 4 convolutions, the dense layer and the head: a kernel and a bias each


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A finished cnn run on digits 0-5, with a backup and best.weights.h5 beside model.keras."""
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    run_dir = tmp_path_factory.mktemp("warm") / "pretrained"
    # Four passes (~10 s): features good enough that the fine-tuning gain is not luck.
    cfg = compose([*FAST, PRETRAIN, "loop.epochs=4", "callbacks.backup.enabled=true"])
    assert train(cfg, run_dir=run_dir)["status"] == "completed"
    return run_dir


@pytest.mark.slow  # three real trainings (the pretraining is shared with the tests below)
def test_init_from_a_run_loads_the_body_skips_the_head_and_learns_faster(pretrained, train_run):
    one_epoch = [*FAST, FINETUNE, "loop.epochs=1", "loop.steps_per_epoch=10"]

    scratch, _ = train_run(*one_epoch, tiny=False)
    warm, run_dir = train_run(*one_epoch, f"model.init_from={pretrained}", tiny=False)

    assert warm["init_from"] == {
        "path": str(pretrained),
        "loaded": CNN_TENSORS - 2,
        "skipped": 2,  # the head: 6 classes there, 4 here
        "new": 0,
    }
    assert json.loads((run_dir / "summary.json").read_text())["init_from"] == warm["init_from"]
    assert warm["steps_completed"] == 10, "init_from is not resume: the step starts at 0"
    # measured: 0.93 from the pretrained body, 0.48 from scratch (an Intel Xeon); 0.97 and 0.88
    # (an AMD EPYC without AVX-512, whose kernels round otherwise): at most half the errors
    errors = {
        name: 1 - run["test"]["accuracy"] for name, run in (("warm", warm), ("scratch", scratch))
    }
    assert errors["warm"] < errors["scratch"] / 2, (warm, scratch)


def _fresh_cnn(num_outputs: int):
    from tfrecipe.models import cnn

    return cnn(input_shape=(8, 8, 1), num_outputs=num_outputs)


@pytest.mark.parametrize(
    "source",
    ["run dir", "model.keras", "best.weights.h5", "backup dir", "backup checkpoint"],
)
def test_every_source_form_loads_the_trained_body(pretrained, source):
    import keras

    from tfrecipe.fault.backup import checkpoints_in
    from tfrecipe.models import warm_start

    path = {
        "run dir": pretrained,
        "model.keras": pretrained / "model.keras",
        "best.weights.h5": pretrained / "best.weights.h5",
        "backup dir": pretrained / "backup",
        "backup checkpoint": Path(checkpoints_in(pretrained / "backup")[0]),
    }[source]
    model = _fresh_cnn(num_outputs=4)

    loaded = warm_start.init_from(model, path)

    assert (loaded.loaded, len(loaded.skipped), loaded.new) == (CNN_TENSORS - 2, 2, 0)
    trained = keras.saving.load_model(pretrained / "model.keras", compile=False)
    first_conv = next(layer for layer in model.layers if layer.weights)
    trained_conv = next(layer for layer in trained.layers if layer.weights)
    if source != "best.weights.h5":  # the best epoch's weights, not the last's
        np.testing.assert_array_equal(first_conv.kernel.numpy(), trained_conv.kernel.numpy())
    assert not np.array_equal(first_conv.kernel.numpy(), _fresh_cnn(4).layers[1].kernel.numpy())


@pytest.mark.slow  # two mirrored runs, each compiling for two replicas
@pytest.mark.parametrize("source", ["model.keras", "backup"])
def test_init_from_on_mirrored_replicas_with_the_custom_loop(pretrained, train_run, source):
    # Weights files load through Keras, backups by assigning: both must reach every replica.
    summary, _ = train_run(
        FINETUNE,
        "strategy=mirrored",
        "strategy.logical_cpus=2",
        "loop=custom",
        f"model.init_from={pretrained / source}",
    )
    assert summary["num_replicas"] == 2 and summary["status"] == "completed"
    assert (summary["init_from"]["loaded"], summary["init_from"]["skipped"]) == (10, 2)


def test_a_resumed_run_keeps_its_own_weights_not_init_from(pretrained, train_run):
    # resume continues the pretrained run's backup for one more epoch: init_from must not
    # overwrite the restored weights (it would log and record a warm start).
    steps = json.loads((pretrained / "summary.json").read_text())["steps_completed"]
    summary, _ = train_run(
        *FAST,
        PRETRAIN,
        "loop.epochs=5",
        f"resume={pretrained / 'backup'}",
        f"model.init_from={pretrained}",
        tiny=False,
    )
    assert summary["resumed_from_step"] == steps and "init_from" not in summary


def test_a_warm_started_run_resumed_after_a_failure_still_records_its_warm_start(
    pretrained, compose_cfg, tmp_path
):
    """Failed after a backup, started again in its run dir: the run restores its backup (no
    second warm start), and its summary.json still says where its first weights came from
    (it lost "init_from" at the resume)."""
    from tfrecipe.train import train

    run_dir = tmp_path / "run"
    overrides = [*FAST, FINETUNE, f"model.init_from={pretrained}", "loop.epochs=2"]
    overrides += ["loop.steps_per_epoch=4", "batching.steps_per_execution=1"]
    overrides += ["callbacks.backup.enabled=true", "callbacks.backup.every_n_steps=2"]
    fail_after_first_epoch(compose_cfg, run_dir, overrides)
    first = json.loads((run_dir / "summary.json").read_text())["init_from"]

    summary = train(
        compose_cfg(*overrides), run_dir=run_dir, trust=Trust.from_command_line(overrides)
    )

    assert summary["resumed_from_step"] == 2
    assert (
        summary["init_from"]
        == first
        == {
            "path": str(pretrained),
            "loaded": CNN_TENSORS - 2,
            "skipped": 2,
            "new": 0,
        }
    )


def _assert_refused(result, run_dir: Path, *fragments: str) -> None:
    """Exit 2, one line naming the problem, no traceback, no run dir."""
    output = f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode == 2, output
    assert "Traceback" not in result.stderr + result.stdout, output
    lines = [line for line in result.stderr.splitlines() if "model.init_from=" in line]
    assert len(lines) == 1 and all(f in lines[0] for f in fragments), output
    assert not run_dir.exists(), sorted(run_dir.rglob("*"))


def test_nothing_matching_exits_2_in_one_line(pretrained, cli, tmp_path):
    run_dir = tmp_path / "mlp"
    result = cli(*TINY, "model=mlp", f"model.init_from={pretrained}", f"hydra.run.dir={run_dir}")
    _assert_refused(result, run_dir, str(pretrained), "no tensor")


def test_a_missing_path_exits_2_naming_it(cli, tmp_path):
    run_dir, missing = tmp_path / "run", tmp_path / "nowhere" / "model.keras"
    result = cli(*TINY, f"model.init_from={missing}", f"hydra.run.dir={run_dir}")
    _assert_refused(result, run_dir, str(missing), "does not exist")


def test_validate_reports_a_bad_init_from_in_the_words_of_a_run(cli, tmp_path):
    """`tfrecipe validate` said "valid" for a model.init_from that does not exist or is no
    source: only the run found out. It now refuses it with the run's own line, exit 2; a run
    dir's model.keras or backup checkpoint passes, and resume=PATH (init_from unread) too."""
    missing = tmp_path / "nowhere" / "model.keras"
    run_dir = tmp_path / "run"
    trained = cli(*TINY, f"model.init_from={missing}", f"hydra.run.dir={run_dir}")
    _assert_refused(trained, run_dir, "does not exist")
    (run_line,) = [line for line in trained.stderr.splitlines() if "model.init_from=" in line]
    checked = cli("validate", f"model.init_from={missing}")
    _assert_refused(checked, run_dir, "does not exist")
    assert checked.stderr.strip() == run_line.strip()

    (empty := tmp_path / "empty").mkdir()
    (notes := tmp_path / "notes.txt").write_text("not weights")
    for path, words in [(empty, "holds no model.keras and no backup"), (notes, "not one of")]:
        _assert_refused(cli("validate", f"model.init_from={path}"), run_dir, str(path), words)
    (backups := tmp_path / "earlier" / "backup").mkdir(parents=True)
    (backups / "ckpt-6.index").write_bytes(b"")
    (model_dir := tmp_path / "finished").mkdir()
    (model_dir / "model.keras").write_bytes(b"")
    for source in (backups.parent, model_dir, model_dir / "model.keras"):
        valid = cli("validate", f"model.init_from={source}")
        assert valid.returncode == 0, valid.stderr
    resumed = cli("validate", f"model.init_from={missing}", f"resume={backups.parent}")
    assert resumed.returncode == 0, resumed.stderr


def test_digits_classes_picks_and_relabels_digits(compose_cfg):
    from tfrecipe.config import schema
    from tfrecipe.errors import ConfigError
    from tfrecipe.training.dataset import load_splits

    run = schema.validate(compose_cfg("dataset.classes=[7,2]"), trust=Trust.NOTHING)
    splits = load_splits(run.dataset, grants=Grants())
    labels = {int(label) for _, label in splits.train.as_numpy_iterator()}
    assert splits.info.num_classes == 2 and labels == {0, 1}
    assert splits.info.num_train < 400  # about a fifth of the 1,797 digits
    bad = schema.validate(compose_cfg("dataset.classes=[3,3]"), trust=Trust.NOTHING)
    with pytest.raises(ConfigError, match=r"dataset.classes=\[3, 3\]"):
        load_splits(bad.dataset, grants=Grants())


def test_an_unreadable_weights_file_is_a_config_error(tmp_path):
    from tfrecipe.errors import ConfigError
    from tfrecipe.models import warm_start

    broken = tmp_path / "best.weights.h5"
    broken.write_bytes(b"not hdf5")
    with pytest.raises(ConfigError, match=r"model\.init_from=.*cannot read best\.weights\.h5"):
        warm_start.init_from(_fresh_cnn(num_outputs=4), broken)
