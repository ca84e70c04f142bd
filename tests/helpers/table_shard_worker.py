"""One worker of a real 2-worker MultiWorkerMirroredStrategy cluster (TF_CONFIG from the
environment): reads a streamed table (dataset=csv|parquet, `stream: true`) through the builder,
its own share (`Splits.for_worker`), the pipeline's shuffle and the distribute helper, and writes
the ids of the one epoch it saw as JSON.

    python table_shard_worker.py FORMAT PATH OUT_JSON
"""

from __future__ import annotations

import json
import sys

import tensorflow as tf

from tfrecipe.data import tabular
from tfrecipe.data.distribute import Feed, distribute, input_shard
from tfrecipe.data.pipeline import PipelineOptions, prepare


def main(kind: str, path: str, out: str) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    builder = tabular.csv if kind == "csv" else tabular.parquet
    splits = builder(
        path=path,
        label="y",
        categorical=["city"],
        validation_fraction=0,
        test_fraction=0,
        stream=True,
    )
    splits = splits.for_worker(*input_shard(strategy))
    options = PipelineOptions(shuffle_buffer=64)
    dataset = prepare(splits.train, options, split="train", training=True, seed=7, chunks=True)
    distributed = distribute(strategy, dataset, Feed(global_batch_size=8, chunks=True))
    ids = []
    for features, _ in distributed:  # one epoch
        for local in strategy.experimental_local_results(features["id"]):
            ids += [round(float(v)) for v in local.numpy()]
    with open(out, "w") as file:
        json.dump(ids, file)


if __name__ == "__main__":
    main(*sys.argv[1:])
