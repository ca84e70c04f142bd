"""A profiler window that xprof can analyse: `logger.tensorboard.profile_batch` = the first step
profiled, `logger.tensorboard.profile_steps` = how many steps (one per call).

Keras 3's TensorBoard callback marks its profiled batch with `Trace("Profiled batch", ...)`,
without the root marker `_r=1`, so xprof finds no step ("No step time measured"). Here each call
of the window runs inside `Trace("train", step_num=N, _r=1)`, in fit and the custom loop alike,
and when the window closes xprof's converter (used as a library: no server, no network; the
`profile` extra) reads the trace: the mean step time and the input-pipeline verdict go into
summary.json's `perf.profile`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

log = logging.getLogger("tfrecipe")


class StepProfiler(keras.callbacks.Callback):
    """Profiles steps `first` .. `first + steps - 1` of the run (0-based, counted over all
    epochs) into `log_dir`, one step per call, each call marked as a step.

    fit takes one step per call for the whole of a profiled run (Keras fixes its steps per
    call); the custom loop asks `call_steps` before each call, and takes the window's steps and
    the one before it (which traces the loopless step outside the window) one per call, and
    its planned calls elsewhere.

    Args:
      log_dir: the TensorBoard dir (the trace goes under plugins/profile/).
      first: the first step profiled (later than the first, which traces the graph).
      calls: how many steps, one per call.
    """

    def __init__(self, log_dir: Path, *, first: int, calls: int):
        super().__init__()
        self.log_dir, self.first, self.calls = log_dir, first, calls
        self.result: dict[str, Any] | None = None
        self._step = 0  # steps this run has taken
        self._call_began = 0
        self._trace: tf.profiler.experimental.Trace | None = None
        self._profiling = False

    @property
    def steps_seen(self) -> int:
        return self._step

    def call_steps(self, planned: int) -> int:
        """The steps the next call may take: up to the step before the window, then one per
        call through the window."""
        one_step_from = max(self.first - 1, 0)
        if self._step >= self.first + self.calls:
            return planned
        if self._step >= one_step_from:
            return 1
        return min(planned, one_step_from - self._step)

    def on_train_batch_begin(self, batch, logs=None):
        self._call_began = batch
        if not self._profiling and self.first <= self._step < self.first + self.calls:
            tf.profiler.experimental.start(str(self.log_dir))
            self._profiling = True
        if self._profiling:
            self._trace = tf.profiler.experimental.Trace("train", step_num=self._step, _r=1)
            self._trace.__enter__()

    def on_train_batch_end(self, batch, logs=None):
        if self._trace is not None:
            self._trace.__exit__(None, None, None)
            self._trace = None
        self._step += batch - self._call_began + 1
        if self._profiling and self._step >= self.first + self.calls:
            self._stop()

    def on_train_end(self, logs=None):
        if self._profiling:  # the run ended inside the window: what was traced
            self._stop()

    def _stop(self) -> None:
        tf.profiler.experimental.stop()
        self._profiling = False
        self.result = analyse(self.log_dir)


def analyse(log_dir: Path) -> dict[str, Any]:
    """xprof's input-pipeline analysis of the newest trace under `log_dir`: the steps it saw,
    their mean time, the share waiting on input and xprof's verdict."""
    traces = sorted(Path(log_dir).glob("plugins/profile/*/*.xplane.pb"))
    if not traces:
        return {"error": f"no trace under {log_dir}"}
    trace = traces[-1]
    found: dict[str, Any] = {"trace": str(trace.relative_to(log_dir))}
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError:
        found["error"] = "xprof is not installed: pip install 'tfrecipe[profile]'"
        return found
    with _quiet_stderr():
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(trace)], "input_pipeline_analyzer", {})
    return found | verdict(json.loads(data))


def verdict(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of xprof's input_pipeline_analyzer tables (its step table is the second)."""
    steps = tables[1] if len(tables) > 1 else {}
    column = [c["id"] for c in steps.get("cols", [])]
    times = [
        row["c"][column.index("stepTimeMs")]["v"]
        for row in steps.get("rows", [])
        if "stepTimeMs" in column
    ]
    conclusion = (steps.get("p") or {}).get("input_conclusion", "")
    share = re.search(r"([\d.]+)% of the total step time", conclusion)
    return {
        "steps": len(times),
        "step_time_ms": round(sum(times) / len(times), 3) if times else 0.0,
        "input_percent": float(share.group(1)) if share else None,
        "verdict": conclusion or "no steps found",
    }


@contextlib.contextmanager
def _quiet_stderr():
    """xprof's C++ logs every stage to stderr: kept aside, shown only if the analysis fails."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as aside:
        os.dup2(aside.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            aside.seek(0)
            log.error("xprof: %s", aside.read().decode(errors="replace")[-2000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
