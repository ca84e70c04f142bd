"""The training split held on the device, each step's batch gathered from it in the graph.

`pipeline.resident` (tfrecipe.data.residency decides and says why). A held split is read once;
its rows are normalized once where nothing augments them (else each gathered batch is augmented,
then normalized). Its training stream is the streamed one's contract:

- one pass = `steps_per_pass` global batches of a permutation of all rows, drawn statelessly
  from `(seed, pass)` (`tf.random.experimental.stateless_shuffle`): every example once per pass,
  another order each pass, the same order for the same seed (a batch of every row: as held);
- the stream is endless and counted in micro-batches from the run's start step: a run restored
  at step N continues with batch N of the same order (`ResidentTrain(start=N)`);
- each replica gathers its own share of the global batch on its own device (tf.distribute's
  split: the first `g % replicas` replicas take one example more of a short batch).

A `ResidentTrain` stands where a distributed dataset stood: the custom loop iterates it (its
`next` runs in the graph: a counter, a gather, no tf.data), and fit gets it through
`tfrecipe.loops.resident_fit`, which runs a call's steps without fit's `get_next` per step.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfrecipe import compat
from tfrecipe.data import residency
from tfrecipe.data.pipeline import PipelineOptions, augment_image


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the stream cuts a pass: `global_batch` rows per micro-batch, `steps_per_pass`
    micro-batches per pass (the last one short unless `drop_remainder`), seeded by `seed`."""

    global_batch: int
    steps_per_pass: int
    seed: int


def device_memory(strategy: tf.distribute.Strategy) -> residency.DeviceMemory:
    """The memory a resident split would live in, from the strategy's devices: a GPU's own
    (compat.gpu_memory_bytes), else the host's, shared by every logical CPU replica."""
    devices = _devices(strategy)
    name = devices[0] or (tf.config.list_logical_devices("GPU") or [None])[0]
    name = getattr(name, "name", name)
    if name is not None and "GPU" in name.upper():
        return residency.DeviceMemory("GPU", compat.gpu_memory_bytes(name), copies=1)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return residency.DeviceMemory("CPU", host, copies=len(devices))


def held_bytes(element_spec: Any, num_rows: int, *, normalized: bool) -> float:
    """What `num_rows` examples of `element_spec` take held (infinite where not known before
    reading: strings, shapes of unknown size). `normalized`: integer features held as float32."""
    total = 0.0
    for spec in tf.nest.flatten(element_spec):
        if not isinstance(spec, tf.TensorSpec) or spec.dtype == tf.string:
            return float("inf")
        if not spec.shape.is_fully_defined():
            return float("inf")
        size = spec.dtype.size
        if normalized and spec.dtype.is_integer:
            size = 4  # features to float32, class ids to int32
        total += num_rows * size * spec.shape.num_elements()
    return total


class HeldSplit:
    """One split's rows on each replica's device, and the pass permutations over them.

    Args:
      rows: the split's rows, a nest of tensors with the examples on axis 0.
      strategy: the run's strategy (a copy per replica device).
      layout: the stream's cut.
      per_batch: applied to each gathered batch: (batch, step seed) -> batch (augmentation,
        normalization), or None (the rows were normalized before holding).
    """

    def __init__(self, rows: Any, *, strategy, layout: Layout, per_batch: Callable | None = None):
        self.layout = layout
        self.num_rows = int(tf.shape(tf.nest.flatten(rows)[0])[0])
        self.strategy = strategy
        self.per_batch = per_batch
        self.devices = _devices(strategy)
        self.copies = {}
        for device in dict.fromkeys(self.devices):
            with tf.device(device):
                self.copies[device] = tf.nest.map_structure(tf.identity, rows)
        self.element_spec = tf.nest.map_structure(
            lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), rows
        )
        with tf.device("/CPU:0"):
            self._order = tf.Variable(tf.range(self.num_rows), trainable=False, name="order")
            self._order_pass = tf.Variable(-1, dtype=tf.int64, trainable=False, name="pass")
        self._seed = tf.constant(layout.seed, tf.int64)

    def order(self, pass_: tf.Tensor) -> tf.Tensor:
        """The permutation of pass `pass_` (drawn once per pass, then read)."""

        def drawn():
            order = self._draw(pass_)
            with tf.control_dependencies([self._order.assign(order)]):
                self._order_pass.assign(pass_)
            return tf.identity(order)

        with tf.device("/CPU:0"):
            return tf.cond(tf.equal(pass_, self._order_pass), self._order.read_value, drawn)

    def batch_at(self, step: tf.Tensor) -> Any:
        """Global micro-batch `step`, split over the replicas (each gathers its share)."""
        return self.batches(tf.cast(step, tf.int64), 1)(0)

    def batches(self, start: tf.Tensor, count: Any) -> Callable[[tf.Tensor], Any]:
        """Micro-batches `start` to `start + count` of the stream as `batch(i)`, in a graph, each
        split over the replicas (`indices`: no counter, permutation lookup or branch per step;
        none at all where each batch is the whole split: `whole_split`)."""
        indices = None if self.whole_split else self.indices(start, count)

        def batch(i: tf.Tensor) -> Any:
            seed = None  # only what augments a batch draws from it
            if self.per_batch is not None:
                seed = tf.stack([self._seed + 1, start + tf.cast(i, tf.int64)])
            return self._spread(None if indices is None else indices(i), seed)

        return batch

    def indices(self, start: Any, count: Any) -> Callable[[tf.Tensor], tf.Tensor]:
        """The rows of micro-batches `start` to `start + count` of the endless stream as
        `indices(i)`: the orders of the passes they span are drawn once, before the first, so
        step i's rows are a slice (docs/benchmarks.md, "A seventeenth pass"). Where every
        batch of a pass is whole, their size is static: Keras' step then runs on static
        shapes (the diabetes recipe's step of 0.05 ms ran 1.5-2x as fast: docs/benchmarks.md,
        "An eighteenth pass")."""
        orders, begins, short = self.cut(start, count)
        whole = self.layout.global_batch
        # each step's rows a row of one table a call: a gather a step, where a slice at step
        # i's begin and size took 11 ops (wine's step is 30-40)
        rows = begins[:, None] + tf.range(whole)
        if self.full_batches:
            table = tf.gather(orders, rows)
            return lambda i: tf.gather(table, i)
        # a short batch's overhang: clipped, then cut off
        table = tf.gather(orders, tf.minimum(rows, tf.size(orders) - 1))
        sizes = tf.where(short, self.last_batch, whole)[:, None]
        return lambda i: tf.slice(tf.gather(table, i), [0], tf.gather(sizes, i))

    def cut(
        self, start: Any, count: Any, *, static: bool = False
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(orders, begins, short) of micro-batches `start` to `start + count`: the orders of
        the passes they span, one after another, where each batch's rows begin in them, and
        whether it is its pass's short last batch (`last_batch` rows). `static` (`count` an
        int): shapes that do not depend on `start` (an XLA program compiles once): room for as
        many passes as `count` batches may span, those they do span drawn."""
        layout = self.layout
        steps = tf.cast(start, tf.int64) + tf.range(count, dtype=tf.int64)
        passes, index = (
            steps // layout.steps_per_pass,
            tf.cast(steps % layout.steps_per_pass, tf.int32),
        )
        first, spanned = passes[0], passes[-1] - passes[0] + 1
        if static:  # the first pass's order as drawn once, the next ones drawn, then zeros
            most = -(-count // layout.steps_per_pass) + 1
            later = tf.reshape(self._orders(first + 1, spanned - 1), [-1])
            padding = tf.zeros([(most - 1) * self.num_rows - tf.size(later)], tf.int32)
            orders = tf.concat([self.order(first), later, padding], 0)
            orders = tf.ensure_shape(orders, [most * self.num_rows])
        else:
            orders = tf.cond(  # a call inside one pass reads the pass's order, drawn once
                spanned == 1,
                lambda: self.order(first),
                lambda: tf.reshape(self._orders(first, spanned), [-1]),
            )
        begins = tf.cast(passes - first, tf.int32) * self.num_rows + index * layout.global_batch
        short = tf.logical_and(not self.full_batches, index == layout.steps_per_pass - 1)
        return orders, begins, short

    @property
    def whole_split(self) -> bool:
        """Whether each micro-batch is every row (full-batch training): their order changes
        only the order of a step's sums, so a step reads the rows as held, with no permutation
        or gather (they cost the diabetes recipe as much as its step: docs/benchmarks.md)."""
        return self.layout.steps_per_pass == 1 and self.layout.global_batch == self.num_rows

    @property
    def full_batches(self) -> bool:
        """Whether every micro-batch of a pass is a whole global batch (none short)."""
        return self.layout.steps_per_pass * self.layout.global_batch <= self.num_rows

    def compiles_whole(self, *, convolves: bool = False) -> bool:
        """Whether a model compiled with XLA runs its loops on this split as one XLA program a
        call (no op dispatched per step): on one device, with nothing applied to each gathered
        batch (augmentation draws per batch: there the step alone compiles), and on a CPU only
        for a model that does not convolve (`convolves`): XLA:CPU ran the default CNN's step in
        a compiled loop at 336 ms against TensorFlow's 7 (docs/benchmarks.md, "A nineteenth
        pass")."""
        if len(self.devices) != 1 or self.per_batch is not None:
            return False
        return not convolves or device_memory(self.strategy).kind != "CPU"

    @property
    def last_batch(self) -> int:
        """The rows of a pass's last micro-batch (a whole batch where `full_batches`)."""
        layout = self.layout
        return min(
            layout.global_batch, self.num_rows - (layout.steps_per_pass - 1) * layout.global_batch
        )

    def rows(self, indices: tf.Tensor) -> Any:
        """The rows at `indices` of the one replica's copy, as held (no `per_batch`)."""
        copy = self.copies[self.devices[0]]
        return tf.nest.map_structure(lambda t: tf.gather(t, indices), copy)

    def _orders(self, first: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
        """The permutations of passes `first` to `first + count`, one per row."""
        return tf.map_fn(self._draw, first + tf.range(count), fn_output_signature=tf.int32)

    def _draw(self, pass_: tf.Tensor) -> tf.Tensor:
        return tf.random.experimental.stateless_shuffle(
            tf.range(self.num_rows), seed=tf.stack([self._seed, pass_])
        )

    def batch_in_order(self, index: tf.Tensor) -> Any:
        """Batch `index` of the split in its order (evaluation: no permutation, the last batch
        short), split over the replicas as tf.distribute splits a streamed batch. Its size is
        static where every batch is whole, else open whatever `index` is: a constant index
        would let shape inference read a whole batch's size, and a step traced on it would be
        traced again for the others."""
        first = tf.cast(index, tf.int32) * self.layout.global_batch
        if self.full_batches:  # a static size, as in training
            indices = first + tf.range(self.layout.global_batch)
        else:
            first = tf.compat.v1.placeholder_with_default(first, [])  # a value it cannot read
            indices = tf.range(first, tf.minimum(first + self.layout.global_batch, self.num_rows))
        return self._spread(indices, tf.stack([self._seed + 1, tf.cast(index, tf.int64)]))

    def _spread(self, indices: tf.Tensor, seed: tf.Tensor) -> Any:
        if len(self.devices) == 1:
            return self._gather(self.devices[0], indices, seed, 0, 1)

        def replica_batch(context):
            replica, replicas = context.replica_id_in_sync_group, context.num_replicas_in_sync
            return self._gather(self.devices[replica], indices, seed, replica, replicas)

        return self.strategy.experimental_distribute_values_from_function(replica_batch)

    def _gather(self, device, indices, seed, replica: int, replicas: int):
        """`replica`'s share of the rows at `indices` (None: every row, in the held order)."""
        with tf.device(device):
            rows, seeds = self.copies[device], None
            if self.per_batch is not None or replicas > 1:
                size = self.num_rows if indices is None else indices.shape[0]
                size = size or tf.shape(indices)[0]
            if self.per_batch is not None:
                seeds = tf.random.experimental.stateless_split(seed, size)
            if replicas > 1:
                first, length = _share(size, replica, replicas)
                if indices is None:
                    rows = tf.nest.map_structure(lambda t: t[first : first + length], rows)
                else:
                    indices = indices[first : first + length]
                seeds = None if seeds is None else seeds[first : first + length]
            if indices is not None:
                rows = tf.nest.map_structure(lambda t: tf.gather(t, indices), rows)
            return rows if self.per_batch is None else self.per_batch(rows, seeds)


def _share(size: Any, replica: int, replicas: int) -> tuple[Any, Any]:
    """(first, length) of `replica`'s rows of a batch of `size` (an int where the graph knows
    it: the share's shape is static too), as tf.distribute splits a batch."""
    base, extra = size // replicas, size % replicas
    if isinstance(size, int):
        return replica * base + min(replica, extra), base + int(replica < extra)
    return replica * base + tf.minimum(replica, extra), base + tf.cast(replica < extra, tf.int32)


class ResidentIterator:
    """`next` in the graph: the batch at a step counter (a variable), which it advances."""

    def __init__(self, held: HeldSplit, start: int):
        self.held = held
        with tf.device("/CPU:0"):
            self.position = tf.Variable(start, dtype=tf.int64, trainable=False, name="position")

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        return self.reads(1)(0)

    get_next = __next__

    def reads(self, count: Any) -> Callable[[tf.Tensor], Any]:
        """The stream's next `count` batches as `batch(i)` (HeldSplit.batches), in a graph; the
        counter moves past them at once."""
        count = tf.cast(count, tf.int64)
        return self.held.batches(self.position.assign_add(count) - count, count)


@dataclasses.dataclass(frozen=True)
class StepReads:
    """The `reads` of `tfrecipe.perf.clock.Reads.steps` over `iterator`: `reads(count)` is a
    call's reader, `read(i)` step i's batch, or with `micro_batches` a list of that many
    micro-batches in order (gradient accumulation). A held split's call draws its batches from
    the counter at once (`ResidentIterator.reads`); any other iterator is read with `next`."""

    iterator: Any
    micro_batches: int | None = None

    @property
    def rereads(self) -> bool:
        """Whether a call's reader may read one of its batches again (a held split's: a
        gather), so a loop may read ahead past its last step (`Reads.steps`)."""
        return isinstance(self.iterator, ResidentIterator)

    def __call__(self, count: Any) -> Callable[[Any], Any]:
        per_step, iterator = self.micro_batches or 1, self.iterator
        held = iterator.reads(count * per_step) if isinstance(iterator, ResidentIterator) else None

        def micro_batch(index, k):
            if held is None:
                return next(iterator)
            return held(index if per_step == 1 else index * per_step + k)

        def read(index):
            batches = [micro_batch(index, k) for k in range(per_step)]
            return batches if self.micro_batches else batches[0]

        return read


@dataclasses.dataclass(frozen=True)
class ResidentTrain:
    """The endless training stream of a held split from micro-batch `start` on (what a
    distributed dataset was to the loops; `iter` gives a fresh counter at `start`)."""

    held: HeldSplit
    start: int = 0

    def __iter__(self) -> ResidentIterator:
        return ResidentIterator(self.held, self.start)

    @property
    def element_spec(self) -> Any:
        return self.held.element_spec

    def first_batch(self) -> Any:
        """The stream's first global batch, undistributed (a shape and dtype for fit's build)."""
        rows = self.held.indices(self.start, 1)(0)
        return tf.nest.map_structure(
            lambda t: tf.gather(t, rows), self.held.copies[self.held.devices[0]]
        )


@dataclasses.dataclass(frozen=True)
class HeldEval:
    """A held evaluation split (validation, test): its `layout.steps_per_pass` batches in order,
    every example once, the last batch short; what a finite distributed dataset was to the
    loops (tfrecipe.loops.resident_fit evaluates it in fit, the custom loop in its own)."""

    held: HeldSplit

    @property
    def num_batches(self) -> int:
        return self.held.layout.steps_per_pass

    @property
    def element_spec(self) -> Any:
        return self.held.element_spec

    def first_batch(self) -> Any:
        """The split's first global batch, undistributed (a stand-in's shape and dtype)."""
        rows = self.held.copies[self.held.devices[0]]
        return tf.nest.map_structure(lambda t: t[: self.held.layout.global_batch], rows)


def batch_function(options: PipelineOptions, finish: Callable) -> Callable:
    """(batch, per-example seeds) -> the batch augmented as `options` ask, then `finish`ed
    (normalization, class weights)."""

    def per_batch(batch, seeds):
        features, labels = batch
        if options.augments:
            features = tf.map_fn(
                lambda pair: augment_image(pair[0], pair[1], options),
                (features, seeds),
                fn_output_signature=features.dtype,
            )
        return finish(features, labels)

    return per_batch


def _hold(
    split: TrainingRows, *, strategy, layout: Layout, options: PipelineOptions, finish: Callable
) -> HeldSplit:
    """The split read once and held (normalized once unless augmentation needs the rows as
    read)."""
    rows = next(iter(split.dataset.batch(split.num_rows)))
    if not options.augments:
        return HeldSplit(finish(*rows), strategy=strategy, layout=layout)
    per_batch = batch_function(options, finish)
    return HeldSplit(rows, strategy=strategy, layout=layout, per_batch=per_batch)


def _devices(strategy: tf.distribute.Strategy) -> tuple[str | None, ...]:
    """The local replicas' devices (None: the default strategy's placement)."""
    try:
        return tuple(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy has no device list
        return (None,)


@dataclasses.dataclass(frozen=True)
class TrainingRows:
    """The training split as read: `num_rows` examples of `dataset`; `chunks`: a streamed table
    (`Splits.batched`), whose rows stay out of memory."""

    dataset: tf.data.Dataset
    num_rows: int
    chunks: bool = False


def hold_training(
    rows: TrainingRows,
    *,
    strategy: tf.distribute.Strategy,
    layout: Layout,
    options: PipelineOptions,
    finish: Callable,
    cpu_holds: bool = False,
) -> tuple[residency.Choice, HeldSplit | None]:
    """The training split held as `options.resident` and the cap decide (None: it streams),
    and why. `cpu_holds`: the model is one a CPU holds for (residency.CPU_HOLDS)."""
    reason = residency.streams_because(
        options.resident, strategy=_strategy_name(strategy), cache=options.cache
    )
    if reason is None and rows.chunks:
        reason = "a streamed table (dataset.stream): its rows stay out of memory"
    if reason is not None:
        return residency.Choice(False, reason), None
    size = held_bytes(rows.dataset.element_spec, rows.num_rows, normalized=not options.augments)
    memory = device_memory(strategy)
    choice = residency.choose(options.resident, held_bytes=size, memory=memory, cpu_holds=cpu_holds)
    if not choice.resident:
        return choice, None
    return choice, _hold(rows, strategy=strategy, layout=layout, options=options, finish=finish)


@dataclasses.dataclass(frozen=True)
class EvaluationRows:
    """The evaluation splits as read (`splits`: validation, test), evaluated in batches of
    `global_batch`, beside the `train` split (its size counts against the cap too)."""

    train: TrainingRows
    splits: dict[str, TrainingRows]
    global_batch: int


def hold_evaluation(
    rows: EvaluationRows,
    training: residency.Choice,
    *,
    strategy: tf.distribute.Strategy,
    options: PipelineOptions,
    finish: Callable,
) -> tuple[residency.Choice, dict[str, HeldEval]]:
    """The evaluation splits held beside a held training split, or none where they stream
    (residency.evaluation); and why. Evaluation never augments: each split is normalized
    (`finish`) once, as it is held."""
    train = rows.train
    size = held_bytes(train.dataset.element_spec, train.num_rows, normalized=not options.augments)
    for split in rows.splits.values():
        size += held_bytes(split.dataset.element_spec, split.num_rows, normalized=True)
    choice = residency.evaluation(
        options.resident, training=training, held_bytes=size, memory=device_memory(strategy)
    )
    if not choice.resident:
        return choice, {}
    held = {}
    for name, split in rows.splits.items():
        layout = Layout(rows.global_batch, -(-split.num_rows // rows.global_batch), seed=0)
        read = next(iter(split.dataset.batch(split.num_rows)))
        held[name] = HeldEval(HeldSplit(finish(*read), strategy=strategy, layout=layout))
    return choice, held


def _strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The config's name for the strategies that stream (residency._STREAMING_STRATEGIES)."""
    kinds = {
        "multi_worker_mirrored": tf.distribute.MultiWorkerMirroredStrategy,
        "parameter_server": tf.distribute.experimental.ParameterServerStrategy,
        "central_storage": tf.distribute.experimental.CentralStorageStrategy,
        "tpu": tf.distribute.TPUStrategy,
    }
    return next((name for name, kind in kinds.items() if isinstance(strategy, kind)), "")
