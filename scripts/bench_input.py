"""Input-pipeline headroom: examples/s the input pipeline delivers alone vs. examples/s training
consumes, for the default models on their default-ish data, in one run.

    python scripts/bench_input.py [--steps 40] [--batch 128]

The data are TFRecord files of PNG-encoded uint8 images (so the pipeline pays for reading,
parsing and decoding, as with real files) read through tfrecipe's loader, pipeline (default
options: memory cache, seeded shuffle, normalization; `--augment` adds flip + crop) and
`data.distribute.distribute`. "input" iterates the distributed dataset alone; "train" is Model.fit on the
same dataset (compile and the first epoch excluded). Headroom = input / train; the goal is >= 10.
Cache off (`--no-cache`) measures decoding every epoch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from tfrecipe import models
from tfrecipe.data.distribute import Feed
from tfrecipe.data.distribute import distribute as distribute_dataset
from tfrecipe.data.pipeline import PipelineOptions, batch_transform, prepare
from tfrecipe.data.tfrecord import load

# model -> image shape of its default-ish data (mlp: MNIST-like, cnn: digits-like, resnet: CIFAR)
CASES = {"mlp": (28, 28, 1), "cnn": (8, 8, 1), "resnet": (32, 32, 3)}


def write_images(folder: Path, shape: tuple[int, int, int], n: int, files: int = 4) -> str:
    rng = np.random.default_rng(0)
    for f in range(files):
        with tf.io.TFRecordWriter(str(folder / f"{shape[0]}x{shape[2]}-{f}.tfrecord")) as writer:
            for _ in range(n // files):
                image = rng.integers(0, 256, size=shape, dtype=np.uint8)
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(
                                bytes_list=tf.train.BytesList(
                                    value=[tf.io.encode_png(image).numpy()]
                                )
                            ),
                            "label": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=[int(rng.integers(10))])
                            ),
                        }
                    )
                )
                writer.write(example.SerializeToString())
    return str(folder / f"{shape[0]}x{shape[2]}-*.tfrecord")


def input_rate(iterator, steps: int, batch: int) -> float:
    for _ in range(steps):  # warm-up: fills the cache and the prefetch buffers
        next(iterator)
    start = time.perf_counter()
    for _ in range(steps):
        next(iterator)
    return steps * batch / (time.perf_counter() - start)


def train_rate(model: keras.Model, dataset, steps: int, batch: int) -> float:
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)  # compile + warm-up
    start = time.perf_counter()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    return steps * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--augment", action="store_true")
    parser.add_argument("--no-cache", action="store_true")
    args = parser.parse_args()
    strategy = tf.distribute.get_strategy()
    options = PipelineOptions(
        augment_flip=args.augment,
        augment_crop_padding=4 if args.augment else 0,
        cache=None if args.no_cache else "memory",
    )
    print("| model | data | input ex/s | train ex/s | headroom |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in CASES.items():
            pattern = write_images(Path(tmp), shape, args.examples)
            splits = load(train_files=pattern, feature_shape=list(shape), num_classes=10)
            dataset = distribute_dataset(
                strategy,
                prepare(splits.train, options, split="train", training=True, seed=0),
                Feed(global_batch_size=args.batch, repeat=True, batch_map=batch_transform(options)),
            )
            fed = input_rate(iter(dataset), args.steps, args.batch)
            model = getattr(models, name)(input_shape=shape, num_classes=10)
            model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            trained = train_rate(model, dataset, args.steps, args.batch)
            print(
                f"| {name} | {'x'.join(map(str, shape))} PNG | {fed:,.0f} | {trained:,.0f} | "
                f"{fed / trained:.1f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
