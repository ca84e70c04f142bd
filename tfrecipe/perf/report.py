"""summary.json's `perf` block, its one-line diagnosis and the console's perf words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Above this share of training time waiting on input, the run says so and what to try.
INPUT_BOUND = 0.2
REMEDIES = (
    "pipeline.cache=memory (data that fits in memory), a parallel map "
    "(pipeline.num_parallel_calls=autotune), prefetching in your dataset, more steps per call (batching.steps_per_execution / "
    "loop.steps_per_loop), fewer per-step Python hooks (logger.csv.every_n_steps, "
    "callbacks.backup.every_n_steps)"
)


def perf_block(
    *,
    examples_per_sec: float | None,
    step_time_ms: Mapping[str, float] | None,
    input_wait: list[float] | None,
    input_wait_note: str | None,
    flops_per_example: float | None,
    peak_per_replica: float | None,
    peak_source: str,
    num_replicas: int,
) -> dict[str, Any]:
    """The run's `perf` block: totals over all replicas, and `per_replica` figures.

    Args:
      input_wait: each local replica's input-wait fraction, or None (not measured: see note).
      peak_per_replica: one replica's device peak FLOP/s in the compute dtype (replicas that
        share one CPU share its peak).
    """
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
        "peak_source": peak_source,
        "mfu": round(achieved / peak, 4) if achieved and peak else None,
        "replicas": num_replicas,
        "per_replica": {
            "examples_per_sec": _round(examples_per_sec and examples_per_sec / num_replicas),
            "achieved_flops_per_sec": _round(achieved and achieved / num_replicas),
            "peak_flops_per_sec": _round(peak_per_replica),
            "input_wait_fraction": input_wait,
        },
        "diagnosis": diagnosis(wait),
    }
    if input_wait_note:
        block["input_wait_note"] = input_wait_note
    return block


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")


def diagnosis(input_wait: float | None) -> str | None:
    """One line when the steps waited on input more than INPUT_BOUND of the time, else None."""
    if input_wait is None or input_wait <= INPUT_BOUND:
        return None
    return (
        f"input-bound: the steps waited on input {input_wait:.0%} of the training time; "
        f"try {REMEDIES}"
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
