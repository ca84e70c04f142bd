"""`pipeline.resident`: whether the training split lives on the device, and why (no TensorFlow).

A resident split is read and decoded once into tensors on the device; each step gathers its
batch from them in the graph by a per-pass permutation (tfrecipe.data.resident). It pays where a
step is short: Keras' fit calls its iterator's `get_next` once per step, even inside a
`steps_per_execution` loop, and that Python costs as much as a small model's step
(docs/performance.md, "Data on the device").

`auto` keeps the split on an accelerator when it fits under the cap (`cap_bytes`): the bytes it
holds there (after decoding, and after normalization when that runs once, before holding), on
every replica that holds a copy, at most `RESIDENT_SHARE` of the device's memory and at most
`RESIDENT_MAX_BYTES`. On a CPU it holds only for the models of CPU_HOLDS (the dense ones and
the default CNN), and streams for the others (CPU_STREAMS says why; `true` holds it there).
Everything else streams through tf.data as before. Beside a held training split the validation and test splits
are held too where all three fit under the same cap (`evaluation`), on a CPU too: there fit runs
several short epochs per call, each validated in the graph (tfrecipe.loops.epoch_groups). The run's plan
(`tfrecipe validate`) says what the config decides; summary.json's `resident` what the run chose
and why, with the bytes.

Importing this module does not import TensorFlow (the schema checks `pipeline.resident`).
"""

from __future__ import annotations

import dataclasses

from tfrecipe.errors import Problem

# Of a device's memory, the share a resident split may take (with every copy on that memory):
# the model, its optimizer state and the activations of a step need the rest.
RESIDENT_SHARE = 0.25
# Above this a split streams whatever the device holds: holding it is one read of the whole
# split through tf.data into host memory first (2x the bytes at the peak), and the per-step
# gather gains nothing on a step that large data makes long anyway.
RESIDENT_MAX_BYTES = 4 << 30

# On a CPU, `auto` holds the split for these models' steps: dense networks, whose steps take
# about a millisecond, so that fit's `get_next` and tf.data's per-batch work are a large share of
# each. Measured in one process, calls alternating (docs/benchmarks.md, "A ninth pass"): the MLP
# on the digits held ran 1.2-1.25x the streamed steps' speed at 0.8x their CPU time per step.
# And the default CNN, since its held loop calls each step at one site and builds its metrics
# without tracing the reads (docs/benchmarks.md, "A twentieth pass", 2-core EPYC): its first
# call 0.84-0.94 s against streamed 0.69-0.79 (with the first validation), its steady state
# 0.92-0.99 of its limit against 0.85-0.89, its input wait under 1% against 8-10%.
# Held and streamed it learns alike: test accuracy 0.975 against 0.978 over 17 seeds ("A
# twenty-first pass"; at learning rate 0.01 both stay at chance for about 6 seeds of 14).
CPU_HOLDS = frozenset({"tfrecipe.models.mlp", "tfrecipe.models.linear", "tfrecipe.models.cnn"})

# Why auto streams on a CPU for the other models (the ResNet, Keras' applications, the text
# model): not measured held there; the CNN before the change above was slower to start held
# (docs/benchmarks.md, "A ninth pass").
CPU_STREAMS = (
    "only the dense models and the default CNN are measured faster held on a CPU; "
    "pipeline.resident=true holds it"
)

# Strategies whose workers cannot each hold the split (`true` is refused, `auto` streams).
_STREAMING_STRATEGIES = {
    "multi_worker_mirrored": "each worker would need its own shard of the split (not built yet)",
    "parameter_server": "the coordinator feeds remote workers through tf.data",
    "central_storage": "the variables live on the host; replicas read batches from tf.data",
    "tpu": "not measured on a TPU",
}


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """What a resident split may use: the device (`kind`, "CPU" or "GPU"), its memory in bytes,
    and how many copies of the split that memory would hold (replicas sharing it: logical CPUs
    of one host hold one copy each)."""

    kind: str
    total_bytes: int
    copies: int = 1


@dataclasses.dataclass(frozen=True)
class Choice:
    """Whether the training split is resident, and why (one line, in summary.json)."""

    resident: bool
    reason: str

    def fields(self) -> dict[str, object]:
        return {"resident": self.resident, "reason": self.reason}


def cap_bytes(memory: DeviceMemory) -> int:
    """The most one copy of a resident split may take on `memory`."""
    shared = int(RESIDENT_SHARE * memory.total_bytes) // max(memory.copies, 1)
    return min(shared, RESIDENT_MAX_BYTES)


def choose(
    setting: str | bool, *, held_bytes: float, memory: DeviceMemory, cpu_holds: bool = False
) -> Choice:
    """The choice for a split whose held copy takes `held_bytes` (infinite: not known before
    reading), under `pipeline.resident=setting` on `memory`. `true` holds whatever it takes
    (an out-of-memory error says so); `auto` holds what fits under `cap_bytes`, on a CPU only
    where `cpu_holds` (the model is one of CPU_HOLDS)."""
    size = _size(held_bytes)
    if setting is False:
        return Choice(False, "pipeline.resident=false")
    cap = cap_bytes(memory)
    where = (
        f"{size} x {memory.copies} on {memory.kind} ({_size(memory.total_bytes)}; cap "
        f"{_size(cap)} per copy: {RESIDENT_SHARE:.0%} of it, at most {_size(RESIDENT_MAX_BYTES)})"
    )
    if setting is True:
        return Choice(True, f"pipeline.resident=true: {where}")
    if memory.kind == "CPU" and not cpu_holds:
        return Choice(False, f"pipeline.resident=auto: streamed on a CPU ({CPU_STREAMS})")
    if held_bytes == float("inf"):
        return Choice(False, "pipeline.resident=auto: examples of a shape known only when read")
    if held_bytes > cap:
        return Choice(False, f"pipeline.resident=auto: over the cap: {where}")
    return Choice(True, f"pipeline.resident=auto: fits: {where}")


def evaluation(
    setting: str | bool, *, training: Choice, held_bytes: float, memory: DeviceMemory
) -> Choice:
    """Whether the validation and test splits are held too: only beside a held training split,
    and only where all the held splits together (`held_bytes`) pass what the training split
    alone had to (`choose`); else they stream. Each is evaluated in one call, in its order."""
    if not training.resident:
        return Choice(False, "the training split streams")
    choice = choose(setting, held_bytes=held_bytes, memory=memory, cpu_holds=True)
    return Choice(choice.resident, f"with the training split: {choice.reason}")


def streams_because(setting: str | bool, *, strategy: str, cache: str | None) -> str | None:
    """Why the config alone makes the training split stream, or None where the data decide."""
    if setting is False:
        return "pipeline.resident=false"
    if strategy in _STREAMING_STRATEGIES:
        return f"strategy={strategy}: {_STREAMING_STRATEGIES[strategy]}"
    if setting == "auto" and cache != "memory":
        return f"pipeline.cache={cache}: the data stay out of memory"
    return None


def plan_line(
    setting: str | bool, *, strategy: str, cache: str | None, cpu_holds: bool = False
) -> str:
    """The plan's line (`tfrecipe validate`): what the config decides of the training data
    (`cpu_holds`: the model is one of CPU_HOLDS)."""
    reason = streams_because(setting, strategy=strategy, cache=cache)
    if reason is not None:
        return f"training data: streamed ({reason})"
    if setting is True:
        return (
            "training data: resident on the device (pipeline.resident=true); validation and "
            "test held beside it, each evaluated in one call"
        )
    where = "on the device" if cpu_holds else "on an accelerator"
    cpu = "measured faster held on a CPU" if cpu_holds else "streamed on a CPU"
    return (
        f"training data: resident {where} where the decoded split fits under "
        f"{RESIDENT_SHARE:.0%} of its memory and {_size(RESIDENT_MAX_BYTES)}, {cpu} "
        "(pipeline.resident=auto; streamed tables and text stream); validation and test held "
        "beside it where all the splits fit, each evaluated in one call; several short epochs "
        "per call (batching.epochs_per_call); summary.json says which"
    )


def problems(setting: str | bool, *, strategy: str) -> list[Problem]:
    """`pipeline.resident=true` where the strategy cannot hold the split."""
    if setting is True and strategy in _STREAMING_STRATEGIES:
        return [
            Problem(
                "pipeline.resident",
                True,
                f"strategy={strategy} streams its input ({_STREAMING_STRATEGIES[strategy]}); "
                "use pipeline.resident=auto or false",
            )
        ]
    return []


def _size(num_bytes: float) -> str:
    if num_bytes == float("inf"):
        return "unknown size"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{int(num_bytes)} B"
