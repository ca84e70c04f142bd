"""Two-phase fine-tuning (`loop.finetune`): the frozen body waits for the switch, then trains at
the lowered rate with a new optimizer; fit and the custom loop, one and two replicas; a run
resumed (or preempted) past the switch continues in phase two at the exact step."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.finetune_models import read_probe

from tfrecipe.config import schema
from tfrecipe.config.trust import Trust
from tfrecipe.errors import ConfigError

EPOCHS, STEPS_PER_EPOCH, SWITCH_EPOCH = 3, 3, 1
RATE, FACTOR = 0.003, 0.1

MODEL = [
    "model=mlp",
    "model._target_=helpers.finetune_models.frozen_body_mlp",
    "model.hidden_units=[16,16]",
    "allowed_targets=[helpers]",
    f"optimizer.learning_rate={RATE}",
    "optimizer.schedule=constant",
]
SLOW = pytest.mark.slow
BODY = ["body_dense_0", "body_dense_1"]
NORMS = ["body_bn_0", "body_bn_1"]


def _finetune(probe: Path, *, epochs: int = EPOCHS) -> list[str]:
    return [
        *MODEL,
        f"loop.epochs={epochs}",
        f"loop.steps_per_epoch={STEPS_PER_EPOCH}",
        f"loop.finetune.unfreeze_at_epoch={SWITCH_EPOCH}",
        f"loop.finetune.learning_rate_factor={FACTOR}",
        "+callbacks.extra.probe._target_=helpers.finetune_models.WeightProbe",
        f"+callbacks.extra.probe.path={probe}",
    ]


def _moved(rows: list[dict], layer: str) -> list[bool]:
    """Per epoch: whether `layer`'s weights changed in it (rows: the start, then each epoch)."""
    return [
        after["weights"][layer] != before["weights"][layer]
        for before, after in itertools.pairwise(rows)
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        ("loop=fit",),
        ("loop=custom",),
        # held: phase two's validation traces the new compile's metrics, not the old ones'
        ("loop=fit", "pipeline.resident=true"),
        # two replicas: ~20 s each on a loaded 2-core machine
        pytest.param(("loop=fit", "strategy=mirrored", "strategy.logical_cpus=2"), marks=SLOW),
        pytest.param(("loop=custom", "strategy=mirrored", "strategy.logical_cpus=2"), marks=SLOW),
    ],
    ids=["fit", "custom", "fit-held", "mirrored-fit", "mirrored-custom"],
)
def test_the_body_waits_for_the_switch_then_trains_at_the_lowered_rate(
    train_run, tmp_path, overrides
):
    probe = tmp_path / "probe.jsonl"
    summary, _ = train_run(*_finetune(probe), *overrides)

    rows = read_probe(probe)
    assert [row["epoch"] for row in rows] == [None, 0, 1, 2]
    frozen_epochs = [False] * SWITCH_EPOCH + [True] * (EPOCHS - SWITCH_EPOCH)
    for layer in BODY:
        assert _moved(rows, layer) == frozen_epochs, layer
    for layer in NORMS:  # frozen BatchNormalization: inference mode, before and after
        assert _moved(rows, layer) == [False] * EPOCHS, layer
    assert _moved(rows, "head") == [True] * EPOCHS
    rates = [row["learning_rate"] for row in rows[1:]]
    assert rates == pytest.approx([RATE] * SWITCH_EPOCH + [RATE * FACTOR] * 2)
    assert rows[1]["trainable"] == 2 and rows[-1]["trainable"] == 2 + 2 * len(BODY)

    assert summary["status"] == "completed"
    assert summary["steps_completed"] == EPOCHS * STEPS_PER_EPOCH
    assert summary["epochs_completed"] == EPOCHS
    record = summary["finetune"]
    assert record["unfroze_at_step"] == SWITCH_EPOCH * STEPS_PER_EPOCH
    assert record["learning_rate"] == pytest.approx(summary["learning_rate"] * FACTOR)
    params = record["trainable_params"]
    assert params["before"] == 16 * 10 + 10  # the head: 16 units -> 10 digits
    assert params["after"] == params["before"] + (64 * 16 + 16) + (16 * 16 + 16)


def test_summary_params_count_what_the_phase_that_finished_last_trained(train_run, tmp_path):
    """summary.json's `params.trainable` after fine-tuning is phase two's count, the whole
    model trained last (it said phase one's: the head alone); the switch's record keeps both."""
    summary, _ = train_run(*_finetune(tmp_path / "probe.jsonl", epochs=2))

    before_after = summary["finetune"]["trainable_params"]
    assert summary["params"]["trainable"] == before_after["after"] > before_after["before"]
    assert summary["params"]["total"] >= summary["params"]["trainable"]


@pytest.mark.parametrize("loop", [pytest.param("fit", marks=SLOW), "custom"])
@pytest.mark.parametrize(
    "resume_step",
    [
        pytest.param(3, marks=SLOW),
        5,
    ],  # two runs each: the case that needs the switch first stays fast
    ids=["at-the-switch", "past-the-switch"],
)
def test_a_run_resumed_from_a_backup_lands_in_its_phase_at_the_exact_step(
    train_run, tmp_path, loop, resume_step
):
    """A backup at the switch step holds phase one (it is taken before the switch), a later one
    phase two; either way the resumed run ends exactly as the uninterrupted one."""
    backups = [
        "callbacks.backup.enabled=true",
        "callbacks.backup.every_n_steps=1",
        "callbacks.backup.max_to_keep=20",
        "deterministic=true",
        f"loop={loop}",
    ]
    whole, whole_dir = train_run(*_finetune(tmp_path / "a.jsonl", epochs=2), *backups)
    resumed, _ = train_run(
        *_finetune(tmp_path / "b.jsonl", epochs=2),
        *backups,
        f"resume={whole_dir / 'backup' / f'ckpt-{resume_step}'}",
    )
    assert resumed["resumed_from_step"] == resume_step
    assert resumed["steps_completed"] == whole["steps_completed"] == 2 * STEPS_PER_EPOCH
    assert resumed["finetune"] == whole["finetune"]
    assert resumed["finetune"]["learning_rate"] == pytest.approx(RATE * FACTOR)
    last = read_probe(tmp_path / "b.jsonl")[-1]
    assert last["weights"] == read_probe(tmp_path / "a.jsonl")[-1]["weights"]
    assert last["learning_rate"] == pytest.approx(RATE * FACTOR)


@pytest.mark.slow
def test_sigterm_after_the_switch_resumes_in_phase_two(tmp_path):
    """A real preemption (exit 75) past the switch, then the same command again."""
    from tfrecipe.cli.main import EXIT_PREEMPTED

    run_dir, probe, repo = tmp_path / "run", tmp_path / "probe.jsonl", Path(__file__).parents[1]
    stop_at = SWITCH_EPOCH * STEPS_PER_EPOCH + 2
    command = [
        sys.executable,
        "-m",
        "tfrecipe",
        *_finetune(probe),
        "loop=custom",
        "loop.verbose=0",
        # one step per call, so the signal lands mid-epoch (auto runs a 3-step epoch in one call)
        "loop.steps_per_loop=1",
        "batching.per_replica_batch_size=16",
        "+callbacks.extra.term._target_=helpers.finetune_models.SignalAtStep",
        f"+callbacks.extra.term.step={stop_at}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {"PYTHONPATH": f"{repo}:{repo / 'tests'}"}
    first = _run(command, tmp_path, env)
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    preempted = json.loads((run_dir / "summary.json").read_text())
    assert preempted["status"] == "preempted"
    saved = preempted["steps_completed"]
    assert saved > SWITCH_EPOCH * STEPS_PER_EPOCH  # the backup holds phase two

    second = _run(command, tmp_path, env)
    assert second.returncode == 0, second.stderr[-3000:]
    finished = json.loads((run_dir / "summary.json").read_text())
    assert finished["status"] == "completed"
    assert finished["resumed_from_step"] == saved
    assert finished["steps_completed"] == EPOCHS * STEPS_PER_EPOCH
    assert finished["finetune"]["unfroze_at_step"] == SWITCH_EPOCH * STEPS_PER_EPOCH
    assert finished["finetune"]["learning_rate"] == pytest.approx(RATE * FACTOR)
    assert "fine-tuning: resuming with 2 layers" in second.stdout + second.stderr
    assert read_probe(probe)[-1]["learning_rate"] == pytest.approx(RATE * FACTOR)


@pytest.fixture
def launch(tmp_path):
    from helpers.launch import launching

    yield from launching(tmp_path)


@pytest.mark.slow
def test_two_workers_switch_together_with_fit(launch, tmp_path):
    """loop=fit on two real workers (gRPC on loopback): both unfreeze, take phase two's new
    optimizer and recompile at the same step (a worker that did not would hang the all-reduce
    or fail it), and the run ends at the exact step."""
    run_dir, repo = tmp_path / "run", Path(__file__).parents[1]
    probe = tmp_path / "probe.jsonl"  # both workers append to it; only the chief's summary counts
    run = launch(
        *_finetune(probe),
        "loop=fit",
        "loop.verbose=0",
        "batching.per_replica_batch_size=16",
        "strategy=multi_worker_mirrored",
        "cluster=local",
        "cluster.num_workers=2",
        f"hydra.run.dir={run_dir}",
        env={"PYTHONPATH": f"{repo}:{repo / 'tests'}"},
    )
    assert run.finish() == 0, run.output[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["num_replicas"] == 2
    assert summary["steps_completed"] == EPOCHS * STEPS_PER_EPOCH
    assert summary["finetune"]["unfroze_at_step"] == SWITCH_EPOCH * STEPS_PER_EPOCH
    assert summary["finetune"]["learning_rate"] == pytest.approx(summary["learning_rate"] * FACTOR)
    last_rows = [row for row in read_probe(probe) if row["epoch"] == EPOCHS - 1]
    assert len(last_rows) == 2  # one per worker, both in phase two with the same weights
    assert all(row["learning_rate"] == pytest.approx(RATE * FACTOR) for row in last_rows)
    assert last_rows[0]["weights"] == last_rows[1]["weights"]


def _run(command: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


# --- refused before training -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["loop.finetune.unfreeze_at_epoch=2"], "loop.finetune.unfreeze_at_epoch=2: the switch"),
        (["loop.finetune.unfreeze=block"], "loop.finetune.unfreeze=block: chooses"),
        (
            ["loop.finetune.unfreeze_at_epoch=1", "loop.finetune.unfreeze='block_1[3-'"],
            "not a regular",
        ),
        (
            ["loop.finetune.unfreeze_at_epoch=1", "callbacks.terminate_on_nan.max_rollbacks=1"],
            "set callbacks.terminate_on_nan.max_rollbacks=0",
        ),
        (
            [
                "loop.finetune.unfreeze_at_epoch=1",
                "strategy=parameter_server",
                "loop=custom",
                "cluster=local",
                "cluster.num_ps=1",
            ],
            "not supported with strategy=parameter_server",
        ),
    ],
    ids=["no-second-phase", "unfreeze-alone", "bad-regex", "rollbacks", "parameter-server"],
)
def test_a_finetune_that_cannot_work_is_refused_by_the_config_check(
    compose_cfg, overrides, expected
):
    with pytest.raises(ConfigError) as error:
        schema.validate(compose_cfg(*overrides), trust=Trust.NOTHING)  # TINY: loop.epochs=2
    assert expected in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["loop.finetune.unfreeze='^nothing_'"], "matches no frozen layer of the model"),
        (["model._target_=tfrecipe.models.mlp"], "has no frozen layer to unfreeze"),
    ],
    ids=["regex-matches-nothing", "nothing-frozen"],
)
def test_a_switch_that_would_unfreeze_nothing_is_refused_before_training(
    train_run, tmp_path, overrides, expected
):
    with pytest.raises(ConfigError) as error:
        train_run(*_finetune(tmp_path / "probe.jsonl"), *overrides)
    assert expected in str(error.value)
    assert not (tmp_path / "run0").exists()


def test_unfreeze_matches_names_inside_nested_models_and_keeps_batch_norm_frozen():
    import keras

    from tfrecipe.models.freeze import frozen_layers, unfreeze

    backbone = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, name="block1_dense"),
            keras.layers.BatchNormalization(name="block1_bn"),
            keras.layers.Dense(8, name="block2_dense"),
        ],
        name="backbone",
    )
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(backbone(inputs)))
    backbone.trainable = False
    assert sorted(frozen_layers(model)) == ["block1_dense", "block2_dense"]

    assert unfreeze(model, "^block2") == ["block2_dense"]
    trainable = {v.path for v in model.trainable_variables}
    assert trainable == {
        "backbone/block2_dense/kernel",
        "backbone/block2_dense/bias",
        "head/kernel",
        "head/bias",
    }
    assert unfreeze(model) == ["block1_dense"]  # the rest; the BatchNormalization stays frozen
    assert not backbone.get_layer("block1_bn").trainable
    assert len(model.trainable_variables) == 6
