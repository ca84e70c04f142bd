"""`pipeline.resident`: validation and test held beside a held training split, each evaluated in
one call, in order, every example once (the last batch short), in both loops and under the
strategies that hold; the metrics are the streamed evaluation's."""

from __future__ import annotations

import pytest

from tfrecipe.data import residency
from tfrecipe.data.residency import Choice, DeviceMemory

GIB = 1 << 30


def test_evaluation_splits_are_held_only_beside_a_held_training_split_and_under_the_cap():
    cpu, gpu = DeviceMemory("CPU", 8 * GIB), DeviceMemory("GPU", 8 * GIB)
    held = Choice(True, "fits")
    beside = residency.evaluation("auto", training=held, held_bytes=1 << 20, memory=gpu)
    assert beside.resident and "with the training split" in beside.reason
    over = residency.evaluation("auto", training=held, held_bytes=3 * GIB, memory=gpu)
    assert not over.resident and "over the cap" in over.reason  # 3 GiB > 25% of 8 GiB
    # on a CPU too: beside a held training split, validation runs in the graph of a group of
    # epochs (tfrecipe.loops.epoch_groups)
    on_cpu = residency.evaluation("auto", training=held, held_bytes=1 << 20, memory=cpu)
    assert on_cpu.resident and "with the training split" in on_cpu.reason
    assert residency.evaluation(True, training=held, held_bytes=1 << 20, memory=cpu).resident
    streamed = residency.evaluation(True, training=Choice(False, "x"), held_bytes=1, memory=cpu)
    assert not streamed.resident and "training split streams" in streamed.reason


def _model_and_data(strategy, num_rows=11):
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_rows, 3)).astype("float32")
    y = rng.integers(0, 3, size=num_rows).astype("int32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
    return model, (tf.constant(x), tf.constant(y))


def _objective():
    import keras

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return loss, [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


@pytest.mark.parametrize("loop", ["fit", "custom"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_held_split_evaluates_as_the_streamed_one(loop, replicas):
    """11 examples in global batches of 4 (4, 4, 3: the last one split 2 + 1 over two
    replicas): the same loss and accuracy as the streamed batches, in one call."""
    import tensorflow as tf

    from tfrecipe.data.resident import HeldEval, HeldSplit, Layout
    from tfrecipe.loops import custom, fit, resident_fit

    devices = ["/cpu:0", "/cpu:1"][:replicas]
    strategy = (
        tf.distribute.MirroredStrategy(devices) if replicas > 1 else tf.distribute.get_strategy()
    )
    model, rows = _model_and_data(strategy)
    streamed = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(rows).batch(4)
    )
    held = HeldEval(HeldSplit(rows, strategy=strategy, layout=Layout(4, 3, seed=0)))
    evaluate = {"fit": fit.evaluate, "custom": custom.evaluate}[loop]
    expected = evaluate(model, streamed, objective=_objective)
    got = evaluate(model, held, objective=_objective)
    assert set(got) == set(expected) == {"loss", "accuracy"}
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-7)
    assert got["accuracy"] * 11 == pytest.approx(round(got["accuracy"] * 11))  # all 11 counted
    assert evaluate(model, held, objective=_objective) == got  # evaluated again: the same
    if loop == "fit":  # one trace of the step serves the whole batches and the short one
        assert resident_fit.test_step(model).experimental_get_tracing_count() == 1


def test_the_plan_says_validation_and_test_are_held(compose_cfg):
    from tfrecipe.config import schema
    from tfrecipe.config.plan import RunPlan
    from tfrecipe.config.trust import Trust

    for overrides in (["model=mlp"], ["pipeline.resident=true"]):
        run = schema.validate(compose_cfg(*overrides), trust=Trust.from_command_line(overrides))
        plan = "\n".join(RunPlan.from_config(run).lines())
        assert "validation and test held beside it" in plan, plan


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["default", "one_device", "mirrored"])
def test_a_held_run_tests_as_a_streamed_run(train_run, monkeypatch, strategy):
    """The same seed, the same held training stream: the run whose validation and test splits
    are held reports the streamed-evaluation run's validation and test metrics (both loops)."""
    common = [f"strategy={strategy}", "recipe=wine_tabular", "pipeline.resident=true"]
    if strategy == "mirrored":
        common.append("strategy.logical_cpus=2")
    for loop in ("fit", "custom"):
        held, _ = train_run(*common, f"loop={loop}", "deterministic=true")
        with monkeypatch.context() as patch:  # the evaluation splits stream, training is held
            patch.setattr(residency, "evaluation", lambda *a, **k: Choice(False, "streamed"))
            streamed, _ = train_run(*common, f"loop={loop}", "deterministic=true")
        assert held["resident"]["evaluation"]["resident"], held["resident"]
        assert streamed["resident"]["evaluation"] == {"resident": False, "reason": "streamed"}
        for key in ("val_loss", "val_accuracy"):
            assert held["metrics"][key] == pytest.approx(streamed["metrics"][key], rel=1e-5)
        assert held["metrics"]["loss"] == streamed["metrics"]["loss"]  # the same training
        assert held["test"] == pytest.approx(streamed["test"], rel=1e-5)
