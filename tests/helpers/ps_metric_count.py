"""Run as a script: a Keras Mean updated by 400 steps that two real worker servers run
concurrently, under tfrecipe's ParameterServerStrategy; prints {"count": ..., "total": ...}.

Servers and coordinator share this process (real tf.distribute.Servers on loopback gRPC), which
is why it runs apart from the test process.
"""

import json
import socket

import keras
import tensorflow as tf

from tfrecipe.config.schema import ParameterServerStrategy
from tfrecipe.distribute.strategy import build_strategy

STEPS, BATCH = 400, 64


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cluster_strategy(workers: int = 2):
    """tfrecipe's ParameterServerStrategy over `workers` worker servers and one parameter server
    started in this process; returns (strategy, servers): they serve while referenced."""
    roles = {"chief": 1, "worker": workers, "ps": 1}
    spec = {role: [f"127.0.0.1:{_free_port()}" for _ in range(n)] for role, n in roles.items()}
    cluster = tf.train.ClusterSpec(spec)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
    servers = [
        tf.distribute.Server(cluster, job_name=job, task_index=i, config=config, start=True)
        for job in ("worker", "ps")
        for i in range(len(spec[job]))
    ]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, rpc_layer="grpc", task_type="chief", task_id=0
    )
    strategy = build_strategy(
        ParameterServerStrategy(name="parameter_server"), cluster_resolver=resolver
    )
    return strategy, servers


def main() -> None:
    strategy, _servers = cluster_strategy()  # the servers serve while referenced
    with strategy.scope():
        mean = keras.metrics.Mean()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    @tf.function
    def step():
        strategy.run(lambda: mean.update_state(tf.ones([BATCH])))

    for _ in range(STEPS):
        coordinator.schedule(step)
    coordinator.join()
    print(json.dumps({"count": float(mean.count), "total": float(mean.total)}))


if __name__ == "__main__":
    main()
