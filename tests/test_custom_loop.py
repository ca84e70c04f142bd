"""loop=custom trains as loop=fit does: same metrics, same steps, same callback hooks.

Real training runs on tiny models. Every comparison uses `model=mlp model.dropout=0.0`: the two
loops call dropout's random generator differently, so with dropout their results could not match;
the data shuffle is seeded and both loops read one iterator of it from the start.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
from helpers.recording_callback import read_calls

from tfrecipe.errors import ConfigError

# Digits: 1,257 training examples = 19 batches of 64 + a partial batch of 41, so every epoch
# (one pass, 20 steps) ends on a partial batch; validation: 180 examples = 2 x 64 + 52.
COMMON = [
    "model=mlp",
    "model.hidden_units=[32]",
    "model.dropout=0.0",
    "deterministic=true",
    "loop.epochs=2",
    "loop.verbose=0",
    "batching.per_replica_batch_size=64",
    "callbacks.model_checkpoint.enabled=false",
]
STEPS_PER_PASS = 20


def loop(name: str, steps_per_loop: int = 1) -> list[str]:
    """Selects the loop, with `steps_per_loop` steps per call (fit: steps_per_execution)."""
    knob = "batching.steps_per_execution" if name == "fit" else "loop.steps_per_loop"
    return [f"loop={name}", f"{knob}={steps_per_loop}"]


def assert_same_results(actual: dict, expected: dict, rel: float = 1e-4) -> None:
    assert actual["status"] == expected["status"] == "completed"
    assert actual["steps_completed"] == expected["steps_completed"]
    assert actual["metrics"].keys() == expected["metrics"].keys()
    assert actual["metrics"] == pytest.approx(expected["metrics"], rel=rel)
    assert actual["test"] == pytest.approx(expected["test"], rel=rel)


# Clipping and a warm-up schedule (which reads `iterations`) run in the Keras optimizer in both.
CLIPPED_WARMUP = [
    "optimizer.global_clipnorm=0.5",
    "optimizer.schedule=warmup_cosine",
    "optimizer.warmup_steps=5",
]


@pytest.mark.parametrize(("steps_per_loop", "optimizer"), [(1, []), (5, CLIPPED_WARMUP)])
def test_custom_loop_matches_fit_on_one_replica(train_run, steps_per_loop, optimizer):
    """fp32, one replica, seeded and deterministic: final loss, val_loss, accuracy and test
    metrics equal within 1e-4, and the same number of optimizer steps."""
    fit, _ = train_run(*COMMON, *optimizer, *loop("fit", steps_per_loop), tiny=False)
    custom, _ = train_run(*COMMON, *optimizer, *loop("custom", steps_per_loop), tiny=False)
    assert_same_results(custom, fit)
    assert custom["steps_completed"] == 2 * STEPS_PER_PASS
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= custom["metrics"].keys()


def test_regularization_losses_count_as_in_fit(train_run):
    """Kernel and activity L2 (model.losses) are added to the loss once per step, and to the
    reported loss, as fit adds them: the same results with two steps per call."""
    regularized = [
        "model._target_=helpers.regularized_model.regularized_mlp",
        "+model.l2=0.01",
        "allowed_targets=[helpers]",
        "loop.steps_per_epoch=6",
    ]
    fit, _ = train_run(*COMMON, *regularized, *loop("fit", 2), tiny=False)
    custom, _ = train_run(*COMMON, *regularized, *loop("custom", 2), tiny=False)
    assert_same_results(custom, fit)


def test_two_replicas_train_like_one_with_the_same_global_batch(train_run):
    """MirroredStrategy on two logical CPUs, global batch 64 (2 x 32): the same results as one
    replica. Each pass ends on a partial batch of 41 split 21/20: the loss is averaged over 41
    examples, not over the nominal 64 nor as the mean of the two replicas' means."""
    one, _ = train_run(*COMMON, *loop("custom"), tiny=False)
    two, _ = train_run(
        *COMMON,
        *loop("custom"),
        "strategy=mirrored",
        "strategy.logical_cpus=2",
        "batching.global_batch_size=64",
        # StepCSVLogger cannot read a mirrored `iterations` yet (int() of a MirroredVariable).
        "logger=none",
        tiny=False,
    )
    assert two["num_replicas"] == 2 and two["global_batch_size"] == 64
    assert_same_results(two, one)


def _final_weights(run_dir) -> list[np.ndarray]:
    import keras

    return keras.saving.load_model(run_dir / "model.keras", compile=False).get_weights()


def test_gradient_accumulation_equals_one_large_batch(train_run):
    """4 micro-batches of 16 per step update the model as one batch of 64. 500 training
    examples make each pass end on a partial step of 52 = 3 x 16 + 4, averaged over its 52."""
    data = ["dataset=synthetic", "dataset.num_examples=625", "dataset.shape=[8]"]
    large, large_dir = train_run(*COMMON, *data, *loop("custom"), tiny=False)
    accumulated, accumulated_dir = train_run(
        *COMMON,
        *data,
        *loop("custom"),
        "batching.per_replica_batch_size=16",
        "loop.gradient_accumulation_steps=4",
        tiny=False,
    )
    assert large["steps_completed"] == accumulated["steps_completed"] == 2 * 8
    assert_same_results(accumulated, large)
    for a, b in zip(_final_weights(accumulated_dir), _final_weights(large_dir), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_fit_accumulates_gradients_as_the_custom_loop_does(train_run):
    """loop.gradient_accumulation_steps=2 in fit (Keras' optimizer accumulates) and in the custom
    loop: the same updates (weights within 1e-5); steps and the warm-up schedule count optimizer
    updates. 320 examples: whole batches of 16. On two replicas fit's accumulation is refused
    before training (Keras 3.15 fails there), naming loop=custom."""
    strategy: list[str] = []
    data = ["dataset=synthetic", "dataset.num_examples=400", "dataset.shape=[8]"]
    runs = [
        train_run(
            *COMMON,
            *data,
            *strategy,
            *CLIPPED_WARMUP,
            *loop(name, 2),
            "batching.per_replica_batch_size=16",
            "loop.gradient_accumulation_steps=2",
            tiny=False,
        )
        for name in ("fit", "custom")
    ]
    (fit, fit_dir), (custom, custom_dir) = runs
    assert fit["steps_completed"] == custom["steps_completed"] == 2 * 10  # 20 batches / 2
    assert_same_results(fit, custom)
    for a, b in zip(_final_weights(fit_dir), _final_weights(custom_dir), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    with pytest.raises(ConfigError, match=r"loop=fit accumulates.*2 replicas.*use loop=custom"):
        train_run(
            *COMMON,
            *data,
            "strategy=mirrored",
            "strategy.logical_cpus=2",
            "loop.gradient_accumulation_steps=2",
            tiny=False,
        )


def _recorded_calls(train_run, tmp_path, *overrides: str) -> tuple[dict, list[dict]]:
    path = tmp_path / f"calls-{len(list(tmp_path.glob('calls-*')))}.jsonl"
    summary, _ = train_run(
        *overrides,
        "+callbacks.extra.rec._target_=helpers.recording_callback.RecordingCallback",
        f"+callbacks.extra.rec.path={path}",
        "allowed_targets=[helpers]",
        tiny=False,
    )
    return summary, read_calls(path)


def _without_values(calls: list[dict]) -> list[tuple]:
    return [(c["hook"], c["index"], sorted(c["logs"]), c.get("params")) for c in calls]


def test_a_users_callback_sees_the_same_hooks_in_both_loops(train_run, tmp_path):
    """Same hooks, order, batch indices, log names and values, and params: 2 epochs of 4 steps,
    2 steps per call; validation is 2 batches (20 examples of 10), one call."""
    runs = [
        *COMMON,
        "dataset=synthetic",
        "dataset.num_examples=200",
        "dataset.shape=[8]",
        "batching.per_replica_batch_size=10",
        "loop.steps_per_epoch=4",
    ]
    _, fit = _recorded_calls(train_run, tmp_path, *runs, *loop("fit", 2))
    _, custom = _recorded_calls(train_run, tmp_path, *runs, *loop("custom", 2))
    assert _without_values(custom) == _without_values(fit)
    for ours, theirs in zip(custom, fit, strict=True):
        assert ours["logs"] == pytest.approx(theirs["logs"], rel=1e-4)
    ends = [c["index"] for c in custom if c["hook"] == "on_train_batch_end"]
    assert ends == [1, 3, 1, 3]
    assert custom[0]["params"] == {"verbose": 0, "epochs": 2, "steps": 4}


def test_an_epoch_runs_exactly_its_steps_when_calls_do_not_divide_it(train_run, tmp_path):
    """5 steps per epoch, 2 per call: calls of 2, 2 and 1 steps (fit would run 6); streamed,
    as is the validation split it cuts the same way (held, it would be one call)."""
    summary, calls = _recorded_calls(
        train_run,
        tmp_path,
        *COMMON,
        *loop("custom", 2),
        "loop.steps_per_epoch=5",
        "pipeline.resident=false",
    )
    assert summary["steps_completed"] == 10
    begins = [c["index"] for c in calls if c["hook"] == "on_train_batch_begin"]
    ends = [c["index"] for c in calls if c["hook"] == "on_train_batch_end"]
    assert list(zip(begins, ends, strict=True)) == [(0, 1), (2, 3), (4, 4)] * 2
    # Validation: 3 batches (64, 64, 52), 2 per call; the last call ends on batch 2.
    tests = [c["index"] for c in calls if c["hook"] == "on_test_batch_end"]
    assert tests == [1, 2] * 2


def test_auto_calls_of_the_custom_loop_need_not_divide_the_epoch(train_run, tmp_path):
    """7-step epochs with a step log every 2 steps: fit's auto would take 1 (gcd 7, 2), the
    custom loop's takes 2 and ends each epoch with a 1-step call; the step log keeps its steps."""
    summary, calls = _recorded_calls(
        train_run,
        tmp_path,
        *COMMON,
        "loop=custom",
        "loop.steps_per_epoch=7",
        "logger.csv.every_n_steps=2",
    )
    assert summary["steps_per_execution"] == 2
    assert summary["steps_completed"] == 14
    begins = [c["index"] for c in calls if c["hook"] == "on_train_batch_begin"]
    ends = [c["index"] for c in calls if c["hook"] == "on_train_batch_end"]
    assert list(zip(begins, ends, strict=True)) == [(0, 1), (2, 3), (4, 5), (6, 6)] * 2
    run_dir = next(tmp_path.glob("run*"))
    logged = [int(r.split(",")[0]) for r in (run_dir / "steps.csv").read_text().splitlines()[1:]]
    # every second step of the run, at the first call end at or after it (8 ends the call 8-9)
    assert logged == [2, 4, 6, 9, 11, 13, 14]


def test_a_restored_epoch_realigns_its_calls_to_the_epochs_multiples():
    """From step 3 of a 7-step epoch at 2 per call: 3 alone, then 4-5 and 6, the calls an epoch
    run from its start makes (so step hooks at even steps still fire)."""
    import keras

    from tfrecipe.loops.custom import _train_epoch
    from tfrecipe.loops.options import LoopOptions

    class Model:
        stop_training = False

    run: list = []  # call sizes and hook calls, in order

    def train_steps(iterator, num_steps):
        run.append(int(num_steps))
        return {}

    recorder = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: run.append(("begin", batch)),
        on_train_batch_end=lambda batch, logs: run.append(("end", batch)),
    )
    options = LoopOptions(epochs=1, steps_per_epoch=7, steps_per_loop=2)
    _train_epoch(Model(), train_steps, None, keras.callbacks.CallbackList([recorder]), options, 3)
    assert run == [
        ("begin", 3),
        1,
        ("end", 3),
        ("begin", 4),
        2,
        ("end", 5),
        ("begin", 6),
        1,
        ("end", 6),
    ]


def test_early_stopping_ends_the_custom_loop(train_run):
    """EarlyStopping sets model.stop_training; the loop stops after that epoch."""
    summary, _ = train_run(
        *COMMON,
        *loop("custom"),
        "loop.epochs=5",
        "loop.steps_per_epoch=2",
        "callbacks.early_stopping.enabled=true",
        "callbacks.early_stopping.patience=0",
        "callbacks.early_stopping.min_delta=100",  # no epoch improves enough
        tiny=False,
    )
    assert summary["epochs_completed"] == 2
    assert summary["steps_completed"] == 4


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_under_the_custom_loop(train_run, policy):
    """float16 goes through the LossScaleOptimizer (scaled loss, unscaled gradients), bfloat16
    without scaling. Emulated on a CPU, hence require_native=false."""
    summary, _ = train_run(
        *COMMON,
        *loop("custom", 2),
        f"precision={policy}",
        "precision.require_native=false",
        "loop.steps_per_epoch=6",
        tiny=False,
    )
    assert summary["status"] == "completed" and summary["precision"] == policy
    # A float16 step whose scaled gradients overflow is skipped, as in fit.
    assert 0 < summary["steps_completed"] <= 12
    assert all(np.isfinite(v) for v in summary["metrics"].values())
    assert summary["metrics"]["loss"] < 2.3  # below chance level (ln 10): it learned


def _compiled_model_and_data(*, jit_compile: bool, steps_per_execution: int):
    """A seeded tiny model compiled as train.py compiles it, with endless training data."""
    import keras
    import tensorflow as tf

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    features = np.random.default_rng(0).normal(size=(96, 6)).astype("float32")
    labels = (np.arange(96) % 3).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(8, "relu")(inputs)))
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model, dataset.shuffle(96, seed=1).batch(16).repeat(), dataset.batch(32)


@pytest.fixture
def without_op_determinism():
    """Keras refuses XLA while op determinism is on, and an earlier `deterministic=true` run in
    this process leaves it on (TensorFlow has no public switch back)."""
    from tensorflow.python.framework import config

    was_on = config.is_op_determinism_enabled()
    config.disable_op_determinism()
    yield
    if was_on:
        config.enable_op_determinism()


@pytest.mark.heavy
@pytest.mark.usefixtures("without_op_determinism")
def test_with_jit_compile_the_custom_loop_compiles_its_steps_and_matches_fit():
    """Keras turns `jit_compile` on for a model on a GPU without a strategy, and fit then
    XLA-compiles each step; the custom loop does too (forced on here, XLA runs on CPUs)."""
    import keras

    from tfrecipe.loops import custom, fit
    from tfrecipe.loops.options import LoopOptions

    def objective():  # what the model is compiled with (_compiled_model_and_data)
        return (
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )

    options = LoopOptions(
        epochs=2, steps_per_epoch=6, verbose=0, steps_per_loop=3, objective=objective
    )
    results = []
    for loop in (fit, custom):
        model, train_data, validation_data = _compiled_model_and_data(
            jit_compile=True, steps_per_execution=options.steps_per_loop
        )
        loop.run(model, train_data, validation_data, options=options, callbacks=[])
        assert model.jit_compile
        results.append((model.history.history, int(model.optimizer.iterations)))
    (fit_history, fit_steps), (custom_history, custom_steps) = results
    assert custom_steps == fit_steps == 12
    assert custom_history.keys() == fit_history.keys()
    for name, values in fit_history.items():
        assert custom_history[name] == pytest.approx(values, rel=1e-4), name


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loop=fit", "+loop.steps_per_loop=4"], "with loop=fit set batching.steps_per_execution"),
        (["loop=custom", "batching.steps_per_execution=4"], "set loop.steps_per_loop"),
        (["loop=custom", "loop.gradient_accumulation_steps=0"], "gradient_accumulation_steps"),
        (
            ["loop.gradient_accumulation_steps=2", "precision=mixed_float16"],
            "cannot count the float16 steps",
        ),
    ],
)
def test_a_knob_the_chosen_loop_would_ignore_is_refused(compose_cfg, overrides, message):
    from tests.helpers.configs import validate

    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(*overrides))


def test_every_loop_is_called_the_same_way():
    """train calls whichever loop the config picks through `Loop`: same names, kinds, defaults."""
    import inspect

    from tfrecipe.loops import Loop, custom, fit, parameter_server

    def parameters(function) -> list[tuple]:
        params = inspect.signature(function).parameters.values()
        return [(p.name, p.kind, p.default) for p in params if p.name != "self"]

    for name in ("run", "evaluate"):
        for loop in (fit, custom, parameter_server):
            assert parameters(getattr(loop, name)) == parameters(getattr(Loop, name)), loop


@pytest.mark.parametrize(
    ("num_params", "steps_per_epoch", "expected"),
    [
        (50_000, 20, 20),
        (50_000, 40, 20),
        (50_000, 29, 29),
        (50_000, 37, 1),
        (50_000, 3, 3),
        (5_000_000, 20, 1),
    ],
)
def test_auto_steps_per_call_divide_the_epoch_and_stay_one_for_large_models(
    num_params, steps_per_epoch, expected
):
    assert _steps_per_call("auto", num_params=num_params, steps_per_epoch=steps_per_epoch) == (
        expected
    )
    assert _steps_per_call(7, num_params=num_params, steps_per_epoch=steps_per_epoch) == 7


def _steps_per_call(
    requested, *, hook_intervals=(), short_last_call=False, replicas=1, **numbers
) -> int:
    """`RunPlan.steps_per_call` of a plan that requests `requested` (`short_last_call`: the
    custom loop's, which ends an epoch with a shorter call)."""
    from tfrecipe.config.plan import RunPlan

    plan = RunPlan(
        loop="custom" if short_last_call else "fit",
        in_cluster=False,
        precision="float32",
        periodic_backups=False,
        backup_every_n_steps=100,
        max_rollbacks=0,
        hook_intervals=tuple(hook_intervals),
        requested_steps_per_call=requested,
        one_step_per_call=None,
        gradient_accumulation_steps=1,
    )
    return plan.steps_per_call(replicas=replicas, **numbers)


def test_auto_steps_per_call_of_a_loop_that_ends_epochs_short_divide_the_hooks_only():
    # MNIST's 422-step epochs (54,000 / 128) and a step log every 10 steps
    assert _steps_per_call("auto", num_params=1, steps_per_epoch=422, hook_intervals=(10,)) == 2
    short = {"num_params": 1, "steps_per_epoch": 422, "start_step": 7, "short_last_call": True}
    assert _steps_per_call("auto", **short, hook_intervals=(10,)) == 10
    assert _steps_per_call("auto", **short) == 32  # no step hooks: the most per call
    assert _steps_per_call("auto", **(short | {"num_params": 5_000_000})) == 1


def test_auto_steps_per_call_also_divide_the_rest_of_a_restored_epoch():
    # resumed at step 46 of 20-step epochs: 14 steps left in epoch 3, then whole epochs
    assert _steps_per_call("auto", num_params=1, steps_per_epoch=20, start_step=46) == 2
    assert _steps_per_call("auto", num_params=1, steps_per_epoch=20, start_step=40) == 20


def test_auto_steps_per_call_keep_the_steps_hooks_were_asked_for():
    # backups every 3 steps in 5-step epochs: one step per call; a step log every 10 of 20: 10
    assert _steps_per_call("auto", num_params=1, steps_per_epoch=5, hook_intervals=(3,)) == 1
    assert _steps_per_call("auto", num_params=1, steps_per_epoch=20, hook_intervals=(10,)) == 10
    # fit's multi-step calls fail across replicas (Keras 3.15): one step per call there
    assert _steps_per_call("auto", num_params=1, steps_per_epoch=20, replicas=2) == 1


def test_epochs_shorter_than_the_step_log_interval_log_and_run_whole(train_run):
    """3-step epochs under rows every 4 steps: one call per epoch (not 1-step calls, as the
    interval's gcd with the epoch made them), and the row for step 4 comes at the call end
    at step 6 (an epoch-relative count never reached 4: steps.csv stayed empty)."""
    summary, run_dir = train_run("logger.csv.every_n_steps=4")  # TINY: 2 epochs of 3 steps
    assert summary["steps_per_execution"] == 3
    rows = (run_dir / "steps.csv").read_text().splitlines()
    assert [int(r.split(",")[0]) for r in rows[1:]] == [6]


def test_a_run_shorter_than_the_step_log_interval_leaves_a_header(train_run):
    """No step reached `logger.csv.every_n_steps` (50 by default): steps.csv has its columns and
    no row (it was 0 bytes: pandas.read_csv refused it)."""
    _, run_dir = train_run()  # TINY: 2 epochs of 3 steps
    with open(run_dir / "steps.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert (reader.fieldnames, list(reader)) == (["step", "epoch", "learning_rate"], [])


def test_summary_says_how_the_run_ran(train_run):
    """steps_per_execution=auto on the small default CNN: steps per call divide the epoch and
    the run still takes exactly epochs x steps_per_epoch optimizer steps."""
    summary, _ = train_run("logger.csv.every_n_steps=3")  # TINY: 2 epochs of 3 steps
    assert summary["steps_per_execution"] == 3
    assert summary["steps_completed"] == 2 * 3
    assert summary["jit_compile"] is False  # Keras' auto: no XLA on a CPU-only machine
    assert summary["precision"] == "float32"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fit", "custom"])
def test_deterministic_runs_with_auto_steps_per_call_reproduce_to_the_bit(train_run, name):
    overrides = [f"loop={name}", "deterministic=true", "logger.csv.every_n_steps=3"]
    first, _ = train_run(*overrides)
    second, _ = train_run(*overrides)
    assert first["steps_per_execution"] == 3  # several steps per call (TINY: 3-step epochs)
    assert first["metrics"] == second["metrics"] and first["test"] == second["test"]
