"""Each shipped model family and offline recipe with its defaults, as a fraction of its in-graph
compute limit, in one process per job.

    python scripts/bench_limit.py                    # every job, as many epochs as it has
    python scripts/bench_limit.py --jobs cnn mlp --epochs 4
    python scripts/bench_limit.py --jobs cnn -- batching.steps_per_execution=20  # a knob
    python scripts/bench_limit.py --jobs cnn mlp --repeats 3      # the median of 3 processes

The default: `tfrecipe.train` with the job's config (its own epochs, or --epochs); its steady-state
examples/s (summary.json's, the epochs after the first). The limit: right after that run, in the
same process, the same model's training step (`model.train_step` under the run's strategy) in a
`tf.while_loop` (compiled with XLA where the run compiles: `batching.jit_compile`) over one
resident batch (the first of the run's own training input): no input
pipeline, no callbacks, no Python per step. `fraction` = default / limit (1.0: the defaults leave nothing on the table); the
limit is the median of 5 timings of at least `--limit-seconds` each (as many steps as fill
that), after a warm-up: a timing of a few dozen sub-millisecond steps swung 1.5x from run to run.
Both halves run back to back in one process, so the machine's load weighs on both alike.

Two more figures say where the rest goes, each as a fraction of the limit:
- `with_input`: the same loop taking each batch from the run's own training input (`next` on
  its distributed dataset; a held split's batches gathered as the run's loop gathers them)
  instead of the resident one: what the input pipeline costs in the graph, with no Python per
  step.
- `keras_call` (fit only): Keras' own train function (`model.make_train_function()`) called
  in a Python loop on that input, the run's steps per call each, with no callbacks: what a
  call costs besides its steps. Between it and the default: the callbacks around each call
  and the epochs' edges.
- `keras_fit` (fit only): Keras' own `Model.fit` on the run's model and inputs (its steps per
  epoch and call, its validation every epoch), with no callback but the throughput's, measured
  as the default is: what fit's epochs cost with nothing of tfrecipe's around them. The
  default's distance from it is tfrecipe's; its distance from `keras_call` is fit's epoch edges.

The text family reads a text_folder dataset: `--text-dir DIR` (one folder per class), or by
default one generated here (2 classes x 600 texts of 40-200 words, each class with its own
word frequencies), so every shipped family is measured offline.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # a checkout runs its own tfrecipe

JOBS = {
    "cnn": [],  # the default job
    "mlp": ["model=mlp"],
    "resnet": ["model=resnet"],
    "keras_app": ["model=keras_app", "model.input_size=32"],
    "text": ["model=text", "dataset=text_folder", "task=classification"],
    "recipe:wine_tabular": ["recipe=wine_tabular"],
    "recipe:breast_cancer_binary": ["recipe=breast_cancer_binary"],
    "recipe:diabetes_regression": ["recipe=diabetes_regression"],
    "recipe:digits_cnn_mirrored": ["recipe=digits_cnn_mirrored"],
    "recipe:digits_finetune": ["recipe=digits_finetune"],
}
# Recipes that need a network or a cluster: recipes/ lists them; not benchmarked here.
NOT_HERE = {
    "cifar10_*, mnist_*, imdb_text_binary": "download their data (TFDS)",
    "digits_parameter_server": "trains asynchronously on a cluster (no in-graph step here)",
    "sweep_lr_batch": "a sweep of the default job",
}


def limit_examples_per_sec(model, dataset, global_batch, seconds, *, resident=True):
    """The in-graph limit: training steps in a while loop over one resident batch (the first
    of `dataset`, the run's distributed training input: real values, which a text model's
    string ops need), or with `resident=False` over `dataset`'s batches, one per step."""
    import tensorflow as tf

    from tfrecipe import graph
    from tfrecipe.data.resident import ResidentIterator, StepReads

    iterator = iter(dataset)
    strategy = model.distribute_strategy
    step = getattr(model.train_step, "__wrapped_step__", model.train_step)

    if strategy is tf.distribute.get_strategy():  # no strategy: the step as it is

        def one_step(data):
            return step(data)
    else:

        def one_step(data):
            return strategy.run(step, args=(data,))

    # where the run compiles with XLA, so does its limit (the whole loop, as a held split's
    # loop compiles: tfrecipe.loops.resident_fit): a compiled run against a plain limit would
    # read above 1.0; the input's loop reads an iterator, which XLA cannot hold
    # (`graph.repeat`: a `tf.range` bound is a constant XLA compiles a program for, per value)
    # a held split's loop reads a call's batches at once, as the run's does (its `next` draws
    # the pass's order each time: a per-step cost the run does not pay)
    held = not resident and isinstance(iterator, ResidentIterator)

    @tf.function(jit_compile=bool(model.jit_compile) and resident, autograph=False)
    def loop(n, batch):
        read = StepReads(iterator)(n) if held else None

        def body(index, ran):
            data = batch if resident else read(index) if held else next(iterator)
            with tf.control_dependencies(tf.nest.flatten(one_step(data))):
                return ran + 1

        return graph.repeat(n, body, tf.constant(0))

    batch = next(iterator)
    loop(tf.constant(2), batch).numpy()  # traced, warmed up
    return global_batch * _units_per_sec(lambda n: loop(tf.constant(n), batch).numpy(), seconds)


def keras_call_examples_per_sec(model, dataset, global_batch, steps_per_call, seconds):
    """Keras' train function on `dataset` in a Python loop, `steps_per_call` steps per call,
    no callbacks (fit's own per-call cost, without the hooks around it)."""
    import tensorflow as tf

    model.train_function = None
    model.steps_per_execution = steps_per_call
    model.make_train_function()
    function = model.train_function
    iterator = iter(dataset)  # endless: training data repeat

    def run(n):
        for _ in range(n):
            tf.nest.map_structure(lambda t: t.numpy(), function(iterator))

    run(2)  # traced, warmed up
    return steps_per_call * global_batch * _units_per_sec(run, seconds)


def keras_fit_examples_per_sec(model, inputs, global_batch, steps_per_call, epochs):
    """Keras' fit on the run's inputs, no callback but the throughput's: its steady-state
    examples/s, as the run's summary counts them (the epochs after the first; where an epoch
    is one pass over the training split, its last batch as the rows it holds)."""
    from tfrecipe.callbacks import Throughput

    model.train_function = None
    model.steps_per_execution = steps_per_call
    rows = inputs.info.num_train
    a_pass = inputs.steps_per_epoch == math.ceil(rows / global_batch)
    throughput = Throughput(global_batch, examples_per_epoch=rows if a_pass else None)
    model.fit(
        inputs.train,
        validation_data=inputs.validation,
        steps_per_epoch=inputs.steps_per_epoch,
        epochs=max(epochs, 3),
        callbacks=[throughput],
        verbose=0,
        shuffle=False,
    )
    return throughput.examples_per_sec()


def _units_per_sec(run, seconds: float) -> float:
    """`run(n)` does n units of work (steps, calls): the median rate of 5 timings of as many
    units as take at least `seconds` each."""
    units, took = 1, 0.0
    while took < seconds / 4:
        units *= 4
        start = time.perf_counter()
        run(units)
        took = time.perf_counter() - start
    units = max(units, math.ceil(units * seconds / took))
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        run(units)
        timings.append(time.perf_counter() - start)
    return units / statistics.median(timings)


def train_keeping(overrides: list[str], after_training=None) -> tuple[dict, dict]:
    """Trains the job `overrides` name in this process; returns its summary and what it kept:
    the run's `model` and `inputs` (tfrecipe.training.inputs.Inputs). `after_training(model,
    train_data, global_batch)` runs where the run measures its perf, after its last epoch;
    its result is kept as `measured`."""
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train
    from tfrecipe.training import inputs, performance

    kept: dict = {}
    original, original_inputs = performance.perf_fields, inputs.build_inputs

    def keep_inputs(*args, **kwargs):
        kept["inputs"] = original_inputs(*args, **kwargs)
        return kept["inputs"]

    def keep_model(model, **kwargs):
        fields = original(model, **kwargs)
        kept["model"] = model
        if after_training is not None:
            train_data, global_batch = kept["inputs"].train, kwargs["measured"].global_batch
            kept["measured"] = after_training(model, train_data, global_batch)
        return fields

    inputs.build_inputs, performance.perf_fields = keep_inputs, keep_model
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            cfg = compose([*overrides, "loop.verbose=0"])
            return train(cfg, run_dir=Path(run_dir) / "run"), kept
    finally:
        inputs.build_inputs, performance.perf_fields = original_inputs, original


def run_job(name: str, overrides: list[str], epochs: int, limit_seconds: float) -> dict:
    def limits(model, train_data, global_batch):
        return {
            "limit": limit_examples_per_sec(model, train_data, global_batch, limit_seconds),
            "with_input": limit_examples_per_sec(
                model, train_data, global_batch, limit_seconds, resident=False
            ),
        }

    epochs_override = [f"loop.epochs={epochs}"] if epochs else []
    summary, kept = train_keeping([*overrides, *epochs_override], limits)
    perf, measured = summary["perf"], kept["measured"]
    default, limit = summary["examples_per_sec"], measured["limit"]
    keras_call = keras_fit = None
    # Keras' own call and fit need a tf.data input: measured where the run streams its data
    if summary["loop"] == "fit" and not summary["resident"]["resident"]:
        keras_call = keras_call_examples_per_sec(
            kept["model"],
            kept["inputs"].train,
            summary["global_batch_size"],
            summary["steps_per_execution"],
            limit_seconds,
        )
        keras_fit = keras_fit_examples_per_sec(
            kept["model"],
            kept["inputs"],
            summary["global_batch_size"],
            summary["steps_per_execution"],
            summary["epochs_completed"],
        )
    return {
        "job": name,
        "default_ex_s": round(default, 1),
        "limit_ex_s": round(limit, 1),
        "fraction": round(default / limit, 3),
        "with_input": round(measured["with_input"] / limit, 3),
        "keras_call": None if keras_call is None else round(keras_call / limit, 3),
        "keras_fit": None if keras_fit is None else round(keras_fit / limit, 3),
        "input_wait": perf["input_wait_fraction"],
        "wall_split": perf["wall_split"],
        "mfu": perf["mfu"],
        "steps_per_call": summary["steps_per_execution"],
        "precision": summary["precision"],
        "resident": summary["resident"]["resident"],
    }


def _generated_texts(root: Path, per_class: int = 600) -> Path:
    """A two-class text_folder dataset: each class draws its words from a shared vocabulary of
    2,000 with its own (seeded) frequencies."""
    import numpy as np

    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(2000)])
    for label in ("neg", "pos"):
        weights = rng.dirichlet(np.full(len(words), 0.3))
        folder = root / label
        folder.mkdir(parents=True)
        for i in range(per_class):
            text = " ".join(rng.choice(words, size=rng.integers(40, 200), p=weights))
            (folder / f"{i}.txt").write_text(text + "\n")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=list(JOBS))
    parser.add_argument("--epochs", type=int, default=0, help="0: the job's own")
    parser.add_argument("--limit-seconds", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=1, help="processes per job: the median")
    parser.add_argument("--text-dir", help="a text_folder dataset (one folder per class)")
    parser.add_argument("overrides", nargs="*", help="after --: overrides for every job")
    options = parser.parse_args()
    for name in options.jobs:
        overrides = [*JOBS[name], *options.overrides]
        if name == "text":
            text_dir = options.text_dir or _generated_texts(Path(tempfile.mkdtemp()) / "texts")
            overrides.append(f"dataset.path={text_dir}")
        runs = [_one_process(name, overrides, options) for _ in range(options.repeats)]
        print(json.dumps(_median_run(runs) if options.repeats > 1 else runs[0]))
        sys.stdout.flush()
    print(json.dumps({"not benchmarked": NOT_HERE}))


def _one_process(name: str, overrides: list[str], options: argparse.Namespace) -> dict:
    """One job in a process of its own: each starts TensorFlow afresh (logical CPUs for
    mirrored jobs, its intra-op threads)."""
    import subprocess

    child = subprocess.run(
        [
            sys.executable,
            __file__,
            "--one",
            name,
            str(options.epochs),
            str(options.limit_seconds),
            json.dumps(overrides),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"job": name, "failed": child.stderr[-300:]}


def _median_run(runs: list[dict]) -> dict:
    """The run whose fraction is the median, with every run's fraction beside it (a single
    process's fraction swung up to +-15% here), and each one's examples/s and limit: which
    of the two moved."""
    done = sorted((r for r in runs if "fraction" in r), key=lambda r: r["fraction"])
    if not done:
        return runs[0]
    return done[len(done) // 2] | {
        "fractions": [r["fraction"] for r in done],
        "default_and_limit": [[r["default_ex_s"], r["limit_ex_s"]] for r in done],
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        name, epochs, limit_seconds, overrides = sys.argv[2:6]
        print(json.dumps(run_job(name, json.loads(overrides), int(epochs), float(limit_seconds))))
    else:
        main()
