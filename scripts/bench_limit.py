"""Each shipped model family and offline recipe with its defaults, as a fraction of its in-graph
compute limit, in one process per job.

    python scripts/bench_limit.py                    # every job, 3 epochs each
    python scripts/bench_limit.py --jobs cnn mlp --epochs 4
    python scripts/bench_limit.py --jobs cnn -- batching.steps_per_execution=20  # a knob

The default: `tfrecipe.train` with the job's config (epochs capped by --epochs); its steady-state
examples/s (summary.json's, the epochs after the first). The limit: right after that run, in the
same process, the same model's training step (`model.train_step` under the run's strategy) in a
`tf.while_loop` over one resident batch of the run's shape: no input pipeline, no callbacks, no
Python per step. `fraction` = default / limit (1.0: the defaults leave nothing on the table); the
limit is the median of 3 timings of `--limit-steps` steps after a warm-up. Both halves run
back to back in one process, so the machine's load weighs on both alike.

The text family needs a text dataset on disk (`--text-dir DIR` with one folder per class);
without one it is listed as skipped.
"""

from __future__ import annotations

import argparse
import json
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


def limit_examples_per_sec(model, element_spec, per_replica_batch, global_batch, steps):
    """The in-graph limit: `steps` training steps in a while loop over one resident batch."""
    import tensorflow as tf

    from tfrecipe.perf.flops import per_replica_spec

    spec = per_replica_spec(element_spec, per_replica_batch)
    batch = tf.nest.map_structure(
        lambda s: (
            tf.zeros(s.shape, s.dtype)
            if not s.dtype.is_floating
            else tf.random.uniform(s.shape, dtype=s.dtype)
        ),
        spec,
    )
    strategy = model.distribute_strategy
    step = getattr(model.train_step, "__wrapped_step__", model.train_step)

    if strategy is tf.distribute.get_strategy():  # no strategy: the step as it is

        def one_step(data):
            return step(data)
    else:

        def one_step(data):
            return strategy.run(step, args=(data,))

    @tf.function
    def loop(n):
        for _ in tf.range(n):
            one_step(batch)
        return tf.constant(0)

    loop(tf.constant(2)).numpy()  # traced, warmed up
    timings = []
    for _ in range(3):
        start = time.perf_counter()
        loop(tf.constant(steps)).numpy()
        timings.append(time.perf_counter() - start)
    return steps * global_batch / statistics.median(timings)


def run_job(name: str, overrides: list[str], epochs: int, limit_steps: int) -> dict:
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train
    from tfrecipe.training import performance

    measured = {}
    original = performance.perf_fields

    def perf_and_limit(model, **kwargs):
        fields = original(model, **kwargs)
        measured["limit"] = limit_examples_per_sec(
            model,
            kwargs["element_spec"],
            kwargs["per_replica_batch"],
            kwargs["global_batch"],
            limit_steps,
        )
        return fields

    performance.perf_fields = perf_and_limit
    cfg = compose([*overrides, f"loop.epochs={epochs}", "loop.verbose=0"])
    with tempfile.TemporaryDirectory() as run_dir:
        summary = train(cfg, run_dir=Path(run_dir) / "run")
    perf = summary["perf"]
    default = summary["examples_per_sec"]
    return {
        "job": name,
        "default_ex_s": round(default, 1),
        "limit_ex_s": round(measured["limit"], 1),
        "fraction": round(default / measured["limit"], 3),
        "input_wait": perf["input_wait_fraction"],
        "mfu": perf["mfu"],
        "steps_per_call": summary["steps_per_execution"],
        "precision": summary["precision"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=[j for j in JOBS if j != "text"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--limit-steps", type=int, default=60)
    parser.add_argument("--text-dir", help="a text_folder dataset (one folder per class)")
    parser.add_argument("overrides", nargs="*", help="after --: overrides for every job")
    options = parser.parse_args()
    for name in options.jobs:
        overrides = [*JOBS[name], *options.overrides]
        if name == "text":
            if not options.text_dir:
                print(json.dumps({"job": name, "skipped": "no --text-dir"}))
                continue
            overrides.append(f"dataset.data_dir={options.text_dir}")
        # one process per job: each starts TensorFlow afresh (logical CPUs for mirrored jobs)
        import subprocess

        child = subprocess.run(
            [sys.executable, __file__, "--one", name, str(options.epochs),
             str(options.limit_steps), json.dumps(overrides)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
        print(lines[-1] if lines else json.dumps({"job": name, "failed": child.stderr[-300:]}))
        sys.stdout.flush()
    print(json.dumps({"not benchmarked": NOT_HERE}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        name, epochs, limit_steps, overrides = sys.argv[2:6]
        print(json.dumps(run_job(name, json.loads(overrides), int(epochs), int(limit_steps))))
    else:
        main()
