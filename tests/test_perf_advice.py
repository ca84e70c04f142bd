"""The perf diagnosis a user reads (issue 49, item 4): it names values the run does not use, and
a run of seconds says nothing about its perf on the console (summary.json still holds it)."""

from __future__ import annotations

import re

from tfrecipe.perf import report


def _suggested_values(line: str) -> dict[str, str]:
    """`key=value` pairs the line suggests."""
    return dict(re.findall(r"([a-z_]+\.[a-z_.]+)=(\w+)", line))


def test_every_value_the_diagnosis_suggests_differs_from_the_runs():
    knobs = report.Knobs(
        cache="memory",
        num_parallel_calls="autotune",
        steps_per_call=2,
        steps_per_epoch=10,
        per_replica_batch=64,
        validation_freq=1,
        prefetches=True,
    )
    line = report.diagnosis(
        0.5, knobs, step_ms=0.8, wall_split={"steps": 0.2, "validation": 0.5, "other": 0.3}
    )
    suggested = _suggested_values(line)
    assert suggested["batching.per_replica_batch_size"] == "128"
    assert suggested["loop.validation_freq"] == "2"
    assert "twice the run's 64" in line


def test_a_run_of_seconds_says_nothing_on_the_console_and_a_long_one_does():
    perf = {"diagnosis": "input-bound: the steps waited on input 40% of the training time; ..."}
    assert report.console_diagnosis(perf, wall_time_s=4.2) is None
    assert report.console_diagnosis(perf, wall_time_s=report.QUIET_UNDER_S) == perf["diagnosis"]
    assert report.console_diagnosis({"diagnosis": None}, wall_time_s=600) is None


def test_a_run_that_applies_every_remedy_is_told_none():
    done = report.Knobs(
        cache="memory",
        num_parallel_calls="autotune",
        steps_per_call=10,
        steps_per_epoch=10,
        per_replica_batch=16,
        prefetches=True,
    )
    line = report.diagnosis(0.97, done, step_ms=5.0)
    assert line == "input-bound: the steps waited on input 97% of the training time"


def test_a_held_split_is_not_told_to_tune_a_pipeline_it_does_not_have():
    """A split held on the device (pipeline.resident) is read once: its wait is the gather, so
    caching, a parallel map or prefetching would change nothing; a larger batch would."""
    streamed = report.Knobs(steps_per_call=10, steps_per_epoch=10, per_replica_batch=32)
    held = report.Knobs(steps_per_call=10, steps_per_epoch=10, per_replica_batch=32, held=True)
    told = report.diagnosis(0.3, streamed, step_ms=0.3)
    assert "pipeline.cache=memory" in told and "num_parallel_calls" in told
    line = report.diagnosis(0.3, held, step_ms=0.3)
    assert line.startswith("input-bound") and "per_replica_batch_size=64" in line
    assert not [word for word in ("pipeline.cache", "parallel", "prefetch") if word in line]
