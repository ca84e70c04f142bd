"""Shared fixtures: the real config composed with tiny-run overrides, and the real command line."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# One cache of the CPU's matmul peak and the steps' FLOPs (tfrecipe.perf.cache) for the whole
# test session, its xdist workers and the processes they start: runs calibrate once, not once
# per test, and never touch the user's cache.
os.environ.setdefault(
    "TFRECIPE_PERF_CACHE",
    str(
        Path(tempfile.gettempdir())
        / f"tfrecipe-perf-{os.environ.get('PYTEST_XDIST_TESTRUNUID', os.getpid())}.json"
    ),
)

# Small and fast, still the real code paths: 2 short epochs on the bundled digits. (Nothing
# model-specific here: tests switch models.)
TINY = [
    "loop.epochs=2",
    "loop.steps_per_epoch=3",
    "loop.verbose=0",
    "batching.per_replica_batch_size=16",
]


def _split_cpu_in_two() -> None:
    """In-process tests share one TensorFlow runtime: give it two logical CPUs up front, so
    mirrored tests get two replicas (logical devices cannot be added once TensorFlow started)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if not tf.config.get_logical_device_configuration(cpu):
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )


@pytest.fixture(autouse=True, scope="session")
def _two_logical_cpus_before_anything_starts_tensorflow() -> None:
    """Whichever test first starts TensorFlow in this process (a tier or `-k` selection may start
    with any), the CPU is split by then: mirrored tests need it, and it cannot happen later. Its
    intra-op threads are set as a run sets them (`strategy.intra_op_threads=auto`)."""
    from tfrecipe.distribute.strategy import configure_threads

    _split_cpu_in_two()
    configure_threads("auto")


@pytest.fixture
def compose_cfg() -> Callable[..., object]:
    """compose_cfg(*overrides, tiny=True): the config `python -m tfrecipe` would run."""
    from tfrecipe.config.compose import compose

    def _compose(*overrides: str, tiny: bool = True):
        return compose([*(TINY if tiny else []), *overrides])

    return _compose


@pytest.fixture
def train_run(tmp_path, compose_cfg):
    """train_run(*overrides, tiny=True) -> (summary, run_dir): one in-process training run."""
    _split_cpu_in_two()
    from tfrecipe.config.trust import Trust
    from tfrecipe.train import train

    counter = iter(range(1000))

    def _train(*overrides: str, tiny: bool = True):
        run_dir = tmp_path / f"run{next(counter)}"
        # The overrides are the test's command line: they grant what they name.
        trust = Trust.from_command_line(overrides)
        return train(compose_cfg(*overrides, tiny=tiny), run_dir=run_dir, trust=trust), run_dir

    return _train


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    """The fork server that runs the `cli` fixture's commands (tests/helpers/zygote.py)."""
    from tests.helpers.zygote import Zygote

    server = Zygote.start(tmp_path_factory.mktemp("zygote"))
    yield server
    server.stop()


@pytest.fixture
def cli(tmp_path, zygote) -> Callable[..., subprocess.CompletedProcess]:
    """cli(*args, cwd=tmp_path, env=None, fresh=False): runs `python -m tfrecipe ARGS` in its own
    process, forked from one that imported TensorFlow already (tests/helpers/zygote.py), or in a
    new interpreter where `env` changes what those imports read, or with `fresh=True`. The repo
    under test leads PYTHONPATH: a venv installed editable from another checkout would import
    that checkout's tfrecipe otherwise."""
    from tests.helpers.zygote import import_sensitive

    def _cli(*args: str, cwd=None, env: dict | None = None, timeout=300, fresh=False):
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), *filter(None, full_env.get("PYTHONPATH", "").split(os.pathsep))]
        )
        if not fresh and not import_sensitive(full_env, zygote.env):
            return zygote.run(list(args), cwd=cwd or tmp_path, env=full_env, timeout=timeout)
        return subprocess.run(
            [sys.executable, "-m", "tfrecipe", *args],
            cwd=cwd or tmp_path,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return _cli


# Fixtures that train a model or start `python -m tfrecipe` processes: a test using one is `heavy`.
HEAVY_FIXTURES = {"train_run", "train_in", "cli", "launch"}


# The files that take longest under `pytest -n 2` (measured, longest first). Run first, so that
# no worker is left alone with one of them at the end while the other idles (`--dist loadfile`
# hands out files in collection order); the SLURM file mostly waits on SLURM, so the other worker's
# training fills the CPU meanwhile.
LONGEST_FILES = (
    "test_slurm.py",
    "test_fault_tolerance.py",
    "test_commands.py",
    "test_groups.py",
    "test_cli.py",
    "test_mlflow.py",
    "test_multi_worker.py",
    "test_preemption.py",
    "test_backup.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Sorts every test into a tier: `heavy` (trains or starts processes: one of HEAVY_FIXTURES,
    or marked by hand), and `fast` (everything neither heavy nor slow: `pytest -m fast`); the
    longest files go first (LONGEST_FILES), the others keep their order."""
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    for item in items:
        if HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            if any(item.iter_markers("fast")):  # `-m fast` would train: the tier would lie
                raise pytest.UsageError(f"{item.nodeid} trains or starts processes: not `fast`")
            item.add_marker(pytest.mark.heavy)
        if not any(item.iter_markers("slow")) and not any(item.iter_markers("heavy")):
            item.add_marker(pytest.mark.fast)


def tiny(*extra: str) -> Sequence[str]:
    return [*TINY, *extra]
