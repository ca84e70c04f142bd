"""summary.json, owned by one object: `RunSummary` holds its fields from the start of training
to how the run ended, and writes it; `record_unfinished` records a run that stopped before
training began. Its fields: README, Where outputs go."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import keras

from tfrecipe import rundir, tasks
from tfrecipe.config import schema
from tfrecipe.distribute import cluster
from tfrecipe.errors import ConfigError
from tfrecipe.fault import disk, preemption
from tfrecipe.loops import resident_fit
from tfrecipe.models import batch_norm
from tfrecipe.models.freeze import param_counts
from tfrecipe.perf import xla_cache
from tfrecipe.runs import RunDir
from tfrecipe.training import performance

log = logging.getLogger("tfrecipe")


class RunSummary:
    """summary.json as training goes: "running" from the start, updated where the run learns
    something (a rollback, the best epoch, the test scores, the exports), final at `finish`.

    Args:
      home: the run dir summary.json lives in.
      fields: its fields as training starts (`initial_fields`).
      started: `time.perf_counter()` when the run began, for `wall_time_s`.
    """

    def __init__(self, home: RunDir, fields: dict[str, Any], *, started: float):
        self.home = home
        self.fields = fields
        self.started = started

    @property
    def status(self) -> str:
        return self.fields["status"]

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def update(self, fields: Mapping[str, Any] = (), /, **more: Any) -> None:
        self.fields.update(fields, **more)

    def write(self) -> None:
        self.home.write_summary(self.fields)

    def start(self, config: Mapping[str, Any], *, chief: bool) -> None:
        """The run dir as training starts: the resolved public config and the "running" summary."""
        if chief:
            self.home.lock()  # creates it (a no-op when held: the command line locks)
        self.home.path.mkdir(parents=True, exist_ok=True)
        self.write()  # first: it marks the dir as a run's
        if chief:
            disk.reserve(self.home.path)  # room for the final summary.json, even on a full disk
        self.home.write_config(config)

    def finish(
        self,
        status: str,
        *,
        rows: list[dict[str, float]],
        steps_completed: int,
        examples_per_sec: float | None,
        error: BaseException | None = None,
    ) -> None:
        """The final summary.json (also after a failure, where `examples_per_sec` is not kept)."""
        # from the model's start: the last row's epoch, else those it was resumed at (or 0)
        epochs = int(rows[-1].get("epoch", len(rows))) if rows else self["epochs_completed"]
        self.fields.update(
            status=status,
            steps_completed=steps_completed,
            epochs_completed=epochs,
            metrics=final_metrics(rows),
            wall_time_s=round(time.perf_counter() - self.started, 3),
        )
        if error is not None:
            self.fields["error"] = disk.error_text(error, self.home.path)
        else:
            self.fields["examples_per_sec"] = examples_per_sec
        disk.settle(self.home.path)  # frees the reserve: the summary fits however full the disk is
        self.write()


@contextlib.contextmanager
def recording_unfinished(home: RunDir) -> Iterator[dict[str, RunSummary]]:
    """However the run in `home` ends, summary.json says how (the chief's, a worker's scratch
    dir's): also after a failure, SIGTERM
    or Ctrl-C before training began (a config error writes nothing). Yields the attempt, whose
    "summary" the run sets once the run dir holds it. The command line locks the run dir for
    the whole process; a lock taken here (train() called directly, a sweep's job) is given back
    when the run ends."""
    attempt: dict[str, RunSummary] = {}
    locked_before = home.held()
    with preemption.signals_preempt():
        try:
            yield attempt
        except ConfigError:
            raise
        except BaseException as error:
            summary = attempt.get("summary")
            if summary is None or summary.status == "running":  # not recorded by finish()
                status = "preempted" if isinstance(error, preemption.Preempted) else "failed"
                record_unfinished(home, summary, status, error)
            raise
        finally:
            if not locked_before:
                home.unlock()


def record_unfinished(
    home: RunDir, summary: RunSummary | None, status: str, error: BaseException
) -> None:
    """The final status of a run that stopped before training: this attempt's summary, else
    the one an earlier attempt left (a rerun), else a new one."""
    if home.chief:
        try:
            home.lock()  # creates it; never write into another run's dir
        except ConfigError:
            return
    text = disk.error_text(error, home.path)
    disk.settle(home.path)
    with contextlib.suppress(OSError):  # a disk full before the reserve was taken
        home.record_status(status, text, fields=(summary.fields if summary else None) or None)


def config_fields(
    *,
    strategy: schema.Strategy,
    loop: schema.Loop,
    model: schema.Target,
    dataset: schema.Target,
    precision: schema.Precision,
    seed: int,
) -> dict[str, Any]:
    """What summary.json records of the run's config (`initial_fields`, `ensemble_fields`)."""
    return {
        "strategy": strategy.name,
        "loop": loop.name,
        "model": model.target,
        "dataset": dataset.target,
        "precision": precision.policy,
        "seed": seed,
    }


def initial_fields(
    recorded: dict[str, Any],
    *,
    num_replicas: int,
    per_replica_batch: int,
    global_batch: int,
    learning_rate: float,
    run_dir: Path,
) -> dict[str, Any]:
    """summary.json as it stands when training starts; `recorded`: `config_fields(...)`."""
    return {
        "status": "running",
        "strategy": recorded["strategy"],  # keeps summary.json's key order
        "num_replicas": num_replicas,
        **recorded,
        "per_replica_batch_size": per_replica_batch,
        "global_batch_size": global_batch,
        "learning_rate": float(learning_rate),
        "epochs_completed": 0,
        "steps_completed": 0,
        "resumed_from_step": None,
        "rollbacks": [],  # {step, restored_step, learning_rate_factor}: see fault.recovery
        "stalls": [],  # {worker, step, stack_file, ...}: see fault.watchdog
        "metrics": {},
        "test": {},
        "examples_per_sec": None,
        "wall_time_s": None,
        "run_dir": str(run_dir.resolve()),
    }


def ensemble_fields(recorded: dict[str, Any], *, seeds: int, run_dir: Path) -> dict[str, Any]:
    """summary.json of an ensemble (`ensemble.seeds` > 1) as its members start; the batch and
    replica fields are its members' (each member's own summary.json has all of a run's)."""
    return {
        "status": "running",
        **recorded,
        "ensemble": {"seeds": seeds, "members": []},
        "epochs_completed": 0,
        "steps_completed": 0,
        "resumed_from_step": None,
        "rollbacks": [],
        "metrics": {},
        "test": {},
        "examples_per_sec": None,
        "wall_time_s": None,
        "run_dir": str(run_dir.resolve()),
    }


def log_choices(summary: Mapping[str, Any]) -> None:
    """The run's lines on what it chose where a reader asks: where its training data live and,
    where XLA caches its programs, in which folder (summary.json says why not otherwise). Logged
    once the run dir is the run's: a run refused before leaves no log there."""
    log.info("training data: %s", summary["resident"]["reason"])
    cache = summary["compile_cache"]
    if cache["directory"]:
        log.info("compile cache: %s (%s)", cache["reason"], cache["directory"])


def how_it_runs(model: keras.Model, *, steps_per_call: int, task: cluster.Task) -> dict[str, Any]:
    """What the `auto` knobs picked, and where it ran (`task`: this process's): a run says how
    it ran."""
    return {
        "precision": keras.mixed_precision.global_policy().name,
        "steps_per_execution": steps_per_call,
        "jit_compile": bool(model.jit_compile),
        "compile_cache": xla_cache.chosen(os.environ),  # XLA's persistent cache: the folder and why
        "fused_batch_norm": batch_norm.fused_layers(model),  # layers on the fused kernel
        "params": param_counts(model),  # trainable < total: model.freeze froze some
        "provenance": performance.run_provenance(task, model.distribute_strategy),
    }


def residency(data, model: keras.Model) -> dict[str, Any]:
    """summary.json's `resident`: where the training data live and why (`data`: the run's
    training.inputs.Inputs), and what XLA compiles (`xla`): a held split's `loop` whole (one
    program a call), each `step`, or nothing (None)."""
    held = getattr(data.train, "held", None)
    compiled = "loop" if held is not None and resident_fit.compiles_loop(model, held) else "step"
    return {**data.resident, "xla": compiled if model.jit_compile else None}


def about_data(task: tasks.TaskConfig, info) -> dict[str, Any]:
    """What the metrics are about: a binary task's positive class (auc, precision, recall)."""
    positive = tasks.positive_class(task, info)
    return {} if positive is None else {"positive_class": positive}


def options_used(phases, warm, class_weight) -> dict[str, Any]:
    """The options this run uses, where it uses them: the two-phase fine-tuning (filled in at
    the switch), the warm start, the class weights per class id."""
    used: dict[str, Any] = {}
    if phases is not None:
        used["finetune"] = phases.record
    if warm is not None:
        used["init_from"] = warm.summary()
    if class_weight is not None:
        used["class_weight"] = {str(c): float(w) for c, w in enumerate(class_weight)}
    return used


def earlier_warm_start(run_dir: Path) -> dict[str, Any]:
    """The warm start an earlier attempt of this run recorded: a resumed run restores its
    backup instead of warm-starting again, but its weights began there all the same."""
    earlier = (rundir.RunFiles(run_dir).summary() or {}).get("init_from")
    return {"init_from": earlier} if earlier else {}


def best_epoch(
    spec: schema.Callbacks, rows: list[dict[str, float]], *, epochs: int
) -> dict[str, Any]:
    """The best epoch by the checkpoint's monitor (early stopping's when only it is on) and the
    epoch early stopping stopped at (None: it ran all `epochs`), for summary.json and compare."""
    if not (spec.model_checkpoint.enabled or spec.early_stopping.enabled):
        return {}
    checkpoint = spec.model_checkpoint
    monitor, mode = (
        (checkpoint.monitor, checkpoint.mode)
        if checkpoint.enabled
        else (spec.early_stopping.monitor, "auto")
    )
    best = tasks.best_row(rows, monitor, mode)
    # the last epoch trained (a run started from another's checkpoint has no rows before it)
    last = int(rows[-1]["epoch"]) if rows else 0
    stopped = last if spec.early_stopping.enabled and last < epochs else None
    return {
        "best": None
        if best is None
        else {
            "epoch": int(best["epoch"]),
            "monitor": monitor,
            "value": best[monitor],
            "metrics": {k: v for k, v in best.items() if k != "epoch"},
        },
        "stopped_epoch": stopped,
    }


def final_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """The last epoch's metrics; validation metrics from the last epoch that validated."""
    metrics: dict[str, float] = {}
    for row in rows:
        metrics.update({k: v for k, v in row.items() if k != "epoch"})
    return metrics
