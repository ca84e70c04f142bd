"""What each export format is and what it cannot carry: the one table that the config check
(before training, tfrecipe/config/cross_checks.py) and the exporters (after it,
tfrecipe/models/export.py) both read.

Plain data, no TensorFlow and no pydantic: `tfrecipe validate` reads it without importing either.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from tfrecipe.rundir import LAYOUT


@dataclasses.dataclass(frozen=True)
class Format:
    """One format a run can export its model in.

    Attributes:
      file: its final file (or directory) in the run dir (`rundir.LAYOUT`'s).
      packages: the Python packages its exporter and runtime need (the `export` extra).
      periodic: whether `callbacks.export.every_n_epochs` also writes it each N epochs (the others
        are written and checked once, when the run ends).
      cannot_carry: layer class -> why the format cannot carry it; `{layer}` is where the sentence
        names the layer.
    """

    file: str
    packages: tuple[str, ...] = ()
    periodic: bool = False
    cannot_carry: Mapping[str, str] = dataclasses.field(default_factory=dict)


FORMATS: Mapping[str, Format] = {
    "keras": Format(LAYOUT["model"][0], periodic=True),
    "saved_model": Format(LAYOUT["saved_model"][0], periodic=True),
    "onnx": Format(
        LAYOUT["onnx"][0],
        packages=("tf2onnx", "onnx", "onnxruntime"),
        cannot_carry={
            "TextVectorization": "ONNX has no string ops for {layer}",
            "StringLookup": "Keras writes {layer} to an invalid ONNX file",
            "Hashing": "ONNX has no string hashing",
        },
    ),
    "litert": Format(
        LAYOUT["litert"][0],
        packages=("ai_edge_litert",),
        cannot_carry={
            "TextVectorization": "LiteRT's pip runtime cannot run {layer} (no Flex delegate)",
        },
    ),
}
EXPORT_FORMATS: tuple[str, ...] = tuple(FORMATS)
PERIODIC_EXPORT_FORMATS: tuple[str, ...] = tuple(f for f, spec in FORMATS.items() if spec.periodic)

# LiteRT quantizations calibrated on training examples, which its converter feeds one array per
# example: a table's model, which takes a dict of named columns, cannot be calibrated.
CALIBRATED_QUANTIZATIONS = ("int8",)

# Builders whose models hold a layer some format cannot carry, known from the config before
# anything is built; other models are checked once built (tfrecipe.models.export.unsupported).
TEXT_MODEL = "tfrecipe.models.text"  # a TextVectorization layer
TEXT_MODEL_LAYER = "TextVectorization"
TABLE_DATASETS = "tfrecipe.data.tabular."  # csv, parquet: a StringLookup per categorical column
TABLE_CATEGORICAL_LAYER = "StringLookup"


def why_not(fmt: str, layer: str, *, called: str | None = None) -> str | None:
    """Why `fmt` cannot carry a `layer` (a layer class), naming the layer as `called` (default:
    its class); None when it can."""
    spec = FORMATS.get(fmt)
    why = None if spec is None else spec.cannot_carry.get(layer)
    return None if why is None else why.format(layer=called or layer)


def carried_by(layer: str) -> list[str]:
    """The formats that carry a `layer` (a layer class), in table order."""
    return [fmt for fmt in FORMATS if layer not in FORMATS[fmt].cannot_carry]


# A model's name for servers (export.name, `tfrecipe export --name`, `tfrecipe serve --name`):
# a folder name of its own (exports/serving/NAME/, exports/triton/NAME/) and a URL segment
# (/v1/models/NAME), never a path, `..` or a hidden name.
_SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SERVER_NAME_RULE = (
    "expected a name of letters, digits, '_', '.' and '-' (up to 64, starting with a letter or a "
    "digit), e.g. digits"
)


def server_name_problem(name: str) -> str | None:
    """What makes `name` no server name (None: nothing)."""
    if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
        return SERVER_NAME_RULE
    return None
