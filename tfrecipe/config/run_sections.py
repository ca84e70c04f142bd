"""The typed sections around training (callbacks, export, loggers, cluster, baseline, ensemble,
sweep) and `RunConfig`, the whole config that holds every section.

How a run trains (strategy, task, precision, batching, optimizer, loop) is in
tfrecipe/config/training_sections.py; `tfrecipe.config.schema.validate` checks a composed config
against `RunConfig`.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator
from pydantic_core import PydanticCustomError

from tfrecipe.config.export_limits import EXPORT_FORMATS, SERVER_NAME_RULE, server_name_problem
from tfrecipe.config.training_sections import (
    Batching,
    ClassificationTask,
    Loop,
    NonNegativeFloat,
    NonNegativeInt,
    Optimizer,
    PositiveFloat,
    PositiveInt,
    Precision,
    Section,
    Strategy,
    Target,
    Task,
)
from tfrecipe.data.pipeline import PipelineOptions


# --- callbacks ----------------------------------------------------------------------------------
class _Switch(Section):
    enabled: bool


class ModelCheckpoint(_Switch):
    # auto: the task's default (tfrecipe.tasks.default_monitor), set by `validate`
    monitor: str = "auto"
    mode: Literal["auto", "min", "max"] = "auto"


class EarlyStopping(_Switch):
    monitor: str = "auto"
    patience: NonNegativeInt = 5
    min_delta: Annotated[float, Field(ge=0)] = 0.0
    restore_best_weights: bool = True


class TerminateOnNaN(_Switch):
    # On a NaN/Inf loss: restore the last good backup and go on with the learning rate x
    # lr_factor, at most max_rollbacks times (0: stop at once).
    max_rollbacks: NonNegativeInt = 0
    lr_factor: Annotated[float, Field(gt=0, le=1)] = 0.5


class Backup(Section):
    # null: on for multi-worker runs (a cluster) or when terminate_on_nan rolls back, else off.
    enabled: bool | None = None
    every_n_steps: PositiveInt = 100
    max_to_keep: PositiveInt = 3


# --- export ---------------------------------------------------------------------------------------
# The formats a run can export (what each can carry: tfrecipe/config/export_limits.py).
ExportFormat = Literal[EXPORT_FORMATS]


class PeriodicExport(Section):
    # model-NNN.keras / saved_model-NNN/ in the run dir every N epochs (0: off), in the formats
    # of `export.formats` that have periodic exports (keras, saved_model).
    every_n_epochs: NonNegativeInt = 0


class LiteRT(Section):
    # none: float32 model.tflite only; dynamic (int8 weights), float16 (float16 weights), int8
    # (weights and activations, calibrated on training examples): also model-QUANT.tflite.
    quantize: Literal["none", "dynamic", "float16", "int8"] = "none"
    # Training examples int8 calibrates its activation ranges on.
    representative_examples: PositiveInt = 200


class Export(Section):
    # What the run exports when it ends; each file is loaded in its own runtime and compared with
    # Keras on held-out examples (tfrecipe/models/export.py). model.keras is always written.
    formats: list[ExportFormat] = ["keras"]
    # Largest |export - Keras| allowed on those examples (logits or regression values).
    tolerance: PositiveFloat = 1e-4
    # Held-out examples compared (the test split, else the validation split).
    check_examples: PositiveInt = 256
    # A name for model servers (null: none): saved_model goes to exports/serving/NAME/1/ (TF
    # Serving), onnx to exports/triton/NAME/1/model.onnx with a config.pbtxt (Triton).
    name: str | None = None
    litert: LiteRT = LiteRT()

    @field_validator("name")
    @classmethod
    def _server_name(cls, name):
        """A folder name of its own: never a path, `..` or a hidden name."""
        if name is not None and server_name_problem(name):
            raise PydanticCustomError("server_name", SERVER_NAME_RULE)
        return name

    @field_validator("formats", mode="before")
    @classmethod
    def _distinct_known_formats(cls, formats):
        """One problem for every way the list can be wrong (not a list, empty, unknown, twice)."""
        if (
            not isinstance(formats, list)
            or not formats
            or not set(formats) <= set(EXPORT_FORMATS)
            or len(set(formats)) != len(formats)
        ):
            raise PydanticCustomError(
                "export_formats",
                "expected a non-empty list of distinct formats out of {allowed} "
                "(e.g. [keras,onnx])",
                {"allowed": list(EXPORT_FORMATS)},
            )
        return formats


class Callbacks(Section):
    model_checkpoint: ModelCheckpoint
    early_stopping: EarlyStopping
    terminate_on_nan: TerminateOnNaN
    progress: _Switch
    backup: Backup = Backup()
    export: PeriodicExport = PeriodicExport()
    extra: dict[str, Target] = {}


# --- loggers --------------------------------------------------------------------------------------
class CsvLogger(Section):
    every_n_steps: PositiveInt = 10


class TensorBoardLogger(Section):
    update_freq: Literal["epoch", "batch"] | PositiveInt = "epoch"
    histogram_freq: NonNegativeInt = 0
    profile_batch: NonNegativeInt = 0
    profile_steps: PositiveInt = 5


def tag_text(value: object) -> object:
    """A tag's value as MLflow and W&B keep it: text. A number or true/false typed unquoted
    (`+logger.mlflow.tags.team=42`) is the text typed, not refused; anything else is unchanged
    (the schema refuses what is not text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else value


TagText = Annotated[str, BeforeValidator(tag_text)]


class WandbLogger(Section):
    # None: WANDB_MODE, else online (W&B's own rule; a mode passed to wandb.init overrides it)
    mode: Literal["online", "offline", "disabled"] | None = None
    project: str = "tfrecipe"
    entity: str | None = None
    name: str | None = None
    tags: list[TagText] = []
    notes: str | None = None
    group: str | None = None
    job_type: str = "train"
    log_every_n_steps: PositiveInt | None = 50
    log_model: bool = False


class MlflowLogger(Section):
    # null: MLFLOW_TRACKING_URI, else sqlite:///SWEEP_OR_RUN_DIR/mlflow.db
    tracking_uri: str | None = None
    experiment: Annotated[str, Field(min_length=1)] = "tfrecipe"  # MLflow refuses ''
    run_name: str | None = None
    tags: dict[str, TagText] = {}
    log_artifacts: bool = True
    timeout_s: PositiveFloat = 10.0

    @field_validator("tracking_uri")
    @classmethod
    def _a_store_mlflow_opens(cls, uri):
        problem = None if uri is None else mlflow_store_problem(uri)
        if problem is not None:
            raise problem
        return uri


def mlflow_store_problem(uri: str) -> PydanticCustomError | None:
    """What is wrong with `uri` as the store a run logs to (`logger.mlflow.tracking_uri`, else
    MLFLOW_TRACKING_URI), None: nothing. A scheme MLflow has a store for; a sqlite file, not a
    database in memory; its file store only where the user allowed it."""
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    if scheme not in _MLFLOW_SCHEMES:
        return PydanticCustomError(
            "mlflow_uri",
            "expected a tracking URI: sqlite:///PATH, http(s)://HOST:PORT, "
            "postgresql://..., mysql://..., databricks, or file:PATH with "
            "MLFLOW_ALLOW_FILE_STORE=true; null: MLFLOW_TRACKING_URI, else a sqlite file in "
            "the sweep or run dir",
        )
    database = uri.partition("://")[2].removeprefix("/").partition("?")[0]
    if scheme == "sqlite" and database in ("", ":memory:"):
        return PydanticCustomError(
            "mlflow_memory_store",
            "names a sqlite database in memory, gone when the run ends; use sqlite:///PATH",
        )
    allowed = os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("1", "true")
    if scheme == "file" and not allowed:
        return PydanticCustomError(
            "mlflow_file_store",
            "MLflow refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true is set; use "
            "sqlite:///PATH (a local file that needs no server) or set that variable",
        )
    return None


# What MLflow 3 opens a tracking store for (sqlalchemy's dialects may add +driver).
_MLFLOW_SCHEMES = frozenset(
    {"sqlite", "http", "https", "file", "postgresql", "mysql", "mssql", "databricks"}
)


class Logger(Section):
    csv: CsvLogger | None = None
    tensorboard: TensorBoardLogger | None = None
    wandb: WandbLogger | None = None
    mlflow: MlflowLogger | None = None


# --- cluster: the processes a run spans -----------------------------------------------------------
class _ClusterBase(Section):
    # Seconds without a finished training step before a worker dumps its threads' stacks to
    # RUN_DIR/stall-TASK.txt and exits EXIT_STALLED (restartable). null: automatic on a cluster
    # (from the step time seen, with a floor), off for a single process; 0: off.
    stall_timeout: NonNegativeFloat | None = None


class NoCluster(_ClusterBase):
    name: Literal["none"]


class TFConfigCluster(_ClusterBase):
    name: Literal["tf_config"]
    # Workers save per-epoch weights for a sidecar evaluator task (tfrecipe/distribute/evaluator.py).
    evaluator: bool = False


class LocalCluster(_ClusterBase):
    name: Literal["local"]
    num_workers: PositiveInt = 2
    num_ps: NonNegativeInt = 0
    max_restarts: NonNegativeInt = 0
    # Seconds a stopping process gets after SIGTERM before it is killed.
    grace_period_s: PositiveFloat = 10.0
    # Seconds the other tasks get to finish after one worker exited; then they are stopped.
    exit_grace_s: PositiveFloat = 300.0
    # Also start an evaluator task that scores each epoch's checkpoint (sidecar evaluation).
    evaluator: bool = False


class SlurmCluster(_ClusterBase):
    name: Literal["slurm"]
    port_base: Annotated[int, Field(ge=1024, le=65535)] = 8888
    tasks_per_node: PositiveInt | None = None
    gpus_per_node: NonNegativeInt | None = None


class K8sCluster(_ClusterBase):
    name: Literal["k8s"]
    # TFRECIPE_K8S_REPLICAS has an evaluator pod: workers save per-epoch weights for it.
    evaluator: bool = False
    # Every task at 127.0.0.1:(port + Job index) instead of JOB-INDEX.SERVICE:port: the same
    # Job environment tried on one machine.
    loopback: bool = False


Cluster = Annotated[
    NoCluster | TFConfigCluster | LocalCluster | SlurmCluster | K8sCluster,
    Field(discriminator="name"),
]


# --- baseline, ensemble, sweep --------------------------------------------------------------------
class Baseline(Section):
    # none | auto: scikit-learn's standard baselines for the task on the run's split and
    # preprocessing (tfrecipe/training/baselines.py), in summary.json's `baselines`.
    name: Literal["none", "auto"]
    # A larger split (a streamed table) gives its first max_rows rows, and says so (`capped`).
    max_rows: PositiveInt = 100_000


class Ensemble(Section):
    # N > 1: N members trained from seeds seed, seed+1, ... on the same split (RUN_DIR/members/i,
    # each a run of its own: resumed on its own), exported as one model averaging them.
    seeds: PositiveInt = 1


class Sweep(Section):
    objective: str = "val_loss"
    metric: str | None = None  # what picks the best job (tfrecipe.cli.sweep_report)
    fail_fast: bool = False


# --- the whole config -----------------------------------------------------------------------------
class RunConfig(Section):
    seed: int
    deterministic: bool
    # auto: continue from RUN_DIR/backup when there is one; never: refuse a run dir that holds a
    # run; else a checkpoint, backup dir or run dir to start from.
    resume: str = "auto"
    # keys a resumed run may change beyond tfrecipe.config.changes.RESUMABLE
    resume_allow_changes: list[str] = []
    allowed_targets: list[str] = []
    # The config tree on the console (tfrecipe.cli.display.shows_config).
    print_config: bool | Literal["auto"] = "auto"
    strategy: Strategy
    task: Task = ClassificationTask(name="classification")
    model: Target
    dataset: Target
    pipeline: PipelineOptions = PipelineOptions()
    precision: Precision
    batching: Batching
    optimizer: Optimizer
    loop: Loop
    callbacks: Callbacks
    logger: Logger = Logger()
    cluster: Cluster
    sweep: Sweep = Sweep()
    export: Export = Export()
    baseline: Baseline = Baseline(name="none")
    ensemble: Ensemble = Ensemble()

    @field_validator("print_config", mode="before")
    @classmethod
    def _auto_or_bool(cls, value):
        """One problem, not one per member of the union."""
        if isinstance(value, bool) or value == "auto":
            return value
        raise PydanticCustomError("print_config", "expected auto, true or false")
