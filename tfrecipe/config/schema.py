"""The typed schema of every config group, checked once, early, with every problem reported.

The YAML files in `conf/` hold the defaults; these models say what is allowed. `validate` runs
on the composed config before any TensorFlow work and raises one `ConfigError` listing each
problem as `key: what is wrong (received value)`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Annotated, Literal, get_args

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from tfrecipe.config.checks import config_problems
from tfrecipe.config.trust import Trust
from tfrecipe.data.pipeline import PipelineOptions
from tfrecipe.errors import ConfigError, Problem

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- strategy -----------------------------------------------------------------------------------
class _StrategyBase(_Schema):
    logical_cpus: PositiveInt = 1


class DefaultStrategy(_StrategyBase):
    name: Literal["default"]


class OneDeviceStrategy(_StrategyBase):
    name: Literal["one_device"]
    device: str | None = None


class MirroredStrategy(_StrategyBase):
    name: Literal["mirrored"]
    devices: list[str] | None = None
    cross_device_ops: Literal["auto", "nccl", "hierarchical_copy", "reduction_to_one_device"] = (
        "auto"
    )
    num_packs: PositiveInt = 1


class CentralStorageStrategy(_StrategyBase):
    name: Literal["central_storage"]
    devices: list[str] | None = None
    parameter_device: str | None = None


class MultiWorkerMirroredStrategy(_StrategyBase):
    name: Literal["multi_worker_mirrored"]
    # tf.distribute.experimental.CommunicationOptions
    implementation: Literal["auto", "ring", "nccl"] = "auto"
    bytes_per_pack: NonNegativeInt = 0
    timeout_seconds: PositiveFloat | None = None


class ParameterServerStrategy(_StrategyBase):
    name: Literal["parameter_server"]
    # Only none runs: the others are named so that choosing one is refused with the reason
    # (_cluster_problems), not as an unknown value.
    variable_partitioner: Literal["none", "min_size", "max_size", "fixed_shards"] = "none"


class TPUStrategy(_StrategyBase):
    name: Literal["tpu"]
    # TPU name or grpc:// address for TPUClusterResolver; "local" = a TPU VM's own TPU.
    tpu: str = "local"
    zone: str | None = None
    project: str | None = None


STRATEGY_NAMES = (
    "default",
    "one_device",
    "mirrored",
    "central_storage",
    "multi_worker_mirrored",
    "parameter_server",
    "tpu",
)

Strategy = Annotated[
    DefaultStrategy
    | OneDeviceStrategy
    | MirroredStrategy
    | CentralStorageStrategy
    | MultiWorkerMirroredStrategy
    | ParameterServerStrategy
    | TPUStrategy,
    Field(discriminator="name"),
]


# --- model, dataset: a builder named by `_target_`, its arguments checked when it is bound ---------
class Target(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True, populate_by_name=True)
    target: str = Field(alias="_target_")


# Options of every `model` node that tfrecipe applies to the built model (builders never see
# them): `model.freeze` (tfrecipe.models.freeze), `model.init_from` (tfrecipe.models.warm_start),
# `model.freeze_random` (freezing weights nothing trained: refused unless it is true).
MODEL_OPTIONS = ("freeze", "init_from", "freeze_random")

FREEZE_HELP = (
    "expected none, backbone, fraction:F (0 < F <= 1) or a regular expression over layer names"
)


def parse_freeze(value: object) -> tuple[str, float | str | None]:
    """`model.freeze` (any builder's) as (kind, argument): ("none", None), ("backbone", None),
    ("fraction", F) or ("regex", PATTERN). Raises `ValueError` saying what is wrong."""
    import re

    if value is None or value == "none":
        return "none", None
    if not isinstance(value, str) or not value:
        raise ValueError(FREEZE_HELP)
    if value == "backbone":
        return "backbone", None
    if value.startswith("fraction:"):
        try:
            fraction = float(value.removeprefix("fraction:"))
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            raise ValueError(FREEZE_HELP)
        return "fraction", fraction
    try:
        re.compile(value)
    except re.error as error:
        raise ValueError(f"not a valid regular expression ({error}); {FREEZE_HELP}") from None
    return "regex", value


# --- task: what is learned (tfrecipe/tasks/ has the losses and metrics) ---------------------------
class _TaskBase(_Schema):
    # null: the task's own loss; else a Keras loss class by `_target_` (task.loss).
    loss: Target | None = None
    # Extra metrics (keras.metrics classes by `_target_`), reported beside the task's own.
    metrics: list[Target] = []


class _ClassWeighted(_TaskBase):
    # null, "balanced" (n / (classes x count) on the training split) or {class_id: weight}.
    class_weight: Literal["balanced"] | dict[int, float] | None = None

    @field_validator("class_weight", mode="before")
    @classmethod
    def _balanced_or_weights(cls, value):
        """One problem for every way it can be wrong (a union would report one per member)."""
        if value is None or value == "balanced":
            return value
        if isinstance(value, dict) and all(_class_id(k) and _weight(w) for k, w in value.items()):
            return {k: float(w) for k, w in value.items()}
        raise PydanticCustomError(
            "class_weight",
            "expected null, balanced or {class_id: weight} with class ids >= 0 and finite weights "
            ">= 0 (e.g. {0: 1.0, 1: 5.0})",
        )


def _class_id(key: object) -> bool:
    return isinstance(key, int) and not isinstance(key, bool) and key >= 0


def _weight(value: object) -> bool:
    # finite: an infinite weight makes every weighted loss inf (NaN once multiplied by 0)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value >= 0


class ClassificationTask(_ClassWeighted):
    name: Literal["classification"]
    top_k: Annotated[int, Field(ge=2)] | None = None
    label_smoothing: Annotated[float, Field(ge=0, lt=1)] = 0.0


class BinaryTask(_ClassWeighted):
    name: Literal["binary"]
    threshold: Annotated[float, Field(gt=0, lt=1)] = 0.5
    # The class that is 1 (a label's name, or 0/1): what auc, precision and recall are about;
    # null: the second name in sorted order (or the label 1).
    positive_class: str | int | None = None


class MultilabelTask(_TaskBase):
    name: Literal["multilabel"]
    threshold: Annotated[float, Field(gt=0, lt=1)] = 0.5
    # null: the dataset's label width; else the width its labels must have.
    num_labels: PositiveInt | None = None


class RegressionTask(_TaskBase):
    name: Literal["regression"]
    loss: Literal["mse", "mae", "huber"] | Target = "mse"
    huber_delta: PositiveFloat = 1.0
    # Train against standardized targets: the model ends in a rescaling to the original units.
    standardize_targets: bool = False


TASK_NAMES = ("classification", "binary", "multilabel", "regression")
Task = Annotated[
    ClassificationTask | BinaryTask | MultilabelTask | RegressionTask, Field(discriminator="name")
]


# --- precision, batching, optimizer ---------------------------------------------------------------
class Precision(_Schema):
    # auto: mixed_bfloat16 where the hardware runs it natively, else float32 (tfrecipe.precision)
    policy: Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"]
    require_native: bool = True


class Batching(_Schema):
    per_replica_batch_size: PositiveInt
    global_batch_size: PositiveInt | None = None
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    lr_reference_batch_size: PositiveInt | None = None
    drop_remainder: bool = False
    # auto: several steps per call for small models, 1 for large ones (train.steps_per_call)
    steps_per_execution: PositiveInt | Literal["auto"] = "auto"
    # auto: Keras' choice (XLA where the model supports it, never on a CPU-only machine)
    jit_compile: bool | Literal["auto"] = "auto"
    # BatchNormalization's training step on TensorFlow's fused kernel (tfrecipe.models.batch_norm)
    fused_batch_norm: bool = True


class _OptimizerBase(_Schema):
    learning_rate: PositiveFloat
    weight_decay: Annotated[float, Field(ge=0)] | None = None
    clipnorm: PositiveFloat | None = None
    global_clipnorm: PositiveFloat | None = None
    schedule: Literal["constant", "cosine", "warmup_cosine"] = "constant"
    warmup_steps: NonNegativeInt = 0
    min_lr_fraction: Annotated[float, Field(ge=0, le=1)] = 0.0
    # Keep an exponential moving average of the weights (Keras' use_ema): validation, test and
    # the exported model use the averaged weights; training steps use the raw ones.
    ema: bool = False
    ema_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.99


class Adam(_OptimizerBase):
    name: Literal["adam", "adamw"]
    beta_1: Annotated[float, Field(ge=0, lt=1)] = 0.9
    beta_2: Annotated[float, Field(ge=0, lt=1)] = 0.999
    epsilon: PositiveFloat = 1e-7


class SGD(_OptimizerBase):
    name: Literal["sgd"]
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
    nesterov: bool = False


Optimizer = Annotated[Adam | SGD, Field(discriminator="name")]


# --- loop, callbacks, logger, cluster ----------------------------------------------------------------
class Finetune(_Schema):
    # null: one phase; N: train what the model leaves trainable for N epochs, then unfreeze.
    unfreeze_at_epoch: PositiveInt | None = None
    # After the switch: the learning rate x this, with a fresh optimizer.
    learning_rate_factor: Annotated[float, Field(gt=0, le=1)] = 0.1
    # null: every layer; else a regular expression over layer names (re.search).
    unfreeze: str | None = None


class LRFind(_Schema):
    # An exponential learning-rate sweep before training (tfrecipe/training/lr_find.py).
    enabled: bool = False
    steps: Annotated[int, Field(ge=5)] = 200
    min_lr: PositiveFloat = 1e-7
    max_lr: PositiveFloat = 1.0
    # true: the sweep only (`tfrecipe lr-find`), no training, test or export.
    only: bool = False


class Loop(_Schema):
    name: Literal["fit", "custom"]
    epochs: PositiveInt
    steps_per_epoch: PositiveInt | None = None
    validation_freq: PositiveInt = 1
    verbose: Literal[0, 1, 2, "auto"] = "auto"
    steps_per_loop: PositiveInt | Literal["auto"] = "auto"
    gradient_accumulation_steps: PositiveInt = 1
    finetune: Finetune = Finetune()
    lr_find: LRFind = LRFind()


class _Switch(_Schema):
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


class Backup(_Schema):
    # null: on for multi-worker runs (a cluster) or when terminate_on_nan rolls back, else off.
    enabled: bool | None = None
    every_n_steps: PositiveInt = 100
    max_to_keep: PositiveInt = 3


ExportFormat = Literal["keras", "saved_model", "onnx", "litert"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)
# The formats `callbacks.export.every_n_epochs` writes each N epochs (the others are written and
# checked once, when the run ends).
PERIODIC_EXPORT_FORMATS = ("keras", "saved_model")


class PeriodicExport(_Schema):
    # model-NNN.keras / saved_model-NNN/ in the run dir every N epochs (0: off), in the formats
    # of `export.formats` that have periodic exports (keras, saved_model).
    every_n_epochs: NonNegativeInt = 0


class LiteRT(_Schema):
    # none: float32 model.tflite only; dynamic (int8 weights), float16 (float16 weights), int8
    # (weights and activations, calibrated on training examples): also model-QUANT.tflite.
    quantize: Literal["none", "dynamic", "float16", "int8"] = "none"
    # Training examples int8 calibrates its activation ranges on.
    representative_examples: PositiveInt = 200


class Export(_Schema):
    # What the run exports when it ends; each file is loaded in its own runtime and compared with
    # Keras on held-out examples (tfrecipe/models/export.py). model.keras is always written.
    formats: list[ExportFormat] = ["keras"]
    # Largest |export - Keras| allowed on those examples (logits or regression values).
    tolerance: PositiveFloat = 1e-4
    # Held-out examples compared (the test split, else the validation split).
    check_examples: PositiveInt = 256
    litert: LiteRT = LiteRT()

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


class Callbacks(_Schema):
    model_checkpoint: ModelCheckpoint
    early_stopping: EarlyStopping
    terminate_on_nan: TerminateOnNaN
    progress: _Switch
    backup: Backup = Backup()
    export: PeriodicExport = PeriodicExport()
    extra: dict[str, Target] = {}


class CsvLogger(_Schema):
    every_n_steps: PositiveInt = 10


class TensorBoardLogger(_Schema):
    update_freq: Literal["epoch", "batch"] | PositiveInt = "epoch"
    histogram_freq: NonNegativeInt = 0
    profile_batch: NonNegativeInt = 0
    profile_steps: PositiveInt = 5


class WandbLogger(_Schema):
    mode: Literal["online", "offline", "disabled"] = "online"
    project: str = "tfrecipe"
    entity: str | None = None
    name: str | None = None
    tags: list[str] = []
    notes: str | None = None
    group: str | None = None
    job_type: str = "train"
    log_every_n_steps: PositiveInt | None = 50
    log_model: bool = False


class MlflowLogger(_Schema):
    # null: MLFLOW_TRACKING_URI, else sqlite:///SWEEP_OR_RUN_DIR/mlflow.db
    tracking_uri: str | None = None
    experiment: str = "tfrecipe"
    run_name: str | None = None
    tags: dict[str, str] = {}
    log_artifacts: bool = True
    timeout_s: PositiveFloat = 10.0

    @field_validator("tracking_uri")
    @classmethod
    def _a_store_mlflow_opens(cls, uri):
        """A scheme MLflow has a store for; its file store only where the user allowed it."""
        if uri is None:
            return uri
        scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
        if scheme not in _MLFLOW_SCHEMES:
            raise PydanticCustomError(
                "mlflow_uri",
                "expected a tracking URI: sqlite:///PATH, http(s)://HOST:PORT, "
                "postgresql://..., mysql://..., databricks, or file:PATH with "
                "MLFLOW_ALLOW_FILE_STORE=true; null: MLFLOW_TRACKING_URI, else a sqlite file in "
                "the sweep or run dir",
            )
        allowed = os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("1", "true")
        if scheme == "file" and not allowed:
            raise PydanticCustomError(
                "mlflow_file_store",
                "MLflow refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true is set; use "
                "sqlite:///PATH (a local file that needs no server) or set that variable",
            )
        return uri


# What MLflow 3 opens a tracking store for (sqlalchemy's dialects may add +driver).
_MLFLOW_SCHEMES = frozenset(
    {"sqlite", "http", "https", "file", "postgresql", "mysql", "mssql", "databricks"}
)


class Logger(_Schema):
    csv: CsvLogger | None = None
    tensorboard: TensorBoardLogger | None = None
    wandb: WandbLogger | None = None
    mlflow: MlflowLogger | None = None


class _ClusterBase(_Schema):
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


class Baseline(_Schema):
    # none | auto: scikit-learn's standard baselines for the task on the run's split and
    # preprocessing (tfrecipe/training/baselines.py), in summary.json's `baselines`.
    name: Literal["none", "auto"]
    # A larger split (a streamed table) gives its first max_rows rows, and says so (`capped`).
    max_rows: PositiveInt = 100_000


class Ensemble(_Schema):
    # N > 1: N members trained from seeds seed, seed+1, ... on the same split (RUN_DIR/members/i,
    # each a run of its own: resumed on its own), exported as one model averaging them.
    seeds: PositiveInt = 1


class Sweep(_Schema):
    objective: str = "val_loss"
    metric: str | None = None  # what picks the best job (tfrecipe.cli.sweep_report)
    fail_fast: bool = False


class RunConfig(_Schema):
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


def validate(cfg: DictConfig, *, trust: Trust) -> RunConfig:
    """Checks the composed config; returns it typed or raises `ConfigError` with every problem.
    A config composed with Hydra's node (`hydra.*`) has that node checked too.

    Args:
      cfg: the composed config.
      trust: what this invocation's command line grants (`allowed_targets` counts only where
        it gives it; `Trust.NOTHING` grants nothing: a config read from a file).
    """
    cfg_hydra = cfg.hydra if "hydra" in cfg else None
    cfg = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    missing = sorted(OmegaConf.missing_keys(cfg))
    problems = [_missing(key) for key in missing]
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except Exception as error:  # an interpolation that cannot be resolved
        key = getattr(error, "full_key", "")
        raise ConfigError(Problem(key, hint=str(error)) if key else str(error)) from None
    allow_list = config_problems(container, cfg_hydra, trust=trust)
    try:
        run = RunConfig.model_validate(container)
    except ValidationError as error:
        problems += [p for p in _describe(error, container) if p.key not in missing]
        reported = {p.slot for p in problems}
        problems += [p for p in allow_list if p.slot not in reported]
        raise ConfigError(problems) from None
    problems += allow_list
    run = _with_task_monitors(run)
    problems += _cross_checks(run)
    if problems:
        raise ConfigError(problems)
    return run


def _cross_checks(run: RunConfig) -> list[Problem]:
    """What each section allows but not together with the others, as problems naming the key to
    change, the value found there and how to fix it."""
    return [
        *_cluster_problems(run),
        *_loop_problems(run),
        *_parameter_server_loop_problems(run),
        *_resume_problems(run),
        *_rollback_problems(run),
        *_monitor_problems(run),
        *_freeze_problems(run),
        *_finetune_problems(run),
        *_task_metric_problems(run),
        *_sweep_problems(run),
        *_tracker_problems(run),
        *_ensemble_problems(run),
        *_export_problems(run),
        *_ema_problems(run),
    ]


def _ema_problems(run: RunConfig) -> list[Problem]:
    """Early stopping's restored weights are raw ones; the averaged weights (optimizer.ema) put
    in place when training ends would replace them."""
    stopping = run.callbacks.early_stopping
    if run.optimizer.ema and stopping.enabled and stopping.restore_best_weights:
        return [
            Problem(
                "optimizer.ema",
                True,
                "with callbacks.early_stopping.restore_best_weights=true the restored best epoch "
                "would be replaced by the final averaged weights; set restore_best_weights=false "
                "(best.weights.h5 holds the best epoch's averaged weights)",
            )
        ]
    return []


# Models whose kind says before anything is built that a format cannot carry them: (model or
# dataset target, format) -> why. Other models are checked on the built model
# (tfrecipe.models.export.unsupported).
_TEXT_MODEL = "tfrecipe.models.text"
_TEXT_FORMATS = {
    "onnx": "ONNX has no string ops for its TextVectorization layer",
    "litert": "LiteRT's pip runtime cannot run its TextVectorization layer (no Flex delegate)",
}
_TABLE_DATASETS = "tfrecipe.data.tabular."  # csv, parquet: categorical columns by StringLookup


def _export_problems(run: RunConfig) -> list[Problem]:
    """A format that cannot carry the configured model is refused before training: string
    preprocessing (TextVectorization, StringLookup) in ONNX, TextVectorization in LiteRT, a
    table's dict of columns in LiteRT's int8 calibration."""
    formats, problems = list(run.export.formats), []
    if run.model.target == _TEXT_MODEL:
        problems += [
            Problem(
                "export.formats",
                formats,
                f"model=text cannot be exported to {fmt}: {why}; remove {fmt} (keras and "
                "saved_model carry it)",
            )
            for fmt, why in _TEXT_FORMATS.items()
            if fmt in formats
        ]
    categorical = (run.dataset.model_extra or {}).get("categorical")
    if run.dataset.target.startswith(_TABLE_DATASETS) and categorical and "onnx" in formats:
        problems.append(
            Problem(
                "export.formats",
                formats,
                f"dataset.categorical={list(categorical)} are encoded by StringLookup layers "
                "inside the model, which Keras exports to an invalid ONNX file; remove onnx "
                "(litert, saved_model and keras carry it)",
            )
        )
    quantize = run.export.litert.quantize
    if (
        run.dataset.target.startswith(_TABLE_DATASETS)
        and "litert" in formats
        and quantize == "int8"
    ):
        problems.append(
            Problem(
                "export.litert.quantize",
                quantize,
                "a table's model takes a dict of named columns, which LiteRT's int8 calibration "
                "cannot feed (it fails after training); use dynamic or float16, or none",
            )
        )
    return problems


def _finetune_problems(run: RunConfig) -> list[Problem]:
    """Two-phase fine-tuning needs a second phase, a synchronous loop it can recompile and a
    regular expression that compiles (which layers it matches is checked on the built model)."""
    spec, epochs = run.loop.finetune, run.loop.epochs
    if spec.unfreeze_at_epoch is None:
        if spec.unfreeze is not None:
            return [
                Problem(
                    "loop.finetune.unfreeze",
                    spec.unfreeze,
                    "chooses what unfreezes at loop.finetune.unfreeze_at_epoch, which is null; "
                    "set it (e.g. =1)",
                )
            ]
        return []
    key, at, problems = "loop.finetune.unfreeze_at_epoch", spec.unfreeze_at_epoch, []
    if at >= epochs:
        problems.append(
            Problem(
                key,
                at,
                f"the switch must come before the last epoch ends (loop.epochs={epochs}); use "
                f"1..{epochs - 1} or more epochs",
            )
        )
    if run.strategy.name == "parameter_server":
        problems.append(
            Problem(
                key,
                at,
                "not supported with strategy=parameter_server (its workers keep the traced step "
                "of the first phase); use a synchronous strategy or unfreeze_at_epoch=null",
            )
        )
    if run.callbacks.terminate_on_nan.max_rollbacks:
        problems.append(
            Problem(
                key,
                at,
                "a rollback could cross the switch (the backup before it holds the other "
                "optimizer); set callbacks.terminate_on_nan.max_rollbacks=0",
            )
        )
    if spec.unfreeze is not None:
        try:
            re.compile(spec.unfreeze)
        except re.error as error:
            problems.append(
                Problem(
                    "loop.finetune.unfreeze",
                    spec.unfreeze,
                    f"not a regular expression ({error}); expected e.g. 'block_1[3-6]|Conv_1'",
                )
            )
    return problems


def _freeze_problems(run: RunConfig) -> list[Problem]:
    options = run.model.model_extra or {}
    value, anyway = options.get("freeze"), options.get("freeze_random", False)
    try:
        kind, pattern = parse_freeze(value)
    except ValueError as error:
        return [Problem("model.freeze", value, str(error))]
    if kind == "regex" and re.search(pattern, "") is not None:
        # It matches the empty name, so every name: every layer frozen, nothing would train.
        return [
            Problem(
                "model.freeze",
                value,
                "matches every layer name, so nothing would be left to train; anchor it to the "
                "layers to freeze (e.g. '^block[1-3]_'), or use backbone or fraction:F",
            )
        ]
    if not isinstance(anyway, bool):
        return [Problem("model.freeze_random", anyway, "expected true or false")]
    if kind == "none" or anyway or _starts_trained(run):
        return []
    # Frozen random weights never learn: the head alone trains on random features (keras_app's
    # MobileNetV3Small stayed at chance on the digits), and nothing said so.
    weights = "model.weights=imagenet|PATH or " if "weights" in options else ""
    return [
        Problem(
            "model.freeze",
            value,
            "freezes randomly initialized weights (nothing trained to start from), which then "
            f"never learn; pass {weights}model.init_from=RUN_DIR, or model.freeze_random=true "
            "to freeze them anyway",
        )
    ]


def _starts_trained(run: RunConfig) -> bool:
    """Whether the model starts from trained weights: the backbone's own (keras_app's
    `model.weights`), a warm start (`model.init_from`) or a checkpoint (`resume=PATH`)."""
    options = run.model.model_extra or {}
    return bool(options.get("weights") or options.get("init_from")) or run.resume not in (
        "auto",
        "never",
    )


def _with_task_monitors(run: RunConfig) -> RunConfig:
    """`monitor: auto` (checkpoint, early stopping) becomes the task's default monitor."""
    from tfrecipe.tasks import default_monitor

    callbacks, updates = run.callbacks, {}
    for key in ("model_checkpoint", "early_stopping"):
        spec = getattr(callbacks, key)
        if spec.monitor == "auto":
            updates[key] = spec.model_copy(update={"monitor": default_monitor(run.task)})
    if not updates:
        return run
    return run.model_copy(update={"callbacks": callbacks.model_copy(update=updates)})


def _task_metric_problems(run: RunConfig) -> list[Problem]:
    """An extra metric (task.metrics) must not take a name the run already reports."""
    from tfrecipe.tasks import extra_metric_name, metric_names

    taken = ["loss", *metric_names(run.task, extra=False)]
    problems = []
    for index, node in enumerate(run.task.metrics):
        name, key = extra_metric_name(node), f"task.metrics.{index}._target_"
        if name.startswith(("val_", "test_")):
            problems.append(
                Problem(
                    key,
                    node.target,
                    f"would be reported as {name!r}; val_ and test_ name a metric on the "
                    "validation and test splits (Keras and summary.json add them), so give it a "
                    f"name without them (name: {name.split('_', 1)[1]})",
                )
            )
        elif name in taken:
            problems.append(
                Problem(
                    key,
                    node.target,
                    f"would be reported as {name!r}, a name the run already reports "
                    f"({', '.join(taken)}); give it another name (name: my_{name})",
                )
            )
        taken.append(name)
    return problems


def _tracker_problems(run: RunConfig) -> list[Problem]:
    """logger=mlflow needs the `tracking` extra: said before training, not as an ImportError
    once the model is built."""
    import importlib.util

    if run.logger.mlflow is None or importlib.util.find_spec("mlflow") is not None:
        return []
    hint = 'MLflow is not installed; pip install "tfrecipe[tracking]" (mlflow-skinny)'
    return [Problem("logger", "mlflow", hint)]


def _ensemble_problems(run: RunConfig) -> list[Problem]:
    """An ensemble's members train one after another in this one process."""
    if run.ensemble.seeds == 1 or (run.cluster.name == "none" and not run.loop.lr_find.only):
        return []
    if run.loop.lr_find.only:
        return [Problem("ensemble.seeds", run.ensemble.seeds,
                        "tfrecipe lr-find sweeps one model; use ensemble.seeds=1")]  # fmt: skip
    return [
        Problem(
            "ensemble.seeds",
            run.ensemble.seeds,
            f"members train one after another in one process, not on cluster={run.cluster.name}; "
            "use cluster=none (or one run per seed: -m seed=0,1,2)",
        )
    ]


def _sweep_problems(run: RunConfig) -> list[Problem]:
    """The sweep's objective must be a number the task's runs report (else every job's
    objective would be NaN and the sweeper would optimize nothing)."""
    from tfrecipe.tasks import summary_names

    allowed = summary_names(run.task)
    named = {"sweep.objective": run.sweep.objective, "sweep.metric": run.sweep.metric}
    return [
        Problem(
            key, value, f"task={run.task.name} does not report it; allowed: {', '.join(allowed)}"
        )
        for key, value in named.items()
        if value is not None and value not in allowed
    ]


def _monitor_problems(run: RunConfig) -> list[Problem]:
    """A checkpoint or early-stopping monitor must be a value the task's run logs (Keras would
    only warn, each epoch, and never save or stop)."""
    from tfrecipe.tasks import monitors

    allowed = monitors(run.task)
    return [
        Problem(
            f"callbacks.{key}.monitor",
            spec.monitor,
            f"task={run.task.name} does not produce it; allowed: {', '.join(allowed)}",
        )
        for key, spec in (
            ("model_checkpoint", run.callbacks.model_checkpoint),
            ("early_stopping", run.callbacks.early_stopping),
        )
        if spec.enabled and spec.monitor not in allowed
    ]


def _rollback_problems(run: RunConfig) -> list[Problem]:
    """A rollback restarts from a backup once TerminateOnNaN has stopped the loop."""
    spec = run.callbacks.terminate_on_nan
    if not spec.max_rollbacks:
        return []
    key, problems = "callbacks.terminate_on_nan.max_rollbacks", []
    if not spec.enabled:
        problems.append(
            Problem(
                key,
                spec.max_rollbacks,
                "rolls back when TerminateOnNaN stops training, but "
                "callbacks.terminate_on_nan.enabled=false; enable it or set max_rollbacks=0",
            )
        )
    if run.callbacks.backup.enabled is False:
        problems.append(
            Problem(
                key,
                spec.max_rollbacks,
                "rolls back to the last backup, but callbacks.backup.enabled=false; set "
                "callbacks.backup.enabled=true (or null) or max_rollbacks=0",
            )
        )
    if run.strategy.name == "parameter_server":
        problems.append(
            Problem(
                key,
                spec.max_rollbacks,
                "not supported with strategy=parameter_server (its ClusterCoordinator loop does "
                "not restart in-process from a backup); set max_rollbacks=0",
            )
        )
    return problems


def _resume_problems(run: RunConfig) -> list[Problem]:
    if not run.resume:
        return [Problem("resume", run.resume, "expected auto, never or a checkpoint path")]
    return []


def _loop_problems(run: RunConfig) -> list[Problem]:
    """Each loop's own knobs: a knob the chosen loop would ignore is an error, not a no-op."""
    loop, problems = run.loop, []
    if loop.name == "fit" and loop.steps_per_loop not in (1, "auto"):
        problems.append(
            Problem(
                "loop.steps_per_loop",
                loop.steps_per_loop,
                "a loop=custom knob; with loop=fit set batching.steps_per_execution",
            )
        )
    accumulating = loop.gradient_accumulation_steps > 1
    if loop.name == "fit" and accumulating and run.precision.policy == "mixed_float16":
        # Keras' loss scaling skips an overflowing step in a cond around its own accumulation
        problems.append(
            Problem(
                "loop.gradient_accumulation_steps",
                loop.gradient_accumulation_steps,
                "loop=fit accumulates with Keras' optimizer, which cannot count the float16 "
                "steps loss scaling skips; use loop=custom, or precision=mixed_bfloat16",
            )
        )
    if loop.lr_find.min_lr >= loop.lr_find.max_lr:
        problems.append(
            Problem(
                "loop.lr_find.min_lr",
                loop.lr_find.min_lr,
                f"must be below loop.lr_find.max_lr={loop.lr_find.max_lr} (the sweep goes up)",
            )
        )
    if loop.name == "custom" and run.batching.steps_per_execution not in (1, "auto"):
        problems.append(
            Problem(
                "batching.steps_per_execution",
                run.batching.steps_per_execution,
                "a Model.fit knob; with loop=custom set loop.steps_per_loop",
            )
        )
    return problems


def _parameter_server_loop_problems(run: RunConfig) -> list[Problem]:
    """The ClusterCoordinator loop schedules one batch per step on whichever worker is free, so
    the custom loop's step knobs have nothing to act on; refused here, before a cluster starts."""
    loop, problems = run.loop, []
    if run.strategy.name != "parameter_server" or loop.name != "custom":
        return []  # loop=fit is refused on its own (and its knobs by _loop_problems)
    if loop.gradient_accumulation_steps != 1:
        problems.append(
            Problem(
                "loop.gradient_accumulation_steps",
                loop.gradient_accumulation_steps,
                "strategy=parameter_server applies each worker's batch on its own (asynchronous "
                "steps, nothing to accumulate); set loop.gradient_accumulation_steps=1",
            )
        )
    if loop.steps_per_loop not in (1, "auto"):  # auto: one step per closure here
        problems.append(
            Problem(
                "loop.steps_per_loop",
                loop.steps_per_loop,
                "strategy=parameter_server schedules one step per closure (ClusterCoordinator); "
                "set loop.steps_per_loop=1",
            )
        )
    return problems


def _cluster_problems(run: RunConfig) -> list[Problem]:
    """Strategy, loop and cluster must fit together."""
    strategy, cluster, problems = run.strategy.name, run.cluster, []
    parameter_server = strategy == "parameter_server"
    if parameter_server and run.loop.name == "fit":
        problems.append(
            Problem(
                "loop",
                "fit",
                "Keras 3 Model.fit does not support strategy=parameter_server; use loop=custom "
                "(ClusterCoordinator schedule/join)",
            )
        )
    if parameter_server and run.strategy.variable_partitioner != "none":
        problems.append(
            Problem(
                "strategy.variable_partitioner",
                run.strategy.variable_partitioner,
                "Keras 3 optimizers cannot update partitioned (sharded) variables "
                "(apply_gradients fails with \"ShardedVariable doesn't support being used as a "
                'reference"); use strategy.variable_partitioner=none',
            )
        )
    if parameter_server and cluster.name == "none":
        problems.append(
            Problem(
                "strategy",
                strategy,
                "needs a cluster with parameter servers; use cluster=local cluster.num_ps=1 (or "
                "cluster=tf_config / cluster=slurm)",
            )
        )
    if cluster.name == "local" and parameter_server and cluster.num_ps == 0:
        problems.append(
            Problem(
                "cluster.num_ps",
                0,
                "strategy=parameter_server needs at least one parameter server; set "
                "cluster.num_ps=1",
            )
        )
    if cluster.name == "local" and not parameter_server and cluster.num_ps:
        problems.append(
            Problem(
                "cluster.num_ps",
                cluster.num_ps,
                "parameter servers serve only strategy=parameter_server (received "
                f"strategy={strategy}); set cluster.num_ps=0",
            )
        )
    if cluster.name == "local" and strategy not in ("multi_worker_mirrored", "parameter_server"):
        problems.append(
            Problem(
                "cluster",
                "local",
                "starts several workers, which only strategy=multi_worker_mirrored and "
                f"strategy=parameter_server use (received strategy={strategy})",
            )
        )
    return problems


def _section(container: dict, location: tuple) -> list[str]:
    """The keys of the config node at a validation error's location (tags skipped)."""
    node = container
    for part in location:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            continue  # a discriminated union's tag, not a key of the config
    return list(node) if isinstance(node, dict) else []


_TAGS = {
    *STRATEGY_NAMES,
    *TASK_NAMES,
    "adam",
    "adamw",
    "sgd",
    "none",
    "tf_config",
    "local",
    "slurm",
    "k8s",
}


def did_you_mean(key: str, siblings) -> str:
    """`did you mean loop.epochs?` for an unknown `key` (dotted) like one of `siblings` (the keys
    of its section), or "" when none is close."""
    import difflib

    section, _, name = key.rpartition(".")
    close = difflib.get_close_matches(name, [str(s) for s in siblings if s != name], n=1)
    return f"did you mean {section + '.' if section else ''}{close[0]}?" if close else ""


def _missing(key: str) -> Problem:
    return Problem(key, hint=f"required value is missing (set {key}=...)")


def _describe(error: ValidationError, container: dict) -> list[Problem]:
    problems = []
    for item in error.errors():
        # Discriminated unions add the tag (e.g. "mirrored") to the location: not a user's key.
        # The location holds the config's own names (`_target_` by its alias).
        key = ".".join(str(part) for part in item["loc"] if str(part) not in _TAGS)
        kind = item["type"]
        received = item.get("input")
        if kind == "extra_forbidden":
            section = _section(container, item["loc"][:-1])
            hint = "; ".join(filter(None, ["unknown key", did_you_mean(key, section)]))
            problems.append(Problem(key, received, hint))
        elif kind == "missing":
            problems.append(_missing(key))
        elif kind == "union_tag_invalid":
            allowed = item["ctx"]["expected_tags"]
            problems.append(
                Problem(f"{key}.name", item["ctx"]["tag"], f"unknown option; allowed: {allowed}")
            )
        else:
            message = item["msg"] if kind in _CASE_KEPT else item["msg"].lower()
            problems.append(Problem(key, received, message))
    return problems


# Messages that name an environment variable or a URI scheme: their case is kept.
_CASE_KEPT = frozenset({"mlflow_uri", "mlflow_file_store"})
