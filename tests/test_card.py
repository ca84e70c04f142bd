"""`tfrecipe card RUN_DIR`: MODEL_CARD.md from the run's own records, with Hugging Face-style
YAML front matter whose every figure is summary.json's."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from conftest import TINY


def _numbers(node, path=()) -> dict[tuple, float]:
    """Every number in a JSON/YAML tree by its path (booleans are not figures)."""
    if isinstance(node, dict):
        return {
            k: v for key, value in node.items() for k, v in _numbers(value, (*path, key)).items()
        }
    if isinstance(node, list):
        return {
            k: v for i, value in enumerate(node) for k, v in _numbers(value, (*path, i)).items()
        }
    if isinstance(node, int | float) and not isinstance(node, bool):
        return {path: node}
    return {}


def test_the_card_front_matter_parses_and_every_figure_is_summary_jsons(cli, tmp_path):
    run_dir = tmp_path / "wine"
    trained = cli(
        f"hydra.run.dir={run_dir}",
        *TINY,
        "dataset=wine",
        "model=mlp",
        "model.hidden_units=[8]",
        "baseline=auto",
        "export.formats=[keras,saved_model]",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    made = cli("card", str(run_dir))
    assert made.returncode == 0, made.stderr[-2000:]

    text = (run_dir / "MODEL_CARD.md").read_text()
    assert text.startswith("---\n")
    matter = yaml.safe_load(text.split("---\n")[1])
    summary = json.loads((run_dir / "summary.json").read_text())
    signature = json.loads((run_dir / "signature.json").read_text())

    assert matter["library_name"] == "keras" and matter["pipeline_tag"] == "tabular-classification"
    results = {r["dataset"]["split"]: r for r in matter["model-index"][0]["results"]}
    test = {m["type"]: m["value"] for m in results["test"]["metrics"]}
    assert test == summary["test"]  # the test split's figures, exactly
    validation = {m["type"]: m["value"] for m in results["validation"]["metrics"]}
    assert validation == {k[4:]: v for k, v in summary["metrics"].items() if k.startswith("val_")}
    own = matter["tfrecipe"]
    assert own["outputs"] == signature["outputs"] and own["inputs"] == signature["inputs"]
    assert own["baselines"] == summary["baselines"] and own["exports"] == summary["exports"]
    assert own["command"].startswith("python -m tfrecipe ") and "dataset=wine" in own["command"]

    in_summary = set(_numbers(summary).values()) | set(_numbers(signature).values())
    figures = _numbers(matter)
    assert figures and all(value in in_summary for value in figures.values()), [
        (path, value) for path, value in figures.items() if value not in in_summary
    ]
    assert "## Baselines" in text and "## Exports" in text


def test_a_dir_without_records_is_one_line(tmp_path, capsys):
    import pytest

    from tfrecipe.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["card", str(tmp_path)])
    assert stop.value.code == 2
    assert "holds no summary.json" in capsys.readouterr().err
    assert not (Path(tmp_path) / "MODEL_CARD.md").exists()
