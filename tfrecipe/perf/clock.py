"""Step times and input wait, measured while training runs.

- Step time: the wall time of each `tf.function` call (the batch hooks around it, as fit and
  the custom loop call them), divided by the steps it ran.
- Input wait: seconds the steps waited on their input, stamped in the graph. In fit on a
  streamed split, the step (`model.train_step`, replica context) stamps when its batch has
  arrived and when its weights were updated; the calls' time outside their steps is the wait
  (for input, and for the loop around the steps; measured: a metrics-only end stamp would come
  after the forward pass and count the backward pass as waiting). In the custom loop and in fit
  on a held split (tfrecipe.loops.resident_fit: no `get_next`, so no Keras loop around each
  step) the loop stamps its reads itself (`Reads`): a step's wait is its batch's arrival after
  the end of the step before it. There the wait is the input's own, and a call's other time
  outside its steps is the loop's, counted in the step time. Per replica: each replica keeps
  its own sum (a sync-on-read variable, read locally, no collective, so any worker of a
  cluster can read its own).

Both count the steady state only: the epochs after the first (the first traces the graph), or
with a single epoch its calls after the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfrecipe import compat, graph


class InputClock:
    """Seconds each replica computed its steps (fit) or waited for its input (the custom loop),
    summed in the graph (see the module docstring).

    Args:
      strategy: the run's strategy; the sums live in its scope, one per replica.
    """

    def __init__(self, strategy: tf.distribute.Strategy):
        on_read = {
            "synchronization": tf.VariableSynchronization.ON_READ,
            "aggregation": tf.VariableAggregation.SUM,
            "trainable": False,
            "dtype": tf.float64,
        }
        with strategy.scope():
            self.waited = tf.Variable(0.0, name="input_wait_s", **on_read)
            self.busy = tf.Variable(0.0, name="step_busy_s", **on_read)
        self.measuring: str | None = None  # "busy" (fit) or "waited" (custom loop): what is summed

    def timed_step(
        self, step: Callable[[Any], Any], data: Any, updated: Callable[[], list[tf.Tensor]]
    ) -> Any:
        """`step(data)` in replica context, its time from its batch's arrival to its update
        added to the replica's `busy` sum (the rest of a call's time is waiting: input, loop).

        `updated()` reads the weights after the step: the reads follow the step's assignments
        (the graph orders ops on one variable as written), so the end stamp follows the update;
        the outputs (metrics) alone are ready after the forward pass.

        The step itself does not wait for the arrival stamp: its ops that use the batch wait for
        it anyway, and holding all of them behind one more op cost a plain Keras MLP 12% per
        step on the 2-core EPYC (0.73 against 0.65 ms; tfrecipe's MLP job 0-3%, now 0-2%:
        scripts/bench_perf_overhead.py --steps).
        """
        with tf.control_dependencies(tf.nest.flatten(data, expand_composites=True)):
            arrived = tf.timestamp()
        outputs = step(data)
        done = [*tf.nest.flatten(outputs, expand_composites=True), *updated()]
        with tf.control_dependencies(done):
            self.busy.assign_add(tf.timestamp() - arrived)
        return outputs

    def add_wait(self, seconds: tf.Tensor) -> None:
        """Adds `seconds` of waiting to every local replica's sum (cross-replica context: one
        read feeds all replicas; `Reads` sets `measuring = "waited"`)."""
        for value in _components(self.waited):
            with tf.device(value.device):
                value.assign_add(seconds)

    def seconds(self) -> list[float]:
        """Each local replica's sum so far (no collective: read on this worker only)."""
        summed = self.busy if self.measuring == "busy" else self.waited
        return [float(value.numpy()) for value in _components(summed)]


class Reads:
    """A graph loop's reads of its batches (the custom loop's, and fit's on a held split:
    tfrecipe.loops.resident_fit), with an input `clock` stamped in the graph: a step's wait is
    how long after the step before it ended its batch was there (none when it was there
    first). Without a clock (`deterministic=true` refuses timestamps) the stamps are constants.

    Each batch is read while the step before it runs: TensorFlow does not run a loop's next
    read beside its step by itself (a read as long as its step, not read ahead, was waited for
    half the time). The stamps' order is what makes them a wait: a batch read ahead is stamped
    below the end stamp of the step it ran beside, in program order (timestamps keep it;
    stamped above, the end came after the batch's arrival and hid a gather slower than its
    step: 0.12 of a call's time where 0.76 was waited). The end stamp waits for the step's
    call, all it changes, and not for its outputs: only the loop's last step computes its logs
    (docs/benchmarks.md, "A seventeenth pass")."""

    def __init__(self, clock: InputClock | None):
        self.clock = clock
        if clock is not None:
            clock.measuring = "waited"  # from the first epoch's start on

    def steps(
        self,
        reads: Callable[[Any], Callable[[tf.Tensor], Any]],
        step: Callable[[Any], Any],
        count: tf.Tensor | None,
    ) -> Any:
        """`step(read(i))` for i in [0, `count`) (a tensor, >= 1) in a graph loop, where
        `read = reads(count)` is the call's reader, each batch read while the step before it
        runs (a call's first is not read ahead); with `count` None once and no loop (a
        profiler's window: xprof finds no step inside a loop). Returns the last step's outputs
        (`step` is a function of its own: its outputs wait for all it did)."""
        read = reads(1 if count is None else count)
        ended = self.now()
        batch, ready = self.next(read, 0, after=ended)
        self.waited(ready, ended)
        if count is None:
            return step(batch)

        def one(batch, upcoming_index):
            """A step, the next batch read beside it and waited for in the same iteration:
            a loop carries the batch and no stamps (each carried tensor is a few ops a step)."""
            upcoming = read(upcoming_index)  # read while the step runs: no stamp orders it after
            outputs = step(batch)
            ended = self.now(after=_calls(outputs))
            self.waited(self.now(after=upcoming), ended)  # the arrival stamped below `ended`
            return upcoming, outputs

        if getattr(reads, "rereads", False):
            # one site of the step, in the body (`graph.blank_outputs`: each site is a copy to
            # trace and instantiate); the last read ahead reads its own batch again (a gather,
            # beside the last step: its wait, counted, is a stamp's length but where it is slower)
            last = tf.cast(count, tf.int32) - 1
            state = (batch, graph.blank_outputs(step, batch))
            return graph.repeat(count, lambda i, s: one(s[0], tf.minimum(i + 1, last)), state)[1]
        batch = graph.repeat(count - 1, lambda i, batch: one(batch, i + 1)[0], batch)
        return step(batch)

    def now(self, after: Any = ()) -> tf.Tensor:
        """A stamp taken once `after` (tensors, or a call) is done."""
        if self.clock is None:
            return tf.constant(0.0, tf.float64)
        with tf.control_dependencies(tf.nest.flatten(after, expand_composites=True)):
            return tf.timestamp()

    def next(
        self, read: Callable[[Any], Any], index: Any, after: tf.Tensor
    ) -> tuple[Any, tf.Tensor]:
        """`read(index)`, made once `after` is there, and the stamp of its arrival."""
        if self.clock is None:
            return read(index), tf.constant(0.0, tf.float64)
        with tf.control_dependencies([after]):
            batch = read(index)
        return batch, self.now(after=batch)

    def waited(self, ready: tf.Tensor, ended: tf.Tensor) -> None:
        """Adds a step's wait: its batch's arrival after the last step's end, if later."""
        if self.clock is not None:
            self.clock.add_wait(tf.maximum(ready - ended, 0.0))


def _calls(outputs: Any) -> list[tf.Operation]:
    """The ops that made a step's `outputs`: its function's call, which a control edge waits
    for as a whole (its updates), without asking for the outputs' values."""
    tensors = tf.nest.flatten(outputs, expand_composites=True)
    return list({id(t.op): t.op for t in tensors if t is not None}.values())


def _components(variable: tf.Variable) -> tuple[tf.Variable, ...]:
    values = getattr(variable, "values", None)
    return tuple(values) if values is not None else (variable,)


def time_train_step(model: keras.Model, clock: InputClock) -> bool:
    """Makes fit's step stamp its input's arrival and its end (before fit traces it). Under XLA
    (`jit_compile`), which has no clock op, the step is compiled by itself, as Keras would, and
    the stamps sit around it, in the plain graph of fit's call: on the default strategy and
    OneDeviceStrategy. The others all-reduce inside the step (a `merge_call`, which TensorFlow
    refuses in a nested function): there the wait is not measured under XLA (returns False)."""
    step = model.train_step
    if model.jit_compile and not _step_compiles_alone(model.distribute_strategy):
        return False
    clock.measuring = "busy"
    if getattr(step, "_tfrecipe_clock", None) is clock:
        return True
    compiled = step
    if model.jit_compile:
        compiled = graph.function(step, jit_compile=True, reduce_retracing=True)
        _train_function_without_xla(model)

    def timed_step(data):
        return clock.timed_step(
            compiled, data, lambda: [tf.convert_to_tensor(v) for v in model.trainable_variables]
        )

    timed_step._tfrecipe_clock = clock
    timed_step.__wrapped_step__ = step  # what FLOPs are counted on
    model.train_step = timed_step
    model.train_function = None  # traced again, with the stamps
    return True


def _step_compiles_alone(strategy: tf.distribute.Strategy) -> bool:
    """The default strategy (no scope entered) or OneDeviceStrategy: no `merge_call` in the step."""
    default = not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy()
    return default or isinstance(strategy, tf.distribute.OneDeviceStrategy)


def _train_function_without_xla(model: keras.Model) -> None:
    """Keras compiles fit's whole replica step with XLA when `model.jit_compile`; the timed step
    compiles its inner step itself, so fit's train function is made without (evaluate's and
    predict's keep XLA, and `model.jit_compile` still says True)."""
    make = model.make_train_function

    def make_train_function(force=False):
        model.jit_compile = False
        try:
            return make(force)
        finally:
            model.jit_compile = True

    model.make_train_function = make_train_function


class StepClock(keras.callbacks.Callback):
    """Times each call (`on_train_batch_begin` to `_end`) and reads the input clock at the
    steady state's edges; validation is not counted.

    Args:
      clock: the run's input clock, or None where the loop cannot stamp its steps.
    """

    reads_logs_only = True  # a group of epochs in one call may run under it (loops.epoch_groups)
    # epochs per call after the first epoch's (tfrecipe.loops.epoch_groups): a group's calls, one
    # real call and its replays, are one call of the steady state
    epochs_per_call = 1

    def __init__(self, clock: InputClock | None):
        super().__init__()
        self.clock = clock
        self.calls: list[tuple[int, int, float]] = []  # (epoch, steps, seconds)
        self._epoch_training: list[tuple[int, float, list[float] | None]] = []
        self._epoch = 0
        # a single epoch's calls after its first: (seconds, wait per replica)
        self._single: tuple[float, list[float] | None] | None = None
        # per epoch: (wall seconds to the next epoch's start or training's end, its calls'
        # seconds, its validation's seconds)
        self._walls: list[tuple[float, float, float]] = []
        self._epoch_began: float | None = None
        self._last_wait: list[float] | None = None  # the clock at the last epoch's end
        self._tracing = _Tracing()  # TensorFlow's tracing in the first call and validation

    def on_train_begin(self, logs=None):
        self._last_wait = None  # a new fit (a rollback's) reads the clock afresh

    def on_epoch_begin(self, epoch, logs=None):
        self._close_epoch()
        self._epoch_began = time.perf_counter()
        self._validation_seconds = 0.0
        self._epoch = epoch
        self._epoch_seconds = 0.0
        self._epoch_first: tuple[float, list[float] | None] | None = None
        # The clock has not moved since the last epoch's end (validation does not stamp it):
        # one device read per epoch, not two, in the epoch's timed window.
        self._epoch_wait = self._last_wait if self._last_wait is not None else self._wait()

    def on_test_begin(self, logs=None):
        if self._epoch_began is not None and not self._walls:  # the first epoch's validation
            self._tracing.begin("first_validation")
        self._test_began = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._epoch_began is not None:  # validation inside an epoch, not the final test
            self._validation_seconds += time.perf_counter() - self._test_began
            self._tracing.end("first_validation")

    def on_train_end(self, logs=None):
        self._close_epoch()

    def _close_epoch(self) -> None:
        """The epoch that began last ends here (after every epoch-end callback ran)."""
        if self._epoch_began is None:
            return
        wall = time.perf_counter() - self._epoch_began
        self._walls.append((wall, self._epoch_seconds, self._validation_seconds))
        self._epoch_began = None

    def wall_split(self) -> dict[str, float] | None:
        """The steady state's wall time (the epochs after the first, or the only one) split
        into the training calls (`steps`), validation, and the rest (epoch-end callbacks:
        best-weights saves, backups, exports, logs; the loop's own Python)."""
        walls = self._walls[1:] or self._walls
        wall, steps, validation = (
            (sum(column) for column in zip(*walls, strict=True)) if walls else (0, 0, 0)
        )
        if wall <= 0:
            return None
        shares = {"steps": steps / wall, "validation": validation / wall}
        shares["other"] = max(1.0 - shares["steps"] - shares["validation"], 0.0)
        return {name: round(min(share, 1.0), 3) for name, share in shares.items()}

    def warm_up(self) -> dict[str, float] | None:
        """Where the first epoch's extra time went, and what a steady epoch spends outside its
        calls and validation, in seconds (None with fewer than two epochs):
        - `first_call`: the first training call beyond steady calls of as many steps (tracing
          the step; with XLA, compiling it);
        - `first_validation`: the first validation beyond a steady one (tracing evaluation);
        - `tracing`: of those two, the time tf.function spent tracing Python into graphs
          (TensorFlow's own counter, compat.tracing_seconds);
        - `compile`: the rest of those two: building the programs from the graphs (with XLA,
          compiling them or loading them from its persistent cache; else TensorFlow's graph
          optimization and first kernel set-up);
        - `first_epoch_rest`: the rest of the first epoch's extra (its other calls' warm-up,
          the first epoch-end callbacks);
        - `epoch_end`: a steady epoch's time outside calls and validation (saving: best weights,
          backups; logs)."""
        steady = self.steady_calls()
        if len(self._walls) < 2 or not self.calls or not steady:
            return None
        per_step = sum(s for _, s in steady) / max(sum(n for n, _ in steady), 1)
        _, first_steps, first_seconds = self.calls[0]
        first_call = first_seconds - first_steps * per_step
        later = self._walls[1:]
        wall, calls, validation = (sum(c) / len(later) for c in zip(*later, strict=True))
        epoch_end = wall - calls - validation
        first_validation = self._walls[0][2] - validation
        rest = self._walls[0][0] - wall - first_call - first_validation
        tracing = self._tracing.seconds()
        first_call, first_validation = max(first_call, 0.0), max(first_validation, 0.0)
        parts = {
            "first_call": first_call,
            "first_validation": first_validation,
            "tracing": tracing,
            "compile": first_call + first_validation - tracing,
            "first_epoch_rest": rest,
            "epoch_end": epoch_end,
        }
        return {name: round(max(value, 0.0), 3) for name, value in parts.items()}

    def on_train_batch_begin(self, batch, logs=None):
        if not self.calls:
            self._tracing.begin("first_call")
        self._first_step = batch
        self._call_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        seconds = time.perf_counter() - self._call_start
        if not self.calls:
            self._tracing.end("first_call")
        self.calls.append((self._epoch, batch + 1 - self._first_step, seconds))
        self._epoch_seconds += seconds
        if self._epoch_first is None and not self._epoch_training:
            # the first epoch's first call: where a single epoch's steady state starts
            self._epoch_first = (self._epoch_seconds, self._wait())

    def validated_inside(self, seconds: float) -> None:
        """The last call also validated for `seconds` (a group's, tfrecipe.loops.epoch_groups):
        validation's time, not the call's."""
        epoch, steps, call = self.calls[-1]
        self.calls[-1] = (epoch, steps, call - seconds)
        self._epoch_seconds -= seconds
        self._validation_seconds += seconds

    def on_epoch_end(self, epoch, logs=None):
        wait = self._last_wait = self._wait()
        self._epoch_training.append((epoch, self._epoch_seconds, _minus(wait, self._epoch_wait)))
        if len(self._epoch_training) == 1 and self._epoch_first is not None:
            first_seconds, first_wait = self._epoch_first
            self._single = (self._epoch_seconds - first_seconds, _minus(wait, first_wait))

    def _wait(self) -> list[float] | None:
        return self.clock.seconds() if self.clock is not None and self.clock.measuring else None

    def steady_calls(self) -> list[tuple[int, float]]:
        """(steps, seconds) of the steady state's calls."""
        epochs = {epoch for epoch, _, _ in self.calls}
        if len(epochs) > 1:
            first, group = min(epochs), self.epochs_per_call
            calls: dict[int, tuple[int, float]] = {}  # a group's calls are its one call
            for epoch, n, s in self.calls:
                if epoch != first:
                    steps, seconds = calls.get((epoch - first - 1) // group, (0, 0.0))
                    calls[(epoch - first - 1) // group] = (steps + n, seconds + s)
            return list(calls.values())
        return [(n, s) for _, n, s in self.calls[1:]]

    def step_times_ms(self) -> dict[str, float] | None:
        """Median and p90 of the steady state's step times (a call's time over its steps)."""
        per_step = [1000 * s / n for n, s in self.steady_calls() if n > 0]
        if not per_step:
            return None
        return {
            "median": round(float(np.median(per_step)), 3),
            "p90": round(float(np.percentile(per_step, 90)), 3),
        }

    def input_wait_fractions(self) -> list[float] | None:
        """Per local replica, the steady state's share of training time spent waiting on input."""
        if len(self._epoch_training) > 1:
            seconds = sum(s for _, s, _ in self._epoch_training[1:])
            waits = [w for _, _, w in self._epoch_training[1:]]
        elif self._single is not None:
            seconds, wait = self._single
            waits = [wait]
        else:
            return None
        if any(w is None for w in waits) or seconds <= 0:
            return None
        per_replica = np.sum(np.array(waits, dtype=float), axis=0)
        if self.clock.measuring == "busy":  # the rest of the calls' time is waiting
            per_replica = seconds - per_replica
        return [round(min(max(float(w) / seconds, 0.0), 1.0), 4) for w in per_replica]


def _minus(after: list[float] | None, before: list[float] | None) -> list[float] | None:
    if after is None or before is None:
        return None
    return [a - b for a, b in zip(after, before, strict=True)]


class _Tracing:
    """TensorFlow's tracing seconds inside named spans (each measured once: the first)."""

    def __init__(self):
        self._began: dict[str, float] = {}
        self._spans: dict[str, float] = {}

    def begin(self, span: str) -> None:
        if span not in self._spans:
            self._began[span] = compat.tracing_seconds()

    def end(self, span: str) -> None:
        began = self._began.pop(span, None)
        if began is not None and span not in self._spans:
            self._spans[span] = compat.tracing_seconds() - began

    def seconds(self) -> float:
        return sum(self._spans.values())
