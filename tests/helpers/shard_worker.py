"""One worker of a real 2-worker MultiWorkerMirroredStrategy cluster (TF_CONFIG from the
environment): reads TFRecord files through tfrecipe's loader, pipeline and distribute helper
under each auto-shard policy, and writes the example ids it saw, per policy, as JSON.

    python shard_worker.py FILE_GLOB POLICY [POLICY ...] OUT_JSON
"""

from __future__ import annotations

import json
import sys

import tensorflow as tf

from tfrecipe.data.distribute import Feed
from tfrecipe.data.distribute import distribute as distribute_dataset
from tfrecipe.data.pipeline import PipelineOptions, prepare
from tfrecipe.data.tfrecord import load


def main(pattern: str, out: str, policies: list[str]) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    splits = load(
        train_files=pattern,
        feature_key="features",
        feature_kind="float",
        feature_shape=[2],
        num_classes=2,
    )
    seen = {}
    for policy in policies:
        options = PipelineOptions(cache=None, shuffle_buffer=64, auto_shard_policy=policy)
        dataset = prepare(splits.train, options, split="train", training=True, seed=7)
        feed = Feed(global_batch_size=4, auto_shard_policy=policy)
        distributed = distribute_dataset(strategy, dataset, feed)
        ids = []
        for features, _ in distributed:  # one epoch
            for local in strategy.experimental_local_results(features):
                ids += [int(v) for v in local.numpy()[:, 0]]
        seen[policy] = ids
    with open(out, "w") as file:
        json.dump(seen, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[-1], sys.argv[2:-1])  # PATTERN POLICY... OUT_JSON
