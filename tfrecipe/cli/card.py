"""`tfrecipe card RUN_DIR`: the run's MODEL_CARD.md, made from its own records only.

Hugging Face's model card layout: YAML front matter (`library_name`, `tags`, `pipeline_tag`,
`model-index` with each metric's split, and tfrecipe's own `tfrecipe:` block: task, inputs,
classes, baselines, exports with their checked differences, provenance, the training command),
then the same in prose and tables. Every figure is copied from `summary.json` as it is written
there (never rounded in the front matter), the inputs and classes from `signature.json`, the
command from Hydra's `.hydra/overrides.yaml`. Everything is read through the one reader and the
card is written through the one writer, into the run dir (the run dir is locked meanwhile).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from tfrecipe.errors import ConfigError

CARD = "MODEL_CARD.md"
# Hugging Face's pipeline tags, by task and input kind.
PIPELINE_TAGS = {
    ("array", "classification"): "image-classification",
    ("columns", "classification"): "tabular-classification",
    ("columns", "binary"): "tabular-classification",
    ("columns", "regression"): "tabular-regression",
    ("text", "classification"): "text-classification",
    ("text", "binary"): "text-classification",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError(f"card: {message} (tfrecipe card --help)")


def main(args: list[str]) -> None:
    parser = _Parser(prog="tfrecipe card", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a finished run's directory")
    run_dir = parser.parse_args(args).run_dir
    records = read_records(run_dir)
    from tfrecipe import files
    from tfrecipe.runs import RunDir

    # refuses a run dir a run is writing; the card becomes its file
    RunDir.at(run_dir).lock(command="card")
    files.write_atomic(run_dir / CARD, render(records))
    print(run_dir / CARD)


def read_records(run_dir: Path) -> dict[str, Any]:
    """summary.json, signature.json and the training command, through the one reader.

    Raises:
      ConfigError: one line: not a run dir, or a record missing or unreadable.
    """
    from tfrecipe import reading
    from tfrecipe.runs import RunDir

    if not run_dir.is_dir():
        raise ConfigError(f"card: RUN_DIR={run_dir}: not a directory")
    home = RunDir.at(run_dir)
    try:
        summary = home.summary()
        signature = home.signature()
        command = _command(run_dir)
    except reading.UnreadableFile as error:
        raise ConfigError(f"card: {error}") from None
    if summary is None or signature is None:
        raise ConfigError(
            f"card: RUN_DIR={run_dir}: holds no summary.json or signature.json (a card is made "
            "from a finished run's records)"
        )
    return {"summary": summary, "signature": signature, "command": command, "name": run_dir.name}


def _command(run_dir: Path) -> str | None:
    """`python -m tfrecipe OVERRIDES` from Hydra's record (None: a run without one)."""
    from omegaconf import OmegaConf

    from tfrecipe import reading

    path = run_dir / ".hydra" / "overrides.yaml"
    try:
        overrides = OmegaConf.to_container(reading.read_yaml(path, what="Hydra's overrides.yaml"))
    except FileNotFoundError:
        return None
    if not isinstance(overrides, list):
        return None
    return shlex.join(["python", "-m", "tfrecipe", *map(str, overrides)])


def front_matter(records: dict[str, Any]) -> dict[str, Any]:
    """The card's YAML front matter: Hugging Face's keys and tfrecipe's block."""
    summary, signature = records["summary"], records["signature"]
    task, inputs = signature["task"], signature["inputs"]
    vector = inputs["kind"] == "array" and len(inputs.get("shape", [])) == 1  # a table's row
    pipeline = PIPELINE_TAGS.get(("columns" if vector else inputs["kind"], task))
    results = [
        {
            "task": {"type": pipeline or task},
            "dataset": {
                "name": str(summary.get("dataset")),
                "type": str(summary.get("dataset")),
                "split": split,
            },
            "metrics": [
                {"type": name, "value": value, "name": f"{split} {name}"}
                for name, value in metrics.items()
            ],
        }
        for split, metrics in metrics_by_split(summary).items()
    ]
    matter: dict[str, Any] = {
        "library_name": "keras",
        "tags": ["tfrecipe", "tensorflow", "keras", task],
        "model-index": [{"name": records["name"], "results": results}],
        "tfrecipe": _own_block(records),
    }
    if pipeline:
        matter["pipeline_tag"] = pipeline
    return matter


def metrics_by_split(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{split: {metric: value}}: the test split's, then the last epoch's validation and
    training metrics (Keras' names: `val_` marks validation)."""
    final = summary.get("metrics") or {}
    split = {
        "test": dict(summary.get("test") or {}),
        "validation": {k[4:]: v for k, v in final.items() if k.startswith("val_")},
        "train": {k: v for k, v in final.items() if not k.startswith("val_")},
    }
    return {name: values for name, values in split.items() if values}


def _own_block(records: dict[str, Any]) -> dict[str, Any]:
    summary, signature = records["summary"], records["signature"]
    keys = ("status", "model", "strategy", "precision", "epochs_completed", "params", "best")
    block: dict[str, Any] = {
        "task": signature["task"],
        "inputs": signature["inputs"],
        "outputs": signature["outputs"],
        **{key: summary[key] for key in keys if key in summary},
        "command": records["command"],
    }
    for key in ("threshold", "positive_class"):
        if key in signature:
            block[key] = signature[key]
    for key in ("baselines", "exports", "provenance"):
        if summary.get(key):
            block[key] = summary[key]
    return block


def render(records: dict[str, Any]) -> str:
    """The whole card: front matter, then prose and tables."""
    import yaml

    matter = yaml.safe_dump(front_matter(records), sort_keys=False, allow_unicode=True)
    return f"---\n{matter}---\n\n" + "\n\n".join(_sections(records)) + "\n"


def _sections(records: dict[str, Any]) -> list[str]:
    summary, signature = records["summary"], records["signature"]
    metrics = "\n".join(
        f"| {split} | {name} | {value:.4g} |"
        for split, values in metrics_by_split(summary).items()
        for name, value in values.items()
    )
    sections = [
        f"# {records['name']}",
        f"A {signature['task']} model (`{summary.get('model')}`) trained by tfrecipe on "
        f"`{summary.get('dataset')}`. It takes {_takes(signature['inputs'])}; its outputs are "
        + ", ".join(f"`{o}`" for o in signature["outputs"])
        + ".",
        "## Metrics\n\n| split | metric | value |\n|---|---|---|\n" + metrics,
        *_tables(summary),
    ]
    command = records["command"] or "(not recorded: the run was started without Hydra's record)"
    versions = (summary.get("provenance") or {}).get("versions") or {}
    sections.append(
        "## Provenance\n\n"
        f"Trained with: `{command}`\n\n"
        + ", ".join(f"{name} {version}" for name, version in versions.items())
    )
    return sections


def _takes(inputs: dict[str, Any]) -> str:
    if inputs["kind"] == "columns":
        return "a table's columns: " + ", ".join(
            f"`{n}` ({t})" for n, t in inputs["columns"].items()
        )
    if inputs["kind"] == "text":
        return "raw text"
    return f"an array of shape {inputs.get('shape')} ({inputs.get('dtype')})"


def _tables(summary: dict[str, Any]) -> list[str]:
    """The baselines' and the exports' tables (where the run has them)."""
    tables = []
    baselines = summary.get("baselines") or {}
    if baselines.get("models"):
        rows = "\n".join(
            f"| {name} | "
            + ", ".join(f"{k} {v:.4g}" for k, v in scores.items() if isinstance(v, int | float))
            + " |"
            for name, scores in baselines["models"].items()
        )
        tables.append(
            f"## Baselines ({baselines.get('split')} split)\n\n| baseline | scores |\n|---|---|\n"
            + rows
        )
    exports = summary.get("exports") or {}
    if exports:
        tables.append(
            "## Exports (each checked against Keras on held-out examples)\n\n"
            "| format | path | max abs difference |\n|---|---|---|\n"
            + "\n".join(
                f"| {fmt} | `{record.get('path')}` | {record.get('max_abs_diff', '-')} |"
                for fmt, record in exports.items()
            )
        )
    return tables
