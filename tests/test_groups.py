"""Every option of every config group: composed, validated, and trained tiny in-process.

The options are read from conf/<group>/*.yaml, so a new option is covered as soon as it exists;
what each run must show is what a user would notice (summary.json, files in the run dir).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import pytest
from conftest import REPO, TINY
from omegaconf import OmegaConf

from tests.helpers.configs import validate
from tfrecipe.train import TrainingError

CONF = REPO / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())
OPTIONS = [(group, p.stem) for group in GROUPS for p in sorted((CONF / group).glob("*.yaml"))]
DEFAULTS = {"strategy": "default", "model": "cnn", "loop": "fit"}

# Options that cannot train inside this one test process, and why.
_WITH_MULTI_WORKER = "tested with the multi-worker strategies, on real local clusters"
NOT_IN_PROCESS = {
    ("cluster", "local"): f"starts a cluster of worker processes ({_WITH_MULTI_WORKER})",
    ("cluster", "slurm"): f"joins the processes of a SLURM job ({_WITH_MULTI_WORKER})",
    ("cluster", "tf_config"): f"joins the cluster TF_CONFIG describes ({_WITH_MULTI_WORKER})",
    ("cluster", "k8s"): "joins the pods of an indexed Job (tests/test_k8s.py: two real processes)",
    ("strategy", "parameter_server"): "needs parameter servers (tests/test_parameter_server.py)",
    ("strategy", "tpu"): "needs a TPU (tests/test_tpu.py: refused without one)",
    ("model", "text"): "needs text data (none is bundled): tests/test_text.py trains it",
}
# Values an option needs before it validates: cluster options only make sense with a strategy
# that spans workers; the user's own data formats need the user's files (`???` in their YAML).
VALIDATE_WITH = {
    **{
        (c, name): ["strategy=multi_worker_mirrored"]
        for c, name in NOT_IN_PROCESS
        if c == "cluster"
    },
    ("strategy", "parameter_server"): ["loop=custom", "cluster=local", "cluster.num_ps=1"],
    ("dataset", "npz"): ["dataset.path=/data/train.npz"],
    ("dataset", "image_folder"): ["dataset.path=/data/pictures"],
    ("dataset", "csv"): ["dataset.path=/data/table.csv", "dataset.label=y"],
    ("dataset", "parquet"): ["dataset.path=/data/table.parquet", "dataset.label=y"],
    ("dataset", "text_folder"): ["dataset.path=/data/reviews"],
    ("dataset", "tfds"): ["dataset.name=mnist"],
    ("dataset", "tfrecord"): [
        "dataset.train_files=/data/*.tfrecord",
        "dataset.feature_shape=[8,8,1]",
        "dataset.num_classes=2",
    ],
}

# Smaller models: the same code paths, a fraction of the time.
SMALL_MODEL = {
    "cnn": ["model.filters=[8]", "model.dense_units=16"],
    "mlp": ["model.hidden_units=[16]"],
    "resnet": ["model.stage_filters=[4,8]", "model.blocks_per_stage=1"],
    "keras_app": ["model.input_size=32", "+model.options={alpha: 0.75, minimalistic: true}"],
}
# Extra overrides an option needs for a tiny in-process run on this CPU-only machine.
RUN_WITH = {
    ("strategy", "mirrored"): ["strategy.logical_cpus=2"],
    ("strategy", "central_storage"): ["strategy.logical_cpus=2"],
    # float16/bfloat16 would be refused on hardware that only emulates them (tested in test_cli).
    ("precision", "mixed_float16"): ["precision.require_native=false"],
    ("precision", "mixed_bfloat16"): ["precision.require_native=false"],
    ("logger", "csv"): ["logger.csv.every_n_steps=1"],
    ("logger", "wandb"): ["logger.wandb.mode=offline"],
    # Each task on generated images with its kind of targets; each tabular set with its task.
    ("task", "binary"): ["dataset=synthetic", "dataset.shape=[8,8,1]", "dataset.targets=binary"],
    ("task", "multilabel"): [
        "dataset=synthetic",
        "dataset.shape=[8,8,1]",
        "dataset.targets=multi_hot",
    ],
    ("task", "regression"): [
        "dataset=synthetic",
        "dataset.shape=[8,8,1]",
        "dataset.targets=regression",
    ],
    ("dataset", "breast_cancer"): ["task=binary"],
    ("dataset", "diabetes"): ["task=regression"],
    # baselines are fitted on tables: the bundled wine set's vectors (3 classes)
    ("baseline", "auto"): ["dataset=wine"],
}
# Tabular datasets (feature vectors): trained with model=mlp.
VECTOR_DATASETS = {"breast_cancer": 30, "diabetes": 10, "wine": 13}
# The metric each task reports beside the loss (tfrecipe.tasks.main_metric).
MAIN_METRIC = {"binary": "auc", "multilabel": "f1_macro", "regression": "mae"}
REPLICAS = {"mirrored": 2, "central_storage": 2}  # with strategy.logical_cpus=2; others: 1
EPOCHS, STEPS_PER_EPOCH, PER_REPLICA_BATCH = 2, 3, 16
SUMMARY_FIELDS = {
    "status",
    "strategy",
    "num_replicas",
    "loop",
    "global_batch_size",
    "epochs_completed",
    "steps_completed",
    "resumed_from_step",
    "metrics",
    "test",
    "examples_per_sec",
    "wall_time_s",
}


def overrides_for(group: str, option: str, *extra: str) -> list[str]:
    """The tiny overrides for a run with `group=option` (a small model of the run's kind)."""
    model = option if group == "model" else "cnn"
    if (group == "dataset" and option in VECTOR_DATASETS) or (group, option) == (
        "baseline",
        "auto",
    ):
        model = "mlp"
    return [
        f"{group}={option}",
        *([f"model={model}"] if group != "model" else []),
        *TINY,
        *SMALL_MODEL.get(model, []),
        *RUN_WITH.get((group, option), []),
        *extra,
    ]


def load_yaml(group: str, option: str):
    return OmegaConf.load(CONF / group / f"{option}.yaml")


@pytest.fixture(autouse=True)
def _wandb_stays_local(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


def test_the_groups_are_the_public_ones():
    public = {"strategy", "model", "dataset", "precision", "batching", "optimizer", "loop"}
    public |= {"callbacks", "logger", "cluster"}
    assert public <= set(GROUPS), public - set(GROUPS)


# --- compose and validate -------------------------------------------------------------------
@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_validates(compose_cfg, group, option):
    overrides = [*overrides_for(group, option), *VALIDATE_WITH.get((group, option), [])]
    cfg = compose_cfg(*overrides, tiny=False)
    run = validate(cfg)
    # The option's own values reach the typed config (except those the test overrides).
    section = getattr(run, group).model_dump(by_alias=True)
    own = OmegaConf.to_container(load_yaml(group, option))
    own.pop("defaults", None)
    if group == "logger":  # each logger option switches on its own sub-section
        assert {name for name, value in section.items() if value is not None} == set(own)
        return
    overridden = {o.split("=")[0] for o in overrides}
    for key, value in own.items():
        if f"{group}.{key}" not in overridden:
            assert_contains(section[key], value, f"{group}.{key}")


def assert_contains(actual, expected, key: str) -> None:
    """`actual` holds every value of `expected` (the schema may add defaults to nested nodes)."""
    if isinstance(expected, dict):
        for name, value in expected.items():
            assert_contains(actual[name], value, f"{key}.{name}")
    elif expected == "auto" and key.endswith(".monitor"):
        assert actual != "auto", f"{key}: auto was not resolved to the task's monitor"
    else:
        assert actual == expected, f"{key}: {actual!r} != {expected!r}"


# --- tiny training run per option -------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_trains(train_run, tmp_path, group, option):
    if (group, option) in NOT_IN_PROCESS:
        pytest.skip(f"{group}={option}: {NOT_IN_PROCESS[group, option]}")
    if reason := _needs_external_data(group, option):
        pytest.skip(f"{group}={option}: {reason}")
    probe = tmp_path / "probe.json"
    overrides = overrides_for(group, option, *probing(probe))

    summary, run_dir = train_run(*overrides, tiny=False)

    assert summary["status"] == "completed"
    assert summary == json.loads((run_dir / "summary.json").read_text())
    assert set(summary) >= SUMMARY_FIELDS
    assert summary["epochs_completed"] == EPOCHS
    assert summary["steps_completed"] == EPOCHS * STEPS_PER_EPOCH
    task = next((o[5:] for o in overrides if o.startswith("task=")), "classification")
    metric = MAIN_METRIC.get(task, "accuracy")
    assert math.isfinite(summary["metrics"]["loss"]) and f"val_{metric}" in summary["metrics"]
    assert metric in summary["test"]
    replicas = REPLICAS.get(option, 1) if group == "strategy" else 1
    assert summary["num_replicas"] == replicas
    assert summary["global_batch_size"] == summary["per_replica_batch_size"] * replicas
    CHECKS.get(group, lambda *_: None)(option, json.loads(probe.read_text()), run_dir)


def probing(path: Path) -> list[str]:
    """Overrides that add helpers.run_probe.RunProbe: what ran, written to `path`."""
    return [
        "+callbacks.extra.probe._target_=helpers.run_probe.RunProbe",
        f"+callbacks.extra.probe.path={path}",
        "allowed_targets=[helpers]",
    ]


def _needs_external_data(group: str, option: str) -> str | None:
    """Why a dataset option cannot train offline without the user's data (None: it can)."""
    if group != "dataset":
        return None
    spec = load_yaml(group, option)
    if spec._target_.startswith("tfrecipe.data.tfds."):
        return (
            "reads TFDS data prepared beforehand (tfrecipe never downloads); trained under "
            "tfds.testing.mock_data by tests/test_data.py::test_tfds_options_train"
        )
    if missing := sorted(OmegaConf.missing_keys(spec)):
        return (
            f"reads the user's files ({', '.join(missing)}); trained on files the tests write "
            "by tests/test_data.py::test_user_file_options_train"
        )
    return None


# Each check gets what RunProbe recorded and the run dir, and asserts the option took effect.
# The public tf.distribute classes of each strategy option (default: none of them).
STRATEGY_CLASSES = {
    "default": [],
    "one_device": ["OneDeviceStrategy"],
    "mirrored": ["MirroredStrategy"],
    "central_storage": ["CentralStorageStrategy"],
    "multi_worker_mirrored": ["MultiWorkerMirroredStrategy"],
}


def _check_strategy(option, probe, run_dir):
    assert probe["strategies"] == STRATEGY_CLASSES[option]


def _layer_kinds(run_dir: Path) -> set[str]:
    import keras

    model = keras.saving.load_model(run_dir / "model.keras")
    return {type(layer).__name__ for layer in model.layers}


def _check_model(option, probe, run_dir):
    kinds = _layer_kinds(run_dir)
    assert ("Conv2D" in kinds) == (option not in ("mlp", "linear")), kinds
    assert ("Add" in kinds) == (option == "resnet"), kinds  # the residual connections


def _check_dataset(option, probe, run_dir):
    """The model was built for this dataset's examples and classes."""
    import keras

    from tfrecipe.tasks import register_custom_objects

    spec = load_yaml("dataset", option)
    shape = tuple(spec.get("shape") or (8, 8, 1))  # digits: 8x8 grey images
    if option in VECTOR_DATASETS:
        shape = (VECTOR_DATASETS[option],)
    register_custom_objects()
    model = keras.saving.load_model(run_dir / "model.keras")
    assert model.input_shape[1:] == shape
    heads = {"breast_cancer": 1, "diabetes": 1, "wine": 3}  # binary, regression, 3 classes
    assert model.output_shape[-1] == heads.get(option, spec.get("num_classes", 10))


def _check_task(option, probe, run_dir):
    """The head's width follows the task (synthetic data: 10 clusters)."""
    import keras

    from tfrecipe.tasks import register_custom_objects

    register_custom_objects()
    model = keras.saving.load_model(run_dir / "model.keras")
    heads = {"classification": 10, "binary": 1, "multilabel": 10, "regression": 1}
    assert model.output_shape[-1] == heads[option]


def _check_precision(option, probe, run_dir):
    import keras

    from tfrecipe.precision import resolve_policy

    # auto as this machine resolves it
    policy = resolve_policy(load_yaml("precision", option).policy, {"CPU"})
    model = keras.saving.load_model(run_dir / "model.keras")
    hidden = [layer for layer in model.layers if layer.weights and layer.name != "logits"]
    assert {layer.dtype_policy.name for layer in hidden} == {policy}
    assert model.get_layer("logits").dtype_policy.name == "float32"  # the output stays float32
    assert model.output.dtype == "float32"


def _check_batching(option, probe, run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    fixed = load_yaml("batching", option).get("global_batch_size")
    assert summary["global_batch_size"] == (fixed or PER_REPLICA_BATCH)


def _check_optimizer(option, probe, run_dir):
    """The saved model's optimizer is this one, at its learning rate, and took every step."""
    import keras

    spec = load_yaml("optimizer", option)
    optimizer = keras.saving.load_model(run_dir / "model.keras").optimizer
    assert type(optimizer).__name__.lower() == spec.name
    learning_rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    assert learning_rate == pytest.approx(spec.learning_rate)
    assert int(optimizer.iterations) == EPOCHS * STEPS_PER_EPOCH


def _check_loop(option, probe, run_dir):
    assert probe["fit"] == (option == "fit")


def _check_callbacks(option, probe, run_dir):
    spec = load_yaml("callbacks", option)
    assert (run_dir / "best.weights.h5").exists() == spec.model_checkpoint.enabled


def _check_logger(option, probe, run_dir):
    assert_logger_files(set(load_yaml("logger", option)), run_dir)


CHECKS = {
    "strategy": _check_strategy,
    "model": _check_model,
    "dataset": _check_dataset,
    "precision": _check_precision,
    "batching": _check_batching,
    "optimizer": _check_optimizer,
    "loop": _check_loop,
    "callbacks": _check_callbacks,
    "logger": _check_logger,
    "task": _check_task,
}


# --- logger files -------------------------------------------------------------------------------
def assert_logger_files(loggers: set[str], run_dir: Path) -> None:
    steps = run_dir / "steps.csv"
    assert steps.exists() == ("csv" in loggers)
    if "csv" in loggers:
        with open(steps, newline="") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["step"]) for r in rows] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
        assert {"step", "epoch", "learning_rate", "loss", "accuracy"} <= set(rows[0])
    board = run_dir / "tensorboard"
    assert board.exists() == ("tensorboard" in loggers)
    if "tensorboard" in loggers:
        for split in ("train", "validation"):
            assert list((board / split).glob("events.out.tfevents.*")), f"no {split} events"
    if "wandb" in loggers:
        assert list((run_dir / "wandb").glob("offline-run-*")), "no offline W&B run files"
    if "mlflow" in loggers:  # the default store: a sqlite file in the run dir (test_mlflow.py)
        assert (run_dir / "mlflow" / "run.json").is_file() and (run_dir / "mlflow.db").is_file()


@pytest.mark.slow
def test_several_loggers_at_once(train_run):
    summary, run_dir = train_run(
        "logger=[csv,tensorboard]", "logger.csv.every_n_steps=1", *SMALL_MODEL["cnn"]
    )
    assert summary["status"] == "completed"
    assert_logger_files({"csv", "tensorboard"}, run_dir)


def test_tensorboard_logs_steps_at_the_optimizer_step_as_steps_csv(train_run):
    """update_freq=2 with 2 steps per call: TensorBoard's batch_loss at steps 2, 4, ..., 16 with
    steps.csv's losses (Keras' own counted calls: steps 2, 4, 6, 8 holding steps 4, 8, 12, 16)."""
    import tensorflow as tf

    summary, run_dir = train_run(
        "logger=[csv,tensorboard]",
        "logger.csv.every_n_steps=2",
        "logger.tensorboard.update_freq=2",
        "loop.steps_per_epoch=8",
    )
    assert summary["steps_per_execution"] == 2
    with open(run_dir / "steps.csv", newline="") as f:
        expected = {int(row["step"]): float(row["loss"]) for row in csv.DictReader(f)}
    logged = {}
    for events in (run_dir / "tensorboard" / "train").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                if value.tag == "batch_loss":
                    logged[event.step] = float(tf.make_ndarray(value.tensor))
    assert sorted(logged) == list(range(2, 17, 2)) == sorted(expected)
    assert logged == pytest.approx(expected)


# --- batching: the global batch and the learning-rate scaling rule ---------------------------------
@pytest.mark.slow
def test_global_batch_is_per_replica_times_replicas(train_run):
    summary, _ = train_run("strategy=mirrored", "strategy.logical_cpus=2", *SMALL_MODEL["cnn"])
    assert summary["num_replicas"] == 2
    assert (summary["per_replica_batch_size"], summary["global_batch_size"]) == (16, 32)


@pytest.mark.slow
def test_a_fixed_global_batch_is_split_over_the_replicas(train_run):
    summary, _ = train_run(
        "strategy=mirrored",
        "strategy.logical_cpus=2",
        "batching=global",
        "batching.global_batch_size=48",
        *SMALL_MODEL["cnn"],
    )
    assert (summary["per_replica_batch_size"], summary["global_batch_size"]) == (24, 48)


def _learning_rates(run_dir: Path) -> list[float]:
    with open(run_dir / "steps.csv", newline="") as f:
        return [float(row["learning_rate"]) for row in csv.DictReader(f)]


@pytest.mark.slow
@pytest.mark.parametrize(("rule", "factor"), [("none", 1.0), ("linear", 2.0), ("sqrt", 2**0.5)])
def test_learning_rate_scaling_rule(train_run, rule, factor):
    base = 0.001
    summary, run_dir = train_run(
        "strategy=mirrored",
        "strategy.logical_cpus=2",  # global batch 32 = 2 x the reference (per-replica) batch 16
        f"batching.lr_scaling={rule}",
        f"optimizer.learning_rate={base}",
        "logger.csv.every_n_steps=1",
        *SMALL_MODEL["cnn"],
    )
    assert summary["learning_rate"] == pytest.approx(base * factor)
    # ... and it is the rate the optimizer actually used.
    assert _learning_rates(run_dir) == pytest.approx([base * factor] * 6)


@pytest.mark.slow
def test_learning_rate_scaling_against_a_reference_batch(train_run):
    summary, _ = train_run(
        "batching.lr_scaling=linear",
        "batching.lr_reference_batch_size=64",
        "optimizer.learning_rate=0.004",
        *SMALL_MODEL["cnn"],
    )
    assert summary["learning_rate"] == pytest.approx(0.004 * 16 / 64)


# --- optimizer schedules ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [p.stem for p in sorted((CONF / "optimizer").glob("*.yaml"))])
@pytest.mark.parametrize("schedule", ["constant", "cosine", "warmup_cosine"])
def test_learning_rate_schedules(train_run, optimizer, schedule):
    lr, total = 0.002, EPOCHS * STEPS_PER_EPOCH
    summary, run_dir = train_run(
        f"optimizer={optimizer}",
        f"optimizer.schedule={schedule}",
        f"optimizer.learning_rate={lr}",
        "optimizer.warmup_steps=3",
        "optimizer.min_lr_fraction=0.1",
        "logger.csv.every_n_steps=1",
        *SMALL_MODEL["cnn"],
    )
    assert summary["status"] == "completed"
    rates = _learning_rates(run_dir)  # after each step: the rate for the next one
    assert len(rates) == total
    if schedule == "constant":
        assert rates == pytest.approx([lr] * total)
    elif schedule == "cosine":
        assert all(a > b for a, b in itertools.pairwise(rates))
        assert rates[0] < lr and rates[-1] == pytest.approx(0.1 * lr)
    else:  # linear warm-up over 3 steps to lr, then cosine decay
        assert rates[:3] == pytest.approx([lr / 3, 2 * lr / 3, lr])
        assert all(a > b for a, b in itertools.pairwise(rates[2:]))
        assert rates[-1] == pytest.approx(0.1 * lr)


# --- callbacks: each switch on and off ---------------------------------------------------------------
def _switches() -> list[str]:
    spec = load_yaml("callbacks", "default")
    return sorted(k for k, v in spec.items() if OmegaConf.is_dict(v) and "enabled" in v)


def _checkpoint(train_run, enabled, tmp_path, capfd):
    _, run_dir = train_run(f"callbacks.model_checkpoint.enabled={enabled}", *SMALL_MODEL["cnn"])
    assert (run_dir / "best.weights.h5").exists() == enabled


def _early_stopping(train_run, enabled, tmp_path, capfd):
    # No epoch can improve val_loss by 10: with patience 1 the second epoch is the last.
    summary, _ = train_run(
        f"callbacks.early_stopping.enabled={enabled}",
        "callbacks.early_stopping.patience=1",
        "callbacks.early_stopping.min_delta=10",
        "loop.epochs=5",
        *SMALL_MODEL["cnn"],
    )
    assert summary["status"] == "completed"
    assert summary["epochs_completed"] == (2 if enabled else 5)
    assert summary["steps_completed"] == summary["epochs_completed"] * STEPS_PER_EPOCH


def _terminate_on_nan(train_run, enabled, tmp_path, capfd):
    # A learning rate this large makes the loss overflow within a few steps.
    with pytest.raises(TrainingError, match="loss became"):
        train_run(
            f"callbacks.terminate_on_nan.enabled={enabled}",
            "optimizer=sgd",
            "optimizer.learning_rate=1e30",
            "loop.epochs=3",
            *SMALL_MODEL["cnn"],
        )
    (summary_file,) = tmp_path.glob("run*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["status"] == "failed"
    total = 3 * STEPS_PER_EPOCH
    assert (summary["steps_completed"] < total) == enabled, summary["steps_completed"]


def _progress(train_run, enabled, tmp_path, capfd):
    train_run(f"callbacks.progress.enabled={enabled}", "loop.verbose=2", *SMALL_MODEL["cnn"])
    out = capfd.readouterr().out
    assert ("Epoch 1/2" in out and "Epoch 2/2" in out) == enabled, out[-2000:]


def _backup(train_run, enabled, tmp_path, capfd):
    train_run(f"callbacks.backup.enabled={enabled}", *SMALL_MODEL["cnn"])
    (run_dir,) = tmp_path.glob("run*")
    assert bool(list(run_dir.glob("backup/ckpt-*.index"))) == enabled


SWITCH_CHECKS = {
    "backup": _backup,
    "model_checkpoint": _checkpoint,
    "early_stopping": _early_stopping,
    "terminate_on_nan": _terminate_on_nan,
    "progress": _progress,
}


def test_every_callback_switch_has_a_check():
    assert set(_switches()) == set(SWITCH_CHECKS)


@pytest.mark.slow
@pytest.mark.parametrize("enabled", [True, False], ids=["on", "off"])
@pytest.mark.parametrize("switch", _switches())
def test_callback_switch(train_run, tmp_path, capfd, switch, enabled):
    SWITCH_CHECKS[switch](train_run, enabled, tmp_path, capfd)
