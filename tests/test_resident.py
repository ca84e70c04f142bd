"""`pipeline.resident`: the training split held on the device, batches gathered in the graph.

The cap from device descriptions (no device needed), the stream's promises on a small held
split (each example once per pass, another order each pass, the same for the same seed, a
restart at step N continues at batch N, each replica its share), and runs of both loops.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from tfrecipe.config.trust import Trust
from tfrecipe.data import residency
from tfrecipe.data.residency import DeviceMemory

GIB = 1 << 30
H200 = DeviceMemory("GPU", 141 * GIB)
SMALL_GPU = DeviceMemory("GPU", 2 * GIB)
HOST_TWO_REPLICAS = DeviceMemory("CPU", 8 * GIB, copies=2)
CIFAR10_FLOAT32 = 50_000 * 32 * 32 * 3 * 4  # 586 MiB normalized


def test_auto_holds_what_fits_under_a_share_of_the_devices_memory():
    assert residency.choose("auto", held_bytes=CIFAR10_FLOAT32, memory=H200).resident
    small = residency.choose("auto", held_bytes=CIFAR10_FLOAT32, memory=SMALL_GPU)
    assert not small.resident and "over the cap" in small.reason and "512.0 MiB" in small.reason
    # two replicas' copies share the host: each may take half the share
    assert residency.cap_bytes(HOST_TWO_REPLICAS) == GIB
    # whatever the device holds, no split above RESIDENT_MAX_BYTES is held by auto
    assert residency.cap_bytes(H200) == residency.RESIDENT_MAX_BYTES
    # on a CPU auto streams a convolutional model's split (measured slower held there) and
    # holds a dense one's (its short steps paid for fit's get_next)
    on_cpu = residency.choose("auto", held_bytes=1, memory=HOST_TWO_REPLICAS)
    assert not on_cpu.resident and "streamed on a CPU" in on_cpu.reason
    dense = residency.choose("auto", held_bytes=1, memory=HOST_TWO_REPLICAS, cpu_holds=True)
    assert dense.resident and "fits" in dense.reason
    over = residency.choose("auto", held_bytes=2 * GIB, memory=HOST_TWO_REPLICAS, cpu_holds=True)
    assert not over.resident and "over the cap" in over.reason
    unknown = residency.choose("auto", held_bytes=float("inf"), memory=H200)
    assert not unknown.resident and "known only when read" in unknown.reason


def test_true_and_false_decide_whatever_the_size():
    assert residency.choose(True, held_bytes=CIFAR10_FLOAT32, memory=SMALL_GPU).resident
    never = residency.choose(False, held_bytes=1, memory=H200)
    assert never.fields() == {"resident": False, "reason": "pipeline.resident=false"}


def test_validate_says_where_the_training_data_live_and_refuses_what_cannot_hold(compose_cfg):
    from tfrecipe.config import schema
    from tfrecipe.config.plan import RunPlan
    from tfrecipe.errors import ConfigError

    def plan_lines(*overrides):
        run = schema.validate(compose_cfg(*overrides), trust=Trust.from_command_line(overrides))
        return "\n".join(RunPlan.from_config(run).lines())

    accelerator = "training data: resident on an accelerator where the decoded split fits"
    assert accelerator in plan_lines("model=resnet")  # streamed on a CPU
    held = "training data: resident on the device where the decoded split fits"
    assert held in plan_lines() and held in plan_lines("model=mlp")  # the default CNN, dense
    assert held in plan_lines("recipe=diabetes_regression")
    assert "resident on the device (pipeline.resident=true)" in plan_lines("pipeline.resident=true")
    assert "training data: streamed (pipeline.resident=false)" in plan_lines(
        "pipeline.resident=false"
    )
    assert "streamed (strategy=parameter_server" in plan_lines(
        "strategy=parameter_server", "loop=custom", "cluster=local", "cluster.num_ps=1"
    )
    with pytest.raises(ConfigError) as refused:
        schema.validate(
            compose_cfg("pipeline.resident=true", "strategy=multi_worker_mirrored"),
            trust=Trust.of_this_process(),
        )
    assert "pipeline.resident" in str(refused.value)
    assert "multi_worker_mirrored streams its input" in str(refused.value)


def _held(num_rows=10, global_batch=4, seed=7, strategy=None, per_pass=None):
    import tensorflow as tf

    from tfrecipe.data.resident import HeldSplit, Layout

    rows = (tf.range(num_rows)[:, None], tf.range(num_rows))
    layout = Layout(global_batch, per_pass or -(-num_rows // global_batch), seed)
    return HeldSplit(rows, strategy=strategy or tf.distribute.get_strategy(), layout=layout)


def _one_call(iterator, count: int) -> list:
    read = iterator.reads(count)
    return [read(i)[1] for i in range(count)]


def _joined(lists) -> list:
    return list(itertools.chain.from_iterable(lists))


def _labels(iterator, steps):
    return [next(iterator)[1].numpy().tolist() for _ in range(steps)]


def test_each_example_once_per_pass_in_another_order_each_pass():
    from tfrecipe.data.resident import ResidentTrain

    batches = _labels(iter(ResidentTrain(_held())), 6)  # 2 passes of 3 batches (4 + 4 + 2)
    first, second = _joined(batches[:3]), _joined(batches[3:])
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second
    again = _labels(iter(ResidentTrain(_held())), 6)
    assert again == batches  # the same seed: the same stream
    assert _labels(iter(ResidentTrain(_held(seed=8))), 3) != batches[:3]


def test_a_stream_restarted_at_step_n_continues_at_batch_n():
    from tfrecipe.data.resident import ResidentTrain

    held = _held()
    whole = _labels(iter(ResidentTrain(held)), 7)
    assert _labels(iter(ResidentTrain(held, start=4)), 3) == whole[4:]


def test_a_calls_batches_drawn_at_once_are_the_streams_across_passes():
    """A call reads its batches from the counter at once (`ResidentIterator.reads`): inside a
    pass, across a pass's end, over several passes and with a short batch, and with the batches
    a pass drops (drop_remainder), they are the stream's, batch for batch."""
    import tensorflow as tf

    from tfrecipe.data.resident import ResidentTrain

    for held in (_held(), _held(num_rows=11, per_pass=2)):  # a short last batch; 3 rows dropped
        stream = _labels(iter(ResidentTrain(held)), 12)
        for start, count in ((0, 3), (1, 2), (2, 3), (1, 8), (5, 7)):
            iterator = iter(ResidentTrain(held, start=start))
            call = tf.function(functools.partial(_one_call, iterator))
            assert [b.numpy().tolist() for b in call(count)] == stream[start : start + count]
            assert int(iterator.position.numpy()) == start + count


def test_a_compiled_calls_cut_keeps_its_shapes_and_the_streams_batches():
    """An XLA program compiles per shape of its arguments: a compiled call's cut (the orders
    of the passes its batches span, where each begins, which is short) has the same shapes
    from any start, and its batches are the stream's, batch for batch."""
    from tfrecipe.data.resident import ResidentTrain

    for held in (_held(), _held(num_rows=11, per_pass=2)):  # a short last batch; 3 rows dropped
        stream = _labels(iter(ResidentTrain(held)), 12)
        shapes = set()
        for start, count in ((0, 3), (1, 2), (2, 3), (1, 8), (5, 7)):
            orders, begins, short = (t.numpy() for t in held.cut(start, 8, static=True))
            shapes.add((orders.shape, begins.shape, short.shape))
            sizes = [held.last_batch if s else held.layout.global_batch for s in short]
            batches = [orders[b : b + n].tolist() for b, n in zip(begins, sizes, strict=True)]
            assert batches[:count] == stream[start : start + count]
        assert len(shapes) == 1


def test_only_a_single_device_split_gathered_as_held_compiles_whole():
    """One XLA program a call only where it runs: one device, nothing drawn per batch, and on
    a CPU no convolution."""
    import tensorflow as tf

    from tfrecipe.data.pipeline import PipelineOptions
    from tfrecipe.data.resident import HeldSplit, batch_function

    assert _held().compiles_whole()
    assert not _held().compiles_whole(convolves=True)  # XLA:CPU's convolutions: 48x slower
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert not _held(strategy=mirrored).compiles_whole()  # XLA runs on one device
    per_batch = batch_function(PipelineOptions(augment_flip=True), lambda x, y: (x, y))
    plain = _held()
    augmented = HeldSplit(
        plain.copies[None], strategy=plain.strategy, layout=plain.layout, per_batch=per_batch
    )
    assert not augmented.compiles_whole()  # draws per batch: the step alone compiles


def test_the_graph_gathers_without_tf_data():
    import tensorflow as tf

    from tfrecipe.data.resident import ResidentTrain

    iterator = iter(ResidentTrain(_held()))

    @tf.function
    def three_steps():
        total = tf.constant(0)
        for _ in tf.range(3):
            total += tf.reduce_sum(next(iterator)[1])
        return total

    assert int(three_steps()) == sum(range(10))  # one pass, in one call
    assert int(iterator.position.numpy()) == 3


def _step_sites(function) -> int:
    """How many call sites of a function named `step` `function`'s graph holds, its loops'
    bodies included."""
    graph_def = function.get_concrete_function().graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    calls = ("PartitionedCall", "StatefulPartitionedCall")
    return sum(n.op in calls and "_step_" in n.attr["f"].func.name for n in nodes)


def test_the_held_loops_call_their_step_at_one_site_and_return_its_last_outputs():
    """Each call site of a step is a copy of it to trace and instantiate (the held CNN's: 35-45
    ms each): the training loop (`Reads.steps`) and the evaluation in order call it once, in
    their bodies, and return what the last step returned."""
    import tensorflow as tf

    from tfrecipe.data.resident import ResidentTrain, StepReads
    from tfrecipe.loops import resident_fit
    from tfrecipe.perf.clock import Reads

    held = _held()  # 10 rows in batches of 4: 4, 4, 2

    @tf.function(autograph=False)
    def step(batch):
        return {"labels": tf.reduce_sum(batch[1]), "rows": tf.shape(batch[1])[0]}

    stream = _labels(iter(ResidentTrain(held)), 5)
    iterator = iter(ResidentTrain(held))
    train = tf.function(lambda: Reads(None).steps(StepReads(iterator), step, 5), autograph=False)
    evaluate = tf.function(lambda: resident_fit.in_order(held, step), autograph=False)
    assert _step_sites(train) == 1 and _step_sites(evaluate) == 1
    last = train()
    assert (int(last["labels"]), int(last["rows"])) == (sum(stream[4]), len(stream[4]))
    assert int(iterator.position.numpy()) == 5
    last = evaluate()
    assert (int(last["labels"]), int(last["rows"])) == (8 + 9, 2)  # the last batch, short


def test_each_replica_gathers_its_share_of_the_global_batch():
    import tensorflow as tf

    from tfrecipe.data.resident import ResidentTrain

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    iterator = iter(ResidentTrain(_held(num_rows=9, strategy=strategy)))
    single = _labels(iter(ResidentTrain(_held(num_rows=9))), 3)
    for expected in single:
        shares = strategy.experimental_local_results(next(iterator)[1])
        sizes = [len(s) for s in shares]
        assert sizes == {4: [2, 2], 1: [1, 0]}[len(expected)]
        assert _joined(s.numpy().tolist() for s in shares) == expected


def test_a_full_batch_step_reads_the_whole_split_as_held_without_a_gather():
    """Where each batch is every row (full-batch training: the diabetes recipe), a call's
    steps read the held rows as they are, on each replica its tf.distribute share; no
    permutation is drawn and nothing gathered (they cost that recipe as much as its step)."""
    import tensorflow as tf

    from tfrecipe.data.resident import ResidentTrain

    held = _held(num_rows=6, global_batch=6)
    iterator = iter(ResidentTrain(held))
    read = tf.function(lambda: iterator.reads(3)(tf.constant(2)))
    assert read()[1].numpy().tolist() == list(range(6))
    ops = {op.type for op in read.get_concrete_function().graph.get_operations()}
    assert not ops & {"GatherV2", "StatelessShuffle", "StatelessWhile", "While"}, ops
    assert int(iterator.position.numpy()) == 3  # the call moved the stream past its steps
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    shares = next(iter(ResidentTrain(_held(num_rows=5, global_batch=5, strategy=strategy))))
    assert [s.numpy().tolist() for s in strategy.experimental_local_results(shares[1])] == [
        [0, 1, 2],
        [3, 4],
    ]


def test_whole_batches_have_a_static_size_on_every_replica():
    """Where every batch of a pass is whole, the graph knows their size (Keras' step runs on
    static shapes: the diabetes recipe's steps ran 1.5-2x as fast), in training and in order,
    on each replica too; a pass with a short batch leaves the batch's size open."""
    import tensorflow as tf

    from tfrecipe.data.resident import ResidentTrain

    def static_sizes(held, read):
        shapes = []

        @tf.function
        def call():
            shares = held.strategy.experimental_local_results(read()[1])
            shapes.extend(share.shape.as_list() for share in shares)
            return shares

        return shapes, [len(share) for share in call()]

    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    for held, whole in (
        (_held(num_rows=12), [[4]]),
        (_held(num_rows=11, per_pass=2), [[4]]),  # the rows a pass drops: every batch whole
        (_held(num_rows=10), [[None]]),  # 4 + 4 + 2
        (_held(num_rows=12, strategy=mirrored), [[2], [2]]),
        (_held(num_rows=9, global_batch=3, strategy=mirrored), [[2], [1]]),
    ):
        iterator = iter(ResidentTrain(held, start=1))
        shapes, sizes = static_sizes(held, lambda it=iterator: it.reads(2)(1))
        assert shapes == whole
        assert sizes == [size or 2 for [size] in whole]
        index = tf.Variable(1)  # a value the graph does not know
        in_order = static_sizes(held, lambda h=held, i=index: h.batch_in_order(i.read_value()))
        assert in_order[0] == whole
        constant = static_sizes(held, lambda h=held: h.batch_in_order(tf.constant(0)))  # read, too
        assert constant[0] == whole


def test_augmentation_runs_on_the_gathered_batch_seeded_by_the_step():
    import tensorflow as tf

    from tfrecipe.data.pipeline import PipelineOptions
    from tfrecipe.data.resident import HeldSplit, Layout, ResidentTrain, batch_function

    options = PipelineOptions(augment_flip=True)
    images = tf.cast(tf.reshape(tf.range(16 * 2 * 2), [16, 2, 2, 1]), tf.uint8)
    per_batch = batch_function(options, lambda x, y: (tf.cast(x, tf.float32), y))
    default = tf.distribute.get_strategy()
    held = HeldSplit(
        (images, tf.range(16)), strategy=default, layout=Layout(16, 1, 3), per_batch=per_batch
    )
    first, second = (next(iter(ResidentTrain(held)))[0].numpy() for _ in range(2))
    np.testing.assert_array_equal(first, second)  # seeded: the same step, the same flips
    x, y = next(iter(ResidentTrain(held, start=1)))
    flipped = x.numpy() != tf.cast(tf.gather(images, y), tf.float32).numpy()
    assert x.dtype == tf.float32 and flipped.any() and not flipped.all()


def _fit_calls(jit_compile: bool, num_rows: int) -> tuple[list[float], int, int]:
    """(each call's loss, the stream's position, the loop's traces) after 4 calls of fit's
    train function on a held split of `num_rows`, 3 steps a call."""
    import keras
    import tensorflow as tf

    from tfrecipe.data.resident import ResidentTrain
    from tfrecipe.loops import resident_fit

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3, jit_compile=jit_compile)
    held = _held(num_rows=num_rows, global_batch=4)
    held = type(held)(
        (tf.cast(held.copies[None][0], tf.float32), tf.cast(held.copies[None][1], tf.float32)),
        strategy=held.strategy,
        layout=held.layout,
    )
    iterator = iter(ResidentTrain(held))
    train_function = resident_fit._train_function(model, iterator)
    losses = [float(train_function(None)["loss"]) for _ in range(4)]
    return losses, int(iterator.position.numpy()), train_function.traces()


def test_fit_runs_every_call_of_a_held_split_in_one_traced_loop():
    """Each call runs steps_per_execution steps from the stream; the loop is traced once (a
    trace at a later call would land in the steady epochs the throughput counts). Compiled
    with XLA, a call is one program, whose steps are the plain loop's (a short batch too)."""
    for num_rows in (12, 10):  # whole batches; a pass of 4 + 4 + 2
        losses, position, traces = _fit_calls(False, num_rows)
        assert position == 12 and traces == 1  # 4 calls of 3 steps
        assert all(np.isfinite(losses))
        compiled = _fit_calls(True, num_rows)
        np.testing.assert_allclose(compiled[0], losses, rtol=1e-5)
        assert compiled[1:] == (12, 1)


def test_the_custom_loop_runs_a_held_split_as_one_xla_program_a_call(train_run):
    """With XLA the custom loop's calls and its held evaluation are one program each, as fit's:
    the plain loop's batches in its order (12 steps of 128 cross a pass of the digits' 1257
    rows, its last batch short), its metrics up to XLA's rounding."""
    common = ["model=mlp", "loop=custom", "batching.per_replica_batch_size=128"]
    common += ["loop.epochs=3", "loop.steps_per_epoch=4"]
    compiled, _ = train_run(*common, "batching.jit_compile=true")
    plain, _ = train_run(*common)
    assert compiled["resident"]["xla"] == "loop" and compiled["steps_completed"] == 12
    # the program has no clock: its wait is stamped around it, the orders drawn before it
    assert 0 < compiled["perf"]["input_wait_fraction"] < 1
    assert "input_wait_note" not in compiled["perf"]
    assert compiled["metrics"] == pytest.approx(plain["metrics"], rel=1e-4)
    assert compiled["test"] == pytest.approx(plain["test"], rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_both_loops_train_the_same_on_a_resident_split(train_run, strategy):
    """The same seed: fit and the custom loop see the same batches, and do the same again."""
    common = [f"strategy={strategy}", "deterministic=true", "model.dropout=0.0"]
    common.append("pipeline.resident=true")  # auto streams on a CPU
    if strategy == "mirrored":
        common.append("strategy.logical_cpus=2")
    fit, _ = train_run(*common, "loop=fit")
    custom, _ = train_run(*common, "loop=custom")
    again, _ = train_run(*common, "loop=fit")
    streamed, _ = train_run(*common, "loop=fit", "pipeline.resident=false")
    copies = 2 if strategy == "mirrored" else 1  # each logical CPU's replica holds its copy
    assert fit["resident"]["resident"] and f"KiB x {copies} on CPU" in fit["resident"]["reason"]
    assert fit["metrics"]["loss"] == pytest.approx(custom["metrics"]["loss"], rel=5e-4)
    assert again["metrics"] == fit["metrics"]
    assert streamed["resident"] == {
        "resident": False,
        "reason": "pipeline.resident=false",
        "evaluation": {"resident": False, "reason": "the training split streams"},
        "xla": None,  # nothing compiled (batching.jit_compile=auto on a CPU)
    }
    assert fit["resident"]["evaluation"]["resident"]  # validation and test held beside it
    assert streamed["steps_completed"] == fit["steps_completed"] == 6
