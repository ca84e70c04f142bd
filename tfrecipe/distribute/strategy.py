"""Builds the tf.distribute strategy: the first TensorFlow call of a run.

Logical CPU devices must be configured before TensorFlow initializes its runtime, which is why
the strategy comes before precision, data and model.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
from collections.abc import Iterator

import tensorflow as tf

from tfrecipe.config import schema
from tfrecipe.errors import ConfigError
from tfrecipe.perf.provenance import cores

_Resolver = tf.distribute.cluster_resolver.ClusterResolver


def configure_logical_cpus(count: int) -> list[str]:
    """Splits the first CPU into `count` logical devices; returns their names.

    Called again in the same process (tests, sweeps), an existing split of at least `count`
    devices is reused; a larger split is impossible once TensorFlow has started.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu) or []
    if count > max(len(current), 1):
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
            )
        except RuntimeError:
            raise ConfigError(
                f"strategy.logical_cpus={count}: TensorFlow already started in this process with "
                f"{max(len(current), 1)} CPU device(s); logical devices must be set before the "
                "first TensorFlow operation (run tfrecipe in a fresh process)"
            ) from None
    return [f"/cpu:{i}" for i in range(count)]


# At most this many cores: one op runs on one thread (auto).
SINGLE_THREAD_OPS_MAX_CORES = 2


def configure_threads(intra_op: int | str) -> int:
    """Sets TensorFlow's intra-op threads (how many threads one op splits its work over) before
    its runtime starts; returns the number in effect (0: TensorFlow's default, every core).

    auto: 1 on a machine of at most SINGLE_THREAD_OPS_MAX_CORES cores, TensorFlow's default
    elsewhere or where TF_NUM_INTRAOP_THREADS is set. On the 2-core EPYC, ops on one thread
    each (the two cores then run independent ops side by side, TensorFlow's inter-op pool)
    trained the ResNet 1.44-1.47x as fast as ops split over both, the MLP 1.16-1.25x and the
    default CNN 1.00-1.06x (docs/benchmarks.md). Machines with more cores were not measured:
    there TensorFlow's default stays.
    """
    threading = tf.config.threading
    current = threading.get_intra_op_parallelism_threads()
    auto = intra_op == "auto"
    if auto:
        if os.environ.get("TF_NUM_INTRAOP_THREADS") or cores() > SINGLE_THREAD_OPS_MAX_CORES:
            return current
        intra_op = 1
    try:
        threading.set_intra_op_parallelism_threads(intra_op)
    except RuntimeError:  # started already (a sweep or tests in one process): auto keeps it
        if auto:
            return current
        raise ConfigError(
            f"strategy.intra_op_threads={intra_op}: TensorFlow already started in this process "
            f"(intra-op threads: {current or 'its default'}); they must be set before the first "
            "TensorFlow operation: run tfrecipe in a fresh process, or leave the key at auto"
        ) from None
    return intra_op


def configure_graph_optimizer(setting: bool | str, *, cpus_only: bool) -> bool:
    """Turns TensorFlow's graph optimizer, Grappler, on or off for the functions this process
    instantiates from now on; returns whether it is on. `cpus_only`: the run's devices are
    this process's CPUs alone.

    auto: off where `cpus_only`, else on. On the 2-core EPYC, a function rewritten by Grappler
    (its remapper, memory optimizer, constant folding, ...) first ran 0.1 s later for Keras'
    train function of the default CNN, 0.6 s for a graph loop of the ResNet's train step and
    1.6 s for the MobileNet's, and the steps after it ran no faster (docs/benchmarks.md, "A
    seventeenth pass"); oneDNN's own rewrites of the graph are not Grappler's and stay. A GPU's
    layout and fusion passes pay, and a parameter server's or TPU's functions run elsewhere:
    on there.
    """
    on = setting if isinstance(setting, bool) else not cpus_only
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": not on})
    return on


def _local_devices(spec_devices: list[str] | None, logical_cpus: int) -> list[str] | None:
    """Devices for the mirrored strategies: as configured, else all GPUs, else logical CPUs."""
    if spec_devices is not None:
        return list(spec_devices)
    if tf.config.list_physical_devices("GPU"):
        return None  # TensorFlow takes every visible GPU
    return configure_logical_cpus(logical_cpus)


_strategies_built = itertools.count()


def _fresh_collective_keys(strategy_class: type) -> None:
    """Gives the next strategy of `strategy_class` its own range of collective keys.

    Every MirroredStrategy starts its collective keys at the same value, so a second one in the
    same process (a sweep, the tests) whose all-reduces have other shapes fails with "Shape
    mismatch in the collective instance". TensorFlow's own tests move the same class attribute
    for each strategy they build (tensorflow/python/distribute/strategy_combinations.py).
    """
    from tfrecipe import compat  # imports Keras, as the other fixes' imports here do

    compat.set_collective_key_base(strategy_class, 100_000 * next(_strategies_built))


def _cross_device_ops(name: str, num_packs: int) -> tf.distribute.CrossDeviceOps | None:
    if name == "nccl" and not tf.config.list_physical_devices("GPU"):
        raise ConfigError(
            "strategy.cross_device_ops=nccl: NCCL needs GPUs and none is visible; "
            "use auto, hierarchical_copy or reduction_to_one_device"
        )
    factories = {
        "auto": lambda: None,
        "nccl": lambda: tf.distribute.NcclAllReduce(num_packs=num_packs),
        "hierarchical_copy": lambda: tf.distribute.HierarchicalCopyAllReduce(num_packs=num_packs),
        "reduction_to_one_device": tf.distribute.ReductionToOneDevice,
    }
    return factories[name]()


def _communication_options(
    spec: schema.MultiWorkerMirroredStrategy,
) -> tf.distribute.experimental.CommunicationOptions:
    if spec.implementation == "nccl" and not tf.config.list_physical_devices("GPU"):
        raise ConfigError(
            "strategy.implementation=nccl: NCCL needs GPUs and none is visible; use auto or ring"
        )
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=spec.bytes_per_pack,
        timeout_seconds=spec.timeout_seconds,
        implementation=getattr(
            tf.distribute.experimental.CommunicationImplementation, spec.implementation.upper()
        ),
    )


def _multi_worker_mirrored(
    spec: schema.MultiWorkerMirroredStrategy, cluster_resolver: _Resolver | None
) -> tf.distribute.Strategy:
    configure_logical_cpus(spec.logical_cpus)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=cluster_resolver, communication_options=_communication_options(spec)
    )
    from tfrecipe.compat import fix_multi_worker_fit

    fix_multi_worker_fit(strategy)  # keras-team/keras#20585, only where Keras needs it
    return strategy


def _parameter_server(
    spec: schema.ParameterServerStrategy, cluster_resolver: _Resolver | None
) -> tf.distribute.Strategy:
    if cluster_resolver is None:
        raise ConfigError(
            "strategy=parameter_server: needs a cluster; use cluster=local cluster.num_ps=1"
        )
    # No variable partitioner: Keras 3 optimizers cannot update sharded variables (the schema
    # refuses strategy.variable_partitioner other than none).
    strategy = tf.distribute.experimental.ParameterServerStrategy(cluster_resolver)
    from tfrecipe.compat import fix_shared_variable_increments

    fix_shared_variable_increments(strategy)  # concurrent workers lose metric updates otherwise
    return strategy


def _check_reachable(tpu: str, timeout_s: float = 10.0) -> None:
    """A grpc:// TPU address must accept connections: TensorFlow would wait for it forever."""
    if not tpu.startswith("grpc://"):
        return
    host, _, port = tpu.removeprefix("grpc://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s):
        pass


def _tpu(spec: schema.TPUStrategy, cluster_resolver: _Resolver | None) -> tf.distribute.Strategy:
    """Resolver, then connect, then initialize the TPU system (this order: initialization runs
    on the TPU the connection reaches), then the strategy."""
    try:
        _check_reachable(spec.tpu)
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=spec.tpu, zone=spec.zone, project=spec.project
        )
        if spec.tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, OSError, tf.errors.OpError) as error:  # OSError: URLError
        first_line = (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        raise ConfigError(
            f"strategy=tpu: no TPU reachable at strategy.tpu={spec.tpu!r} ({first_line}); "
            "run on a TPU VM, or set strategy.tpu to your TPU's name or grpc:// address"
        ) from None
    return tf.distribute.TPUStrategy(resolver)


def build_strategy(
    spec: schema.Strategy,
    *,
    cluster_resolver: _Resolver | None = None,
) -> tf.distribute.Strategy:
    """Returns the strategy `spec` describes (see conf/strategy/*.yaml).

    Args:
      spec: the strategy config.
      cluster_resolver: the cluster (tfrecipe.distribute.cluster.build_resolver) for multi-worker and
        parameter-server strategies; None = this process alone.
    """
    configure_threads(spec.intra_op_threads)
    elsewhere = spec.name in ("tpu", "parameter_server")
    cpus_only = not elsewhere and not tf.config.list_physical_devices("GPU")
    configure_graph_optimizer(spec.graph_optimizer, cpus_only=cpus_only)
    return _BUILDERS[spec.name](spec, cluster_resolver)


def _default(
    spec: schema.DefaultStrategy, cluster_resolver: _Resolver | None
) -> tf.distribute.Strategy:
    configure_logical_cpus(spec.logical_cpus)
    return tf.distribute.get_strategy()


def _one_device(
    spec: schema.OneDeviceStrategy, cluster_resolver: _Resolver | None
) -> tf.distribute.Strategy:
    configure_logical_cpus(spec.logical_cpus)
    device = spec.device or ("/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0")
    return tf.distribute.OneDeviceStrategy(device)


def _mirrored(
    spec: schema.MirroredStrategy, cluster_resolver: _Resolver | None
) -> tf.distribute.Strategy:
    _fresh_collective_keys(tf.distribute.MirroredStrategy)
    return tf.distribute.MirroredStrategy(
        devices=_local_devices(spec.devices, spec.logical_cpus),
        cross_device_ops=_cross_device_ops(spec.cross_device_ops, spec.num_packs),
    )


def _central_storage(
    spec: schema.CentralStorageStrategy, cluster_resolver: _Resolver | None
) -> tf.distribute.Strategy:
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=_local_devices(spec.devices, spec.logical_cpus),
        parameter_device=spec.parameter_device,
    )
    from tfrecipe.compat import fix_shared_variable_increments

    fix_shared_variable_increments(strategy)  # Keras metrics double-count otherwise
    return strategy


# schema.Strategy's names, each with what builds it from (spec, cluster_resolver).
_BUILDERS = {
    "default": _default,
    "one_device": _one_device,
    "mirrored": _mirrored,
    "central_storage": _central_storage,
    "multi_worker_mirrored": _multi_worker_mirrored,
    "parameter_server": _parameter_server,
    "tpu": _tpu,
}


def device_kinds(strategy: tf.distribute.Strategy) -> set[str]:
    """The kinds of device ("CPU", "GPU", "TPU") the strategy computes on."""
    if strategy is tf.distribute.get_strategy():  # the default strategy places ops by itself
        return {"GPU"} if tf.config.list_physical_devices("GPU") else {"CPU"}
    devices = strategy.extended.worker_devices
    return {tf.DeviceSpec.from_string(d).device_type or "CPU" for d in devices}


@contextlib.contextmanager
def model_scope(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """`strategy.scope()`, for building the model and optimizer.

    Keras creates the state its layers update while training (BatchNormalization's moving
    statistics, the seed of Dropout and other random layers) with aggregation NONE, which
    CentralStorageStrategy cannot update in a replica context: training would fail. Under that
    strategy such variables get ONLY_FIRST_REPLICA, keeping what MirroredStrategy keeps in effect
    (the first replica's copy).
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(strategy.scope())
        if isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy):
            stack.enter_context(tf.variable_creator_scope(_first_replica_state))
        yield


def _first_replica_state(next_creator, **kwargs):
    aggregation = kwargs.get("aggregation") or tf.VariableAggregation.NONE
    if aggregation == tf.VariableAggregation.NONE and not kwargs.get("trainable", True):
        kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
    return next_creator(**kwargs)
