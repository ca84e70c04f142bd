"""`loop.lr_find` / `tfrecipe lr-find`: a learning-rate range test on the real pipeline.

An exponential sweep from `min_lr` to `max_lr` over `steps` optimizer steps (Smith's range test,
Lightning's `Tuner.lr_find`), run by the run's own loop on its own strategy and distributed
training data: one step per "epoch", so every loop (fit, custom, parameter servers) sets the
rate before the step and reports that step's own loss after it. The sweep trains a separate
optimizer of the configured kind; afterwards the model's weights are put back and the model is
compiled again with the run's optimizer, untouched: training then starts where it would have.

The suggestion is the rate where the smoothed loss falls fastest (the steepest descent of the
loss against log10(lr), before its minimum), as Lightning suggests; the rate at the minimum of
the smoothed loss is recorded too (a rate ten times below it is the other common rule). The
sweep stops early once the smoothed loss exceeds `4 x` its minimum (it diverged).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np

from tfrecipe import files
from tfrecipe.config import schema
from tfrecipe.config.plan import RunPlan
from tfrecipe.distribute.strategy import model_scope
from tfrecipe.loops.options import LoopOptions
from tfrecipe.training.context import RunContext

log = logging.getLogger("tfrecipe")

# summary.json's mark of a run dir that `tfrecipe lr-find` (loop.lr_find.only) made.
OWN_MARK = "lr_find_only"
PLOT = "lr_find.png"
CURVE = "lr_find.csv"
_SMOOTHING = 0.9  # exponential moving average of the loss (bias-corrected)
_DIVERGED = 4.0  # stop once the smoothed loss exceeds this many times its minimum


def own_mark(spec: schema.LRFind) -> dict[str, bool]:
    """summary.json's mark of `tfrecipe lr-find`'s own run dir (where `spec.only`)."""
    return {OWN_MARK: True} if spec.only else {}


def check_own_run_dir(run_dir: Path, spec: schema.LRFind) -> None:
    """`tfrecipe lr-find` (`spec.only`) ends its run `completed`: it starts only in a new run
    dir or one of its own (summary.json marked `lr_find_only`), never in another run's (a
    preempted run marked completed could no longer resume).

    Raises:
      ConfigError: `run_dir` holds another run's summary.json.
    """
    from tfrecipe.errors import ConfigError
    from tfrecipe.rundir import SUMMARY, RunFiles

    if not (spec.enabled and spec.only):
        return
    summary = RunFiles(run_dir).summary()
    if summary is None and not os.path.lexists(run_dir / SUMMARY):
        return
    if summary is not None and summary.get(OWN_MARK):
        return
    status = (summary or {}).get("status", "unreadable")
    raise ConfigError(
        f"loop.lr_find.only=true: hydra.run.dir={run_dir} holds another run ({SUMMARY} says "
        f"status={status}); lr-find would end it as completed. Give lr-find a new hydra.run.dir"
    )


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What the sweep tries: `steps` rates from `min_lr` to `max_lr`, spaced evenly in log."""

    steps: int
    min_lr: float
    max_lr: float

    def rate(self, step: int) -> float:
        fraction = step / max(self.steps - 1, 1)
        return self.min_lr * (self.max_lr / self.min_lr) ** fraction


class _SweepCallback(keras.callbacks.Callback):
    """Sets each step's rate before it and records its loss after it (an epoch is one step)."""

    def __init__(self, sweep: Sweep, optimizer: keras.optimizers.Optimizer):
        super().__init__()
        self.sweep, self.optimizer = sweep, optimizer
        self.rates: list[float] = []
        self.losses: list[float] = []
        self._smoothed = 0.0
        self._best = math.inf

    def on_epoch_begin(self, epoch, logs=None):
        self.optimizer.learning_rate.assign(self.sweep.rate(epoch))

    def on_epoch_end(self, epoch, logs=None):
        loss = float((logs or {}).get("loss", math.nan))
        self.rates.append(self.sweep.rate(epoch))
        self.losses.append(loss)
        if not math.isfinite(loss):
            self.model.stop_training = True
            return
        self._smoothed = _SMOOTHING * self._smoothed + (1 - _SMOOTHING) * loss
        smoothed = self._smoothed / (1 - _SMOOTHING ** len(self.losses))
        self._best = min(self._best, smoothed)
        if len(self.losses) > 10 and smoothed > _DIVERGED * self._best:
            self.model.stop_training = True


@dataclasses.dataclass(frozen=True)
class Sweeping:
    """What the sweep trains with.

    Attributes:
      optimizer: the `optimizer` group, whose optimizer the sweep steps.
      objective: the task's loss and metrics (`LoopOptions.objective`).
      recompile: compiles `model` with `optimizer=` and `steps_per_execution=` as the run does.
    """

    optimizer: schema.Optimizer
    objective: Callable[[], tuple[Any, Any]]
    recompile: Callable[..., None]


def find_learning_rate(
    spec: schema.LRFind, model: keras.Model, loop, train_data, ctx: RunContext, sweeping: Sweeping
) -> dict[str, Any]:
    """Runs the sweep with `loop` on `train_data` (a fresh stream), puts the model back as it
    was, writes lr_find.png and lr_find.csv (the chief) and returns summary.json's `lr_find`."""
    plan, run_dir, chief = ctx.plan, ctx.home.path, ctx.chief
    optimizer, objective, recompile = sweeping.optimizer, sweeping.objective, sweeping.recompile
    sweep = Sweep(steps=spec.steps, min_lr=spec.min_lr, max_lr=spec.max_lr)
    weights = model.get_weights()
    run_optimizer, steps_per_execution = model.optimizer, model.steps_per_execution
    strategy = model.distribute_strategy
    with model_scope(strategy):
        swept = _sweep_optimizer(optimizer, plan, learning_rate=sweep.min_lr)
        recompile(model, optimizer=swept, steps_per_execution=1)
    recorder = _SweepCallback(sweep, _inner(swept))
    options = LoopOptions(
        epochs=sweep.steps,
        steps_per_epoch=1,
        verbose=0,
        steps_per_loop=1,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        objective=objective,
    )
    try:
        loop.run(model, train_data, None, options=options, callbacks=[recorder])
    finally:
        model.set_weights(weights)  # the model as it was before the sweep
        with model_scope(strategy):
            recompile(model, optimizer=run_optimizer, steps_per_execution=steps_per_execution)
        model.stop_training = False
    result = suggest(recorder.rates, recorder.losses)
    result.update(steps=len(recorder.rates), min_lr=sweep.min_lr, max_lr=sweep.max_lr)
    if chief:
        _write(run_dir, recorder.rates, recorder.losses, result)
        result.update(plot=PLOT, curve=CURVE)
    log.info(
        "lr_find: suggested learning rate %s (lowest loss at %s) after %d steps; plot: %s",
        result["suggested_learning_rate"],
        result["min_loss_learning_rate"],
        result["steps"],
        run_dir / PLOT,
    )
    return result


def _sweep_optimizer(spec: schema.Optimizer, plan: RunPlan, *, learning_rate: float):
    """The run's optimizer at a constant rate, which the sweep's callback raises step by step."""
    from tfrecipe import optim

    return optim.build_optimizer(
        spec,
        learning_rate=learning_rate,
        loss_scaling=plan.precision == "mixed_float16",
        gradient_accumulation_steps=plan.optimizer_accumulation_steps(),
    )


def _inner(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def smoothed(losses: list[float]) -> np.ndarray:
    """The bias-corrected exponential moving average of the losses."""
    out, average = [], 0.0
    for index, loss in enumerate(losses, start=1):
        average = _SMOOTHING * average + (1 - _SMOOTHING) * loss
        out.append(average / (1 - _SMOOTHING**index))
    return np.asarray(out, dtype=np.float64)


def suggest(rates: list[float], losses: list[float]) -> dict[str, Any]:
    """The suggested rate (steepest descent of the smoothed loss against log10(lr), before the
    minimum) and the rate at the minimum; None where the sweep has too few finite steps."""
    finite = [i for i, loss in enumerate(losses) if math.isfinite(loss)]
    if len(finite) < 5:
        return {"suggested_learning_rate": None, "min_loss_learning_rate": None}
    last = finite[-1] + 1
    curve = smoothed(losses[:last])
    log_rates = np.log10(np.asarray(rates[:last]))
    # The first steps' average rests on a few noisy losses (Lightning skips 10 steps too).
    skip = min(max(len(curve) // 10, 3), len(curve) - 3)
    lowest = skip + int(np.nanargmin(curve[skip:]))
    if lowest - skip >= 2:
        slope = np.gradient(curve[skip : lowest + 1], log_rates[skip : lowest + 1])
        steepest = skip + int(np.argmin(slope))
    else:
        steepest = lowest
    return {
        "suggested_learning_rate": float(rates[steepest]),
        "min_loss_learning_rate": float(rates[lowest]),
    }


def _write(run_dir: Path, rates: list[float], losses: list[float], result: dict) -> None:

    rows = ["learning_rate,loss,smoothed_loss"]
    curve = smoothed(losses)
    rows += [f"{r:.6g},{loss:.6g},{s:.6g}" for r, loss, s in zip(rates, losses, curve, strict=True)]
    files.write_atomic(run_dir / CURVE, "\n".join(rows) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(rates, losses, alpha=0.3, label="loss")
    ax.plot(rates, curve, label="smoothed")
    suggested = result.get("suggested_learning_rate")
    if suggested is not None:
        ax.axvline(suggested, color="tab:red", linestyle="--", label=f"suggested {suggested:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    finite = curve[np.isfinite(curve)]
    if finite.size:  # the diverging tail would flatten the interesting part
        ax.set_ylim(finite.min() * 0.95, min(finite.max(), finite[0] * 1.5) * 1.05)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    files.write_atomic(run_dir / PLOT, buffer.getvalue())
