"""Weights & Biases tracking: one W&B run per training run, started by the chief only.

The run's config is the resolved config with secrets redacted (`rundir.public_config`); its
summary is `summary.json`. The run is always finished, also when training fails. A resumed
training run (preempted, crashed, restarted by the launcher) continues the same W&B run: its id is
kept in RUN_DIR/wandb/run_id. Offline, each start writes its own `offline-run-*` folder with that
id; `wandb sync --append` uploads the later ones into the same run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import keras

from tfrecipe import files, reading, rundir
from tfrecipe.callbacks import StepLog
from tfrecipe.config import schema
from tfrecipe.config.run_sections import tag_text
from tfrecipe.outcome import FINISHED

RUN_ID_FILE = "run_id"  # in RUN_DIR/wandb


class WandbTracker:
    """Args:
    spec: the `logger.wandb` config.
    config: the public (redacted, resolved) config to log as the run's config.
    run_dir: the run directory; W&B's files go to RUN_DIR/wandb.
    sweep_group: the sweep's name when this run is a sweep job (the default `group`).
    resume: the training run continues an earlier start: continue its W&B run too.
    """

    def __init__(
        self,
        spec: schema.WandbLogger,
        *,
        config: dict[str, Any],
        run_dir: Path,
        sweep_group: str | None = None,
        resume: bool = False,
    ):
        import wandb

        self.spec = spec
        id_file = files.library_dir(run_dir / "wandb") / RUN_ID_FILE
        previous = _previous_run_id(id_file) if resume else None
        self.run = wandb.init(
            id=previous,
            resume="allow" if previous else None,
            mode=spec.mode,
            **_text_fields(spec, config, sweep_group),
            config=config,
            dir=str(run_dir),
            reinit="finish_previous",  # sweeps run several jobs in one process
            settings=wandb.Settings(save_code=False, console="off"),
        )
        if previous is None:
            files.write_atomic(id_file, self.run.id)
        self.run_dir = run_dir

    def callbacks(self) -> list[keras.callbacks.Callback]:
        from wandb.integration.keras import WandbMetricsLogger

        every = self.spec.log_every_n_steps
        return [WandbMetricsLogger(log_freq="epoch"), *([WandbStepLogger(every)] if every else [])]

    def finish(self, summary: dict[str, Any]) -> None:
        """Copies the summary into the W&B run, uploads the model if asked, finishes the run."""
        import wandb

        self.run.summary.update(summary)
        model = self.run_dir / rundir.MODEL
        if self.spec.log_model and model.exists() and summary.get("status") == "completed":
            artifact = wandb.Artifact(f"model-{self.run.id}", type="model")
            artifact.add_file(str(model))
            self.run.log_artifact(artifact)
        if summary.get("status") == "pruned":  # an Optuna sweep's trial, stopped cleanly
            self.run.tags = (*(self.run.tags or ()), "pruned")
        self.run.finish(exit_code=0 if summary.get("status") in FINISHED else 1)


def _previous_run_id(id_file: Path) -> str | None:
    """The W&B run an earlier start of this training run logged to, if it wrote one."""
    if not os.path.lexists(id_file):
        return None
    return reading.read_text(id_file, limit=4096, what="a W&B run id file").strip()


def _text_fields(
    spec: schema.WandbLogger, config: dict[str, Any], sweep_group: str | None
) -> dict[str, Any]:
    """The W&B run's project, name, tags and other text fields."""
    # As the public config has them: redacted like the rest, so a secret interpolated into e.g.
    # notes reaches neither W&B's files nor its debug.log.
    public = (config.get("logger") or {}).get("wandb") or {}
    return {
        "project": public.get("project", spec.project),
        "entity": public.get("entity", spec.entity),
        "name": public.get("name", spec.name),
        "tags": [str(tag_text(t)) for t in public.get("tags", spec.tags)],
        "notes": public.get("notes", spec.notes),
        "group": public.get("group", spec.group) or sweep_group,
        "job_type": public.get("job_type", spec.job_type),
    }


class WandbStepLogger(StepLog):
    """Training metrics and the learning rate every N optimizer steps (the rows of steps.csv),
    as `batch/*` against `batch/step`. W&B's own `WandbMetricsLogger(log_freq=N)` counts hook
    calls, not steps, and logs where the call's last batch index is a multiple of N: with
    several steps per call (9, 19, ... at 10 per call) that never holds."""

    def on_train_begin(self, logs=None):
        import wandb

        wandb.define_metric("batch/step")
        wandb.define_metric("batch/*", step_metric="batch/step")

    def write(self, row: dict[str, float]) -> None:
        import wandb

        wandb.log({f"batch/{name}": value for name, value in row.items()})
