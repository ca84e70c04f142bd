"""One worker of a real 2-worker MultiWorkerMirroredStrategy cluster (TF_CONFIG from the
environment): reads a CSV with an `id` column through dataset=csv's loader, the pipeline (seeded
shuffle) and the distribute helper under the default auto-shard policy, and writes the ids of
one epoch it saw as JSON.

    python csv_shard_worker.py CSV OUT_JSON
"""

from __future__ import annotations

import json
import sys

import tensorflow as tf

from tfrecipe.data.distribute import Feed
from tfrecipe.data.distribute import distribute as distribute_dataset
from tfrecipe.data.pipeline import PipelineOptions, batch_transform, prepare
from tfrecipe.data.tabular import csv


def main(path: str, out: str) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    splits = csv(
        path=path,
        label="y",
        categorical=["city"],
        validation_fraction=0,
        test_fraction=0,
        split_seed=0,
    )
    options = PipelineOptions(cache=None, shuffle_buffer=64)
    dataset = prepare(splits.train, options, split="train", training=True, seed=7)
    feed = Feed(global_batch_size=4, batch_map=batch_transform(options))
    distributed = distribute_dataset(strategy, dataset, feed)
    ids = []
    for features, _ in distributed:  # one epoch
        for local in strategy.experimental_local_results(features["id"]):
            ids += [int(v) for v in local.numpy()]
    with open(out, "w") as file:
        json.dump(ids, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
