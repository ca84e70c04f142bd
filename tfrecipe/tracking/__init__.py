"""Experiment trackers beside the run dir's own files: Weights & Biases (`wandb_run`), MLflow
(`mlflow_run`), TensorBoard's hyperparameter view (`hparams`). Each is started by the chief only
and records one training run; `Tracker` is what the training steps drive."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import keras


class Tracker(Protocol):
    """One tracked training run: callbacks for the loop, then `finish` with summary.json's
    fields however the run ended (also after a failure)."""

    def callbacks(self) -> list[keras.callbacks.Callback]: ...

    def finish(self, summary: dict[str, Any]) -> None: ...
