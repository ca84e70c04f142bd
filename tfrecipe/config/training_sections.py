"""The typed sections of how a run trains: strategy, task, model and dataset (`_target_`),
precision, batching, optimizer and loop.

Each class is one config group's schema (its YAML in `conf/` holds the defaults); pydantic checks
a composed config against them in `tfrecipe.config.schema.validate`. The sections around training
(callbacks, export, loggers, cluster, sweep) are in tfrecipe/config/run_sections.py.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from tfrecipe.config.compile_cache import path_problem

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


class Section(BaseModel):
    """A config section: unknown keys refused, no type coercion, immutable once checked."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- strategy -----------------------------------------------------------------------------------
class _StrategyBase(Section):
    logical_cpus: PositiveInt = 1
    # threads one op splits its work over (tfrecipe.distribute.strategy.configure_threads)
    intra_op_threads: Literal["auto"] | PositiveInt = "auto"
    # TensorFlow's graph optimizer, Grappler (tfrecipe.distribute.strategy.configure_graph_optimizer)
    graph_optimizer: Literal["auto"] | bool = "auto"


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
class _TaskBase(Section):
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
class Precision(Section):
    # auto: mixed_bfloat16 where the hardware runs it natively, else float32 (tfrecipe.precision)
    policy: Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"]
    require_native: bool = True


class Batching(Section):
    per_replica_batch_size: PositiveInt
    global_batch_size: PositiveInt | None = None
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    lr_reference_batch_size: PositiveInt | None = None
    drop_remainder: bool = False
    # auto: several steps per call for small models, 1 for large ones (train.steps_per_call)
    steps_per_execution: PositiveInt | Literal["auto"] = "auto"
    # auto: several epochs per call where a held split's epochs are short (loops.epoch_groups)
    epochs_per_call: PositiveInt | Literal["auto"] = "auto"
    # auto: Keras' choice (XLA where the model supports it, never on a CPU-only machine)
    jit_compile: bool | Literal["auto"] = "auto"
    # BatchNormalization's training step on TensorFlow's fused kernel (tfrecipe.models.batch_norm)
    fused_batch_norm: bool = True
    # XLA's persistent cache of compiled programs: auto | false | an absolute folder
    # (tfrecipe.config.compile_cache; a folder from the command line only)
    compile_cache: bool | str = "auto"

    @field_validator("compile_cache")
    @classmethod
    def _auto_false_or_folder(cls, value):
        if value is False or value == "auto":
            return value
        problem = (
            "expected auto, false or an absolute path" if value is True else path_problem(value)
        )
        if problem:
            raise PydanticCustomError("compile_cache", problem)
        return value


class _OptimizerBase(Section):
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


# --- loop: how the steps run, fine-tuning, the learning-rate sweep --------------------------------
class Finetune(Section):
    # null: one phase; N: train what the model leaves trainable for N epochs, then unfreeze.
    unfreeze_at_epoch: PositiveInt | None = None
    # After the switch: the learning rate x this, with a fresh optimizer.
    learning_rate_factor: Annotated[float, Field(gt=0, le=1)] = 0.1
    # null: every layer; else a regular expression over layer names (re.search).
    unfreeze: str | None = None


class LRFind(Section):
    # An exponential learning-rate sweep before training (tfrecipe/training/lr_find.py).
    enabled: bool = False
    steps: Annotated[int, Field(ge=5)] = 200
    min_lr: PositiveFloat = 1e-7
    max_lr: PositiveFloat = 1.0
    # true: the sweep only (`tfrecipe lr-find`), no training, test or export.
    only: bool = False


class Loop(Section):
    name: Literal["fit", "custom"]
    epochs: PositiveInt
    steps_per_epoch: PositiveInt | None = None
    validation_freq: PositiveInt = 1
    verbose: Literal[0, 1, 2, "auto"] = "auto"
    steps_per_loop: PositiveInt | Literal["auto"] = "auto"
    gradient_accumulation_steps: PositiveInt = 1
    finetune: Finetune = Finetune()
    lr_find: LRFind = LRFind()
