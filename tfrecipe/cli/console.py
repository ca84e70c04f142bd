"""The console while TensorFlow loads: its start-up INFO lines, and the cuInit error where no CUDA
driver is installed, stay off it (`discover_devices`); every other line shows."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys

# What TensorFlow's C++ side writes to fd 2 while it loads, before its log level applies
# (TF_CPP_MIN_LOG_LEVEL does not reach these lines in TF 2.21): INFO lines and absl's notice.
_START_UP_INFO = re.compile(
    rb"^(I\d{4} |WARNING: All log messages before absl::InitializeLog|To enable the following "
    rb"instructions: )"  # the second line of cpu_feature_guard's INFO
)
# Its line where no CUDA driver is installed, when it looks for GPUs: there a failed cuInit is the
# normal case (the CPU trains), not an error.
_NO_DRIVER_LINE = re.compile(rb"cuda_platform\.cc:\d+\] failed call to cuInit")


def discover_devices() -> None:
    """Imports TensorFlow and lets it find its devices, keeping its start-up INFO lines (unless
    TF_CPP_MIN_LOG_LEVEL=0 asks for them) and, where no CUDA driver is installed, the cuInit
    error off the console. Every other line shows, a failed cuInit on a machine with a driver
    too: there it is a real error."""
    _drop_quiet_finders()  # this import is filtered here
    with _loading():
        import tensorflow as tf

        tf.config.list_physical_devices()


def quiet_tensorflow_import() -> None:
    """From now on, whenever TensorFlow is first imported (by the Python API, `from tfrecipe.train
    import train`, or a subcommand), it loads with its start-up lines off the console, as
    `discover_devices` loads it, and its C++ INFO lines stay off after it (TF_CPP_MIN_LOG_LEVEL
    2 unless set: 0 shows them all). `import tfrecipe` calls it: a user sees tfrecipe's lines."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if any(isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietTensorFlow())


def _drop_quiet_finders() -> None:
    for finder in [f for f in sys.meta_path if isinstance(f, _QuietTensorFlow)]:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


@contextlib.contextmanager
def quiet_start_up():
    """Meanwhile, whenever TensorFlow is first imported (by whichever module, at whichever
    step of a subcommand), it loads as `discover_devices` loads it: its start-up lines off the
    console. A subcommand checks its arguments first and imports TensorFlow only when it needs
    it; this keeps that order and the console clean."""
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        yield
        return
    finder = _QuietTensorFlow()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


class _QuietTensorFlow:
    """A meta path finder for `tensorflow` alone: the real spec, its loader wrapped so that the
    module executes inside `discover_devices`' filter (then it steps aside)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        import importlib.util

        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # once: the real finders from here on
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        with _loading():
            self._loader.exec_module(module)
            module.config.list_physical_devices()

    def __getattr__(self, name: str):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self._loader, name)


@contextlib.contextmanager
def _loading():
    """While TensorFlow loads: its start-up lines off the console, and no pass of Python's cyclic
    garbage collector. The import makes objects by the million (modules, op wrappers) that live
    as long as the process, and each full pass walked them all: 6 passes of 0.09-0.25 s, 0.8 s of
    the import's 4.4 s on the 2-core Xeon, and Keras' `clear_session` at each run's start another
    0.2-0.27 s (docs/performance.md). Afterwards what exists is frozen (`gc.freeze`: no pass walks
    it again) and collection resumes as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with _stderr_without(*_hidden_lines()):
            yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _hidden_lines() -> list[re.Pattern[bytes]]:
    hidden = [] if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0" else [_START_UP_INFO]
    if not _cuda_driver_installed():
        hidden.append(_NO_DRIVER_LINE)
    return hidden


def _cuda_driver_installed() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")  # the driver TensorFlow's cuInit calls
    except OSError:
        return False
    return True


# The filter process of _stderr_without: drops the lines matching one of the patterns in argv.
_FILTER = """
import re, sys
hidden = [re.compile(pattern.encode()) for pattern in sys.argv[1:]]
for line in sys.stdin.buffer:
    if not any(pattern.search(line) for pattern in hidden):
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
"""


@contextlib.contextmanager
def _stderr_without(*lines: re.Pattern[bytes]):
    """Passes what is written to file descriptor 2 meanwhile (TensorFlow's C++ log writes there,
    below Python) through a filter that drops the lines matching one of `lines`. The filter is a
    process, not a thread: should TensorFlow abort this process (a CPU it cannot run on), the
    filter still passes its last words on."""
    import subprocess

    sys.stderr.flush()
    saved = os.dup(2)
    patterns = [line.pattern.decode() for line in lines]
    command = [sys.executable, "-I", "-S", "-c", _FILTER, *patterns]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=saved) as filtering:
        os.dup2(filtering.stdin.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            filtering.stdin.close()  # the filter reads to the end, then exits
