"""Run as a script: 24 steps that two real worker servers take from one training stream, read
as tfrecipe's parameter-server loop reads it (`own_batch`); prints each step's batch as
{"batches": [[worker, first example], ...]}.

Servers and coordinator share this process (real tf.distribute.Servers on loopback gRPC), which
is why it runs apart from the test process.
"""

import json

import tensorflow as tf
from ps_metric_count import cluster_strategy

from tfrecipe.data.distribute import Feed, distribute
from tfrecipe.loops.parameter_server import connected_workers, own_batch

STEPS, WORKERS = 24, 2


def main() -> None:
    strategy, _servers = cluster_strategy(WORKERS)  # the servers serve while referenced
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    examples = tf.data.Dataset.range(96).shuffle(96, seed=1, reshuffle_each_iteration=True)
    stream = distribute(strategy, examples, Feed(global_batch_size=4, repeat=True))
    iterator = iter(coordinator.create_per_worker_dataset(stream))
    workers = connected_workers()
    assert workers == WORKERS, workers

    @tf.function
    def step(iterator):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return worker, own_batch(iterator, workers)[0]

    results = [coordinator.schedule(step, args=(iterator,)) for _ in range(STEPS)]
    coordinator.join()
    batches = [[int(value) for value in result.fetch()] for result in results]
    print(json.dumps({"batches": batches}))


if __name__ == "__main__":
    main()
