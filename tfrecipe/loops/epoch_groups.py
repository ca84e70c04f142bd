"""Several epochs in one call (`batching.epochs_per_call`): fit on a held training split whose
epochs are a few short steps.

Keras' fit calls its train function at least once an epoch, and each call costs 0.5-1.2 ms
besides its steps, its epoch's edges as much again (docs/benchmarks.md, "An eleventh pass"): a
wine or breast-cancer epoch of 8-12 steps of 0.1-0.2 ms pays more for them than for its steps.
Here one graph call runs a group of epochs: for each, its steps on the held split (Keras' own
`train_step`, as tfrecipe.loops.resident_fit runs it), its training metrics' results kept, the
held validation split evaluated with Keras' own `test_step` where fit would validate, its
results kept, and where `callbacks.model_checkpoint`'s monitor beats the best so far the model's
weights copied beside it. Then fit's epoch loop, run here as the custom loop runs it (a
`CallbackList` with Keras' History and progress bar), hands each epoch of the group to the
callbacks with its own logs: `on_epoch_begin`, the batch hooks once around the epoch, and
`on_epoch_end`. The run's first epoch is a call of its own (it traces: the clocks' warm-up).

While a group is handed over, the model is ahead of the epoch its callbacks see:
`backup.current_step` says the epoch's step (`backup.replaying`), no backup is taken before the
group's last epoch end (a preemption's neither), history.csv and best.weights.h5 are written
there, the latter from the best epoch's weights (copied beside the model's: `held_best`). Only callbacks
known to read nothing but logs, that step and those weights may watch a group (`blocker` names
the first that may not); any other (early stopping, periodic exports, EMA's swaps, periodic
backups, your own) keeps one epoch per call. A stop inside a group (a NaN loss, a pruned trial)
ends training at that epoch with the model at the group's end. Where the held loop compiles
with XLA (`resident_fit.compiles_loop`), a group is one XLA program (`_compiled_group`), its
validation unstamped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf

from tfrecipe import graph
from tfrecipe.callbacks import BestCheckpoint
from tfrecipe.data.resident import HeldEval, ResidentTrain
from tfrecipe.errors import ConfigError
from tfrecipe.fault import backup
from tfrecipe.loops import custom, resident_fit
from tfrecipe.perf.clock import Reads

# `auto`: as many epochs per call as make about this many steps (fewer where the run has fewer
# epochs left). Wine (8 steps an epoch, 200 epochs, medians of 3 runs) trained at 64k examples/s
# in calls of 32 steps, 74k at 64, 78.5k at 128 and 80k at 256: docs/benchmarks.md, "A
# fourteenth pass".
GROUP_STEPS = 128
# Where a group is one XLA program (resident_fit.compiles_loop), its steps cost 7-9 us (wine, a
# 2-core EPYC) and a call's edges 1-2 ms (the passes' orders drawn, the launch): a call of 1024
# steps spends a sixth of its time on them (docs/benchmarks.md, "A nineteenth pass").
COMPILED_GROUP_STEPS = 1024

# Keras' callbacks that read only an epoch's logs (tfrecipe's say so: `reads_logs_only`, the
# logs, the step counter `backup.current_step` and BestCheckpoint's best weights).
_KERAS_LOGS_ONLY = (
    keras.callbacks.TerminateOnNaN,
    keras.callbacks.History,
    keras.callbacks.ProgbarLogger,
)
_LOGS_ONLY_NAMES = {"WandbMetricsLogger"}  # W&B's, at log_freq="epoch" (tracking.wandb_run)


def epochs_per_call(
    setting: int | str, *, steps_per_epoch: int, epochs: int, compiled: bool = False
) -> int:
    """The epochs a call may run: `setting`, or for `auto` enough for `GROUP_STEPS` steps
    (`COMPILED_GROUP_STEPS` where a group is one XLA program: `compiled`)."""
    steps = COMPILED_GROUP_STEPS if compiled else GROUP_STEPS
    wanted = setting if setting != "auto" else max(1, steps // max(steps_per_epoch, 1))
    return max(1, min(int(wanted), epochs))


def blocker(callbacks: Sequence[keras.callbacks.Callback]) -> str | None:
    """The first of `callbacks` that may read the model between two epochs of a group, as a
    reason (None: none does)."""
    for callback in _flattened(callbacks):
        if isinstance(callback, backup.Backup):
            if callback.options.periodic:
                return "periodic backups (callbacks.backup) save the state at every epoch end"
            continue
        if isinstance(callback, keras.callbacks.TensorBoard):
            if callback.histogram_freq:  # its steps: callbacks.TensorBoardStepLogger's
                return "TensorBoard logs weight histograms"
            continue
        if getattr(callback, "reads_logs_only", False) or isinstance(callback, _KERAS_LOGS_ONLY):
            continue
        if type(callback).__name__ not in _LOGS_ONLY_NAMES:
            return f"the callback {type(callback).__name__} may read the model at an epoch's end"
    return None


def _flattened(callbacks) -> Iterator[keras.callbacks.Callback]:
    for callback in callbacks:
        inner = getattr(callback, "inner", None)  # tfrecipe.loops.fit's relays
        yield from _flattened(inner.callbacks) if inner is not None else (callback,)


def choose(
    setting: int | str,
    callbacks: Sequence[keras.callbacks.Callback],
    data,
    options,
    *,
    loop: str,
    compiled: bool = False,
) -> tuple[int, str]:
    """(epochs per call, why) for a run's `loop` on `data` (training.inputs.Inputs) with
    `options` (LoopOptions), watched by `callbacks`, its held loop `compiled` with XLA or not;
    an explicit `setting` above 1 that cannot run is refused (ConfigError)."""
    reason = _why_not(callbacks, data, options, loop)
    if reason is None:
        count = epochs_per_call(
            setting, steps_per_epoch=data.steps_per_epoch, epochs=options.epochs, compiled=compiled
        )
        if count > 1:
            program = ", one XLA program" if compiled else ""
            return count, f"{count} epochs of {data.steps_per_epoch} steps per call{program}"
        reason = f"an epoch of {data.steps_per_epoch} steps fills a call"
    if setting not in ("auto", 1):
        raise ConfigError(
            f"batching.epochs_per_call={setting}: {reason}; allowed here: auto (one epoch per "
            "call where a group cannot run) or 1"
        )
    return 1, reason


def _why_not(callbacks, data, options, loop: str) -> str | None:
    if loop != "fit":
        return f"loop={loop} runs its own calls"
    if not isinstance(data.train, ResidentTrain):
        return "the training split streams"
    if data.validation is not None and not isinstance(data.validation, HeldEval):
        return "the validation split streams"
    if options.gradient_accumulation_steps > 1:
        return "loop.gradient_accumulation_steps ends calls on updates"
    if options.steps_per_loop != data.steps_per_epoch:
        return (
            f"a call runs {options.steps_per_loop} of an epoch's {data.steps_per_epoch} steps "
            "(batching.steps_per_execution; logger.csv.every_n_steps shortens auto's)"
        )
    if data.steps_per_epoch < 2:
        return "an epoch of one step"
    return blocker(callbacks)


def fit(
    model: keras.Model, data, validation, *, options, callbacks, epochs: tuple[int, int]
) -> bool:
    """fit's epochs `epochs` (initial, end) in groups of `options.epochs_per_call` per call;
    False (nothing run) where fit runs one epoch per call: the data are not held, or this is a
    mid-epoch resume's short epoch."""
    if options.epochs_per_call < 2 or not isinstance(data, ResidentTrain):
        return False
    if int(model.steps_per_execution) != options.steps_per_epoch:
        return False
    callbacks = list(callbacks)
    best = next((c for c in _flattened(callbacks) if isinstance(c, BestCheckpoint)), None)
    for callback in _flattened(callbacks):
        if hasattr(callback, "epochs_per_call"):  # the clocks: a call's time is its group's
            callback.epochs_per_call = options.epochs_per_call
    groups = EpochGroups(model, data, validation, options=options, best=best)
    try:
        _run(model, groups, custom.callback_list(callbacks, model, options), *epochs)
    finally:
        groups.detach()
    return True


def _run(model, groups: EpochGroups, callbacks, first: int, end: int) -> None:
    """fit's epoch loop, a group's epochs after its one call: each epoch's hooks and logs as
    fit gives them (the batch hooks once, around the call: one call an epoch)."""
    model.stop_training = False
    callbacks.on_train_begin()
    logs, epoch, last_step = None, first, groups.steps_per_epoch - 1
    while epoch < end and not model.stop_training:
        # the first epoch is a call of its own, as in fit (it traces): the clocks' warm-up
        count = 1 if epoch == first else min(groups.epochs_per_call, end - epoch)
        for offset in range(count):
            callbacks.on_epoch_begin(epoch + offset)
            callbacks.on_train_batch_begin(0)
            if offset == 0:
                rows, validated = groups.run(epoch, count)
            groups.replay(offset)
            callbacks.on_train_batch_end(last_step, rows[offset][0])
            if offset == 0:  # the clocks count training: the group's validation is not
                for callback in _flattened(callbacks.callbacks):
                    getattr(callback, "validated_inside", lambda _: None)(validated)
            logs = {**rows[offset][0], **rows[offset][1]}
            callbacks.on_epoch_end(epoch + offset, logs)
            if model.stop_training:
                break
        epoch += count
    callbacks.on_train_end(logs=logs)


class EpochGroups:
    """A held split's epochs in groups, each group in one graph call.

    Args:
      model: the compiled model fit trains, one call an epoch (`steps_per_execution`).
      train: the held training stream from fit's first step (an epoch's start).
      validation: the held validation split, or None.
      options: the loop's (`epochs_per_call`, `validation_freq`).
      best: the run's best-weights callback, or None.
    """

    def __init__(
        self,
        model: keras.Model,
        train: ResidentTrain,
        validation: HeldEval | None,
        *,
        options,
        best: BestCheckpoint | None,
    ):
        self.model, self.validation, self.best = model, validation, best
        self.epochs_per_call = options.epochs_per_call
        self.validation_freq = options.validation_freq
        self.steps_per_epoch = options.steps_per_epoch
        self._iterator = iter(train)
        self._count = self._end_step = 0
        self._shadows: list[tf.Variable] = []
        self._run_group: Callable[..., Any] | None = None
        self._keys: list[str] = []

    def run(self, epoch: int, count: int) -> tuple[list[tuple[dict, dict]], float]:
        """Epochs `epoch` to `epoch + count` in one call: each one's (training logs,
        validation logs: `val_*`, empty where it does not validate), and the seconds the call
        validated (stamped in the graph; 0 without the input clock's stamps, or in one XLA
        program)."""
        validate = [  # padded to the longest group: one trace serves every group
            self.validation is not None and offset < count and self._validates(epoch + offset)
            for offset in range(self.epochs_per_call)
        ]
        if self._run_group is None:
            self._build()
        best = math.nan if self.best is None or self.best.best is None else self.best.best
        results, validated = self._run_group(
            tf.constant(count), tf.constant(validate), tf.constant(best, tf.float32)
        )
        results = results.numpy()
        self._count = count
        self._end_step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        rows = [
            (
                self._logs(results[0, offset]),
                self._logs(results[1, offset], "val_") if validate[offset] else {},
            )
            for offset in range(count)
        ]
        return rows, float(validated)

    def replay(self, offset: int) -> None:
        """The callbacks see the end of the group's epoch `offset` (the model is at its last's)."""
        ahead = (self._count - 1 - offset) * self.steps_per_epoch
        backup.replaying(self.model, self._end_step - ahead, ahead)

    def detach(self) -> None:
        backup.replaying(self.model, None)
        if self.best is not None:
            self.best.held_best = None

    def _validates(self, epoch: int) -> bool:
        return (epoch + 1) % self.validation_freq == 0  # as Keras' `_should_eval`

    def _logs(self, row, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{key}": float(value) for key, value in zip(self._keys, row, strict=True)}

    def _build(self) -> None:
        model, held = self.model, self._iterator.held
        compiled = resident_fit.compiles_loop(model, held)
        reads, read, one_step = resident_fit.held_steps(model, self._iterator)
        resident_fit.build_metrics(held, one_step)
        self._keys = sorted(model.get_metrics_result())
        # (training, validation) x epoch x metric; on the program's device where it compiles
        with tf.device(None if compiled else "/CPU:0"):
            self._results = tf.Variable(tf.zeros([2, self.epochs_per_call, len(self._keys)]))
        if self.best is not None:
            with model.distribute_strategy.scope():
                self._shadows = [tf.Variable(w, trainable=False) for w in model.weights]
            self.best.held_best = {
                id(w): s for w, s in zip(model.weights, self._shadows, strict=True)
            }
        if compiled:
            self._run_group = self._compiled_group(
                reads, resident_fit.compiled_steps(held, one_step)
            )
        else:
            self._run_group = self._group_function(reads, read, one_step)

    def _keep(self, split: int, index: tf.Tensor) -> dict[str, tf.Tensor]:
        """In the graph: the metrics' results after epoch `index`'s training (`split` 0) or
        validation (1), kept for its logs."""
        results = self.model.get_metrics_result()
        row = tf.stack([tf.cast(results[key], tf.float32) for key in self._keys])
        self._results.scatter_nd_update([[split, index]], [row])
        return results

    def _group_function(self, reads, read, one_step):
        """`run_group(count, validate, best)`: a group's epochs in one graph call, each
        epoch's steps in `Reads.steps`' loop and its validation timed (`_epochs`)."""
        held = None if self.validation is None else self.validation.held
        test_step = resident_fit.test_step(self.model)

        @graph.function
        def run_group(count, validate, best):
            group = _Window(read(count * self.steps_per_epoch), self.steps_per_epoch)
            validated = self._epochs(
                count,
                validate,
                best,
                train=lambda index: reads.steps(group.epoch(index), one_step, group.steps),
                evaluate=lambda: resident_fit.in_order(held, test_step),
                now=reads.now,
            )
            return tf.identity(self._results), validated

        return run_group

    def _compiled_group(self, reads, steps):
        """`run_group` as one XLA program a group (`resident_fit.compiles_loop`: an XLA launch
        costs 0.2-0.6 ms on a CPU, a table's epoch of steps 0.1): the orders of the passes it
        spans are drawn before it, the time they take its input wait (`timed_take`). XLA has
        no clock: its validation is not stamped (its time counts as training's)."""
        steps_per_epoch, iterator = self.steps_per_epoch, self._iterator
        held = None if self.validation is None else self.validation.held
        test_step = resident_fit.test_step(self.model)

        @graph.function(jit_compile=True)
        def group(cut, count, validate, best):
            self._epochs(
                count,
                validate,
                best,
                train=lambda index: steps(cut, index * steps_per_epoch, steps_per_epoch),
                evaluate=lambda: resident_fit.compiled_in_order(held, test_step),
                now=Reads(None).now,
            )
            return tf.identity(self._results)

        @graph.function
        def run_group(count, validate, best):
            most = self.epochs_per_call * steps_per_epoch
            cut = resident_fit.timed_take(reads, iterator, count * steps_per_epoch, most)
            return group(cut, count, validate, best), tf.constant(0.0, tf.float64)

        return run_group

    def _epochs(self, count, validate, best, *, train, evaluate, now) -> tf.Tensor:
        """In the graph, `count` epochs: for each, the metrics reset (as fit does at an
        epoch's start), `train(index)` its steps, its results kept and the best weights
        tracked, then where `validate[index]` says `evaluate()` on the validation split, kept
        and tracked too; the seconds validation took by `now`'s stamps."""
        model, track = self.model, _Tracker(self.model, self.best, self._shadows)

        def validation(index, trained, best, validated):
            began = now(after=trained)  # fit runs validation and the best weights outside
            model.reset_metrics()  # its calls: not training's time
            evaluate()
            results = self._keep(1, index)
            best = track(best, results, validation=True)
            return best, validated + now(after=(results, best)) - began

        def epoch(index, state):
            best, validated = state
            model.reset_metrics()
            train(index)
            trained = self._keep(0, index)
            best = track(best, trained, validation=False)
            if self.validation is None:
                return best, validated
            if self.validation_freq == 1:  # no cond: validation in the loop's body itself
                return validation(index, trained, best, validated)
            return tf.cond(
                validate[index],
                lambda: validation(index, trained, best, validated),
                lambda: (best, validated),
            )

        state = (best, tf.constant(0.0, tf.float64))
        return graph.repeat(count, epoch, state)[1]


class _Window:
    """A group's reads cut once, before its first epoch (`StepReads` over all its steps: the
    counter moved, the passes' orders drawn and a row table gathered once a call; a cut an
    epoch made wine's epoch 120 ops, 89 this way: docs/benchmarks.md, "A twenty-second
    pass"); `epoch(index)` is the `reads` of epoch `index` for `Reads.steps`."""

    def __init__(self, read: Callable[[Any], Any], steps: int):
        self.read, self.steps = read, steps

    def epoch(self, index: tf.Tensor) -> Callable[[Any], Callable[[Any], Any]]:
        first = index * self.steps

        def reads(_count):  # the epoch's `steps` batches, read again as often as asked
            return lambda i: self.read(first + i)

        reads.rereads = True  # a gather: `Reads.steps` may read ahead past its last step
        return reads


class _Tracker:
    """In the graph, after an epoch's training or validation: where the monitored value beats
    `best` (the first of equals stays), the model's weights copied to `shadows`."""

    def __init__(self, model, best: BestCheckpoint | None, shadows):
        self.model, self.shadows = model, shadows
        self.key, self.validation, self.better = None, False, None
        if best is not None:
            self.validation = best.monitor.startswith("val_")
            self.key = best.monitor[4:] if self.validation else best.monitor
            self.better = tf.greater if best.mode == "max" else tf.less

    def __call__(self, best, results, *, validation: bool):
        if self.key is None or validation != self.validation or self.key not in results:
            return best  # not logged: BestCheckpoint never scores it either
        value = tf.cast(results[self.key], tf.float32)
        improved = tf.math.is_finite(value) & (tf.math.is_nan(best) | self.better(value, best))
        copies = [  # no cond: each one's branch graphs made tracing the group 0.1-0.2 s longer
            shadow.assign(tf.where(improved, tf.convert_to_tensor(weight), shadow))
            for shadow, weight in zip(self.shadows, self.model.weights, strict=True)
        ]
        with tf.control_dependencies(copies):  # the new best comes with its weights copied
            return tf.where(improved, value, best)
