"""summary.json's `perf` block, its one-line diagnosis and the console's perf words."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# Above this share of training time waiting on input, the run says so and what to try.
INPUT_BOUND = 0.2
# Steps shorter than this are dominated by what runs around them (the call, its hooks, the
# iterator), not by the input's reading: a bigger batch is the remedy that counts.
SHORT_STEP_MS = 2.0
# A run shorter than this says nothing on the console about its perf (summary.json's `perf`
# still holds the diagnosis): a remedy could save it seconds at most.
QUIET_UNDER_S = 30.0
# Below this share of the steady state's wall time in its training calls, the run says where
# the rest went (validation, epoch-end callbacks).
STEPS_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The run's settings that decide its input wait: the diagnosis names only remedies not
    already in place. None: unknown (a remedy that depends on it is named)."""

    cache: str | None = None
    num_parallel_calls: str | int | None = None
    steps_per_call: int | None = None
    steps_per_epoch: int | None = None
    # what sets more steps per call (the custom loop: loop.steps_per_loop); None: nothing can
    steps_key: str | None = "batching.steps_per_execution"
    bounded_by: tuple[str, ...] = ()  # the hooks (`key=interval`) that keep calls short
    per_replica_batch: int | None = None
    validation_freq: int | None = None  # loop.validation_freq
    prefetches: bool | None = None  # the input ends in a prefetch (tfrecipe's always does)
    held: bool = False  # the training split is held on the device: no tf.data pipeline to tune


def remedies(knobs: Knobs, step_ms: float | None = None) -> list[str]:
    """What to try against input wait, given what the run already does."""
    tried = []
    if step_ms is not None and step_ms < SHORT_STEP_MS:
        batch = knobs.per_replica_batch
        larger = f"={2 * batch}, twice the run's {batch}" if batch else " larger"
        tried.append(
            f"a larger batch (batching.per_replica_batch_size{larger}: a {step_ms:.2g} ms step "
            "is mostly the work around it)"
        )
    if not knobs.held:  # a held split is read once: its wait is the gather in the graph
        tried += _pipeline_remedies(knobs)
    whole_epoch_calls = (
        knobs.steps_per_call is not None
        and knobs.steps_per_epoch is not None
        and knobs.steps_per_call >= knobs.steps_per_epoch
    )
    if knobs.steps_key is None:
        pass
    elif knobs.steps_per_call is None or knobs.steps_per_epoch is None:
        tried.append(f"more steps per call ({knobs.steps_key})")
    elif not whole_epoch_calls:
        tried.append(
            f"more steps per call ({knobs.steps_key}: {knobs.steps_per_call} of the epoch's "
            f"{knobs.steps_per_epoch}"
            + (f"; {', '.join(knobs.bounded_by)} bound it" if knobs.bounded_by else "")
            + ")"
        )
    if not whole_epoch_calls:  # one call per epoch: no hook runs between its steps
        tried.append(
            "fewer per-step Python hooks (logger.csv.every_n_steps, callbacks.backup.every_n_steps)"
        )
    return tried


def _pipeline_remedies(knobs: Knobs) -> list[str]:
    """What to try on a streamed input's tf.data pipeline."""
    tried = []
    if knobs.cache is None:
        tried.append("pipeline.cache=memory (data that fits in memory)")
    if knobs.num_parallel_calls != "autotune":
        tried.append("a parallel map (pipeline.num_parallel_calls=autotune)")
    if not knobs.prefetches:
        tried.append("prefetching in your dataset")
    return tried


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timing:
    """What the run's clocks measured.

    Attributes:
      input_wait: each local replica's input-wait fraction, or None (not measured: see note).
      wall_split: the steady state's wall time in training calls, validation and the rest
        (`StepClock.wall_split`).
    """

    examples_per_sec: float | None
    step_time_ms: Mapping[str, float] | None
    input_wait: list[float] | None
    input_wait_note: str | None
    wall_split: Mapping[str, float] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Compute:
    """What a step costs and what the devices could do.

    Attributes:
      peak_per_replica: one replica's device peak FLOP/s in the compute dtype (replicas that
        share one CPU share its peak).
    """

    flops_per_example: float | None
    peak_per_replica: float | None
    peak_source: str
    num_replicas: int


def perf_block(timing: Timing, compute: Compute, knobs: Knobs | None = None) -> dict[str, Any]:
    """The run's `perf` block: totals over all replicas, and `per_replica` figures."""
    examples_per_sec, step_time_ms = timing.examples_per_sec, timing.step_time_ms
    input_wait, wall_split = timing.input_wait, timing.wall_split
    flops_per_example, peak_per_replica = compute.flops_per_example, compute.peak_per_replica
    num_replicas = compute.num_replicas
    achieved = (
        examples_per_sec * flops_per_example if examples_per_sec and flops_per_example else None
    )
    peak = peak_per_replica * num_replicas if peak_per_replica else None
    wait = round(sum(input_wait) / len(input_wait), 4) if input_wait else None
    block: dict[str, Any] = {
        "examples_per_sec": _round(examples_per_sec),
        "step_time_ms": dict(step_time_ms) if step_time_ms else None,
        "input_wait_fraction": wait,
        "flops_per_example": _round(flops_per_example),
        "achieved_flops_per_sec": _round(achieved),
        "peak_flops_per_sec": _round(peak),
        "peak_source": compute.peak_source,
        "mfu": round(achieved / peak, 4) if achieved and peak else None,
        "replicas": num_replicas,
        "per_replica": _per_replica(
            examples_per_sec, achieved, peak_per_replica, input_wait, num_replicas
        ),
        "wall_split": dict(wall_split) if wall_split else None,
        "diagnosis": diagnosis(
            wait, knobs, step_time_ms and step_time_ms.get("median"), wall_split=wall_split
        ),
    }
    if timing.input_wait_note:
        block["input_wait_note"] = timing.input_wait_note
    return block


def _per_replica(
    examples_per_sec: float | None,
    achieved: float | None,
    peak_per_replica: float | None,
    input_wait: list[float] | None,
    num_replicas: int,
) -> dict[str, Any]:
    return {
        "examples_per_sec": _round(examples_per_sec and examples_per_sec / num_replicas),
        "achieved_flops_per_sec": _round(achieved and achieved / num_replicas),
        "peak_flops_per_sec": _round(peak_per_replica),
        "input_wait_fraction": input_wait,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")


def diagnosis(
    input_wait: float | None,
    knobs: Knobs | None = None,
    step_ms: float | None = None,
    *,
    wall_split: Mapping[str, float] | None = None,
) -> str | None:
    """One line when the steps waited on input more than INPUT_BOUND of the time, or when the
    training calls took under STEPS_SHARE of the wall time; else None. It names the remedies
    `knobs` (the run's settings) does not already apply."""
    knobs = knobs or Knobs()
    said = []
    if input_wait is not None and input_wait > INPUT_BOUND:
        tried = remedies(knobs, step_ms)  # none: the run applies every one already
        said.append(
            f"input-bound: the steps waited on input {input_wait:.0%} of the training time"
            + (f"; try {', '.join(tried)}" if tried else "")
        )
    if wall_split and wall_split["steps"] < STEPS_SHARE:
        said.append(_wall_words(wall_split, knobs))
    return "; ".join(said) or None


def console_diagnosis(perf: Mapping[str, Any], wall_time_s: float) -> str | None:
    """The diagnosis the console shows: none for a run of seconds (QUIET_UNDER_S)."""
    return perf.get("diagnosis") if wall_time_s >= QUIET_UNDER_S else None


def _wall_words(wall_split: Mapping[str, float], knobs: Knobs) -> str:
    """Where the wall time went besides the training calls, the larger share first."""
    every = knobs.validation_freq
    freq = (
        f"loop.validation_freq={2 * every} validates half as often as the run's {every}"
        if every
        else "a larger loop.validation_freq validates less often"
    )
    parts = {
        "validation": f"validation {wall_split['validation']:.0%} ({freq})",
        "other": f"epoch-end work {wall_split['other']:.0%} (best-weights saves, backups, "
        "exports, logs)",
    }
    ordered = sorted(parts, key=lambda name: -wall_split[name])
    return f"the training steps took {wall_split['steps']:.0%} of the wall time: " + ", ".join(
        parts[name] for name in ordered
    )


def perf_words(perf: Mapping[str, Any] | None) -> str:
    """The console's perf words: `perf 1.2e+04 ex/s, step 5.1 ms (p90 6.0), input wait 3%,
    26 GFLOP/s of 140 (MFU 19%)`; "" without a perf block."""
    if not perf or not perf.get("examples_per_sec"):
        return ""
    words = [f"{perf['examples_per_sec']:.4g} ex/s"]
    step = perf.get("step_time_ms")
    if step:
        words.append(f"step {step['median']:.3g} ms (p90 {step['p90']:.3g})")
    if perf.get("input_wait_fraction") is not None:
        words.append(f"input wait {perf['input_wait_fraction']:.0%}")
    achieved, peak = perf.get("achieved_flops_per_sec"), perf.get("peak_flops_per_sec")
    if achieved:
        flops = f"{achieved / 1e9:.3g} GFLOP/s"
        if peak:
            flops += f" of {peak / 1e9:.3g} (MFU {perf['mfu']:.1%})"
        words.append(flops)
    return "perf " + ", ".join(words)
