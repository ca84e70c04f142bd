"""What a newcomer typed wrong or asked first: a key's typo gets a suggestion, `--version` names
tfrecipe's version, `evaluate` alone says what it needs, `validate` says what it did not read,
`ls` shows whole sentences (none of them imports TensorFlow); every command a recipe shows is
valid."""

from __future__ import annotations

import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import REPO
from helpers.no_tensorflow import SCRIPT as _NO_TF


def _tfrecipe(*args: str, cwd) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) of `tfrecipe ARGS`; the last stdout line says whether
    TensorFlow was imported and the exit code."""
    result = subprocess.run(
        [sys.executable, "-c", _NO_TF, *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    return result.stdout.splitlines(), result.stderr.splitlines()


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (  # Hydra refuses a key the config does not have
            "loop.epoch=3",
            "loop.epoch: unknown key (received loop.epoch=3); did you mean loop.epochs? (or to "
            "add a new key use +loop.epoch=...)",
        ),
        ("seeed=1", "seeed: unknown key (received seeed=1); did you mean seed? (or to add"),
        # an appended key reaches the schema
        ("+loop.epoch=3", "loop.epoch=3: unknown key; did you mean loop.epochs?"),
        ("+strategy.logical_cpu=2", "strategy.logical_cpu=2: unknown key; did you mean "),
        # nothing close: no guess
        ("loop.zzz=3", "loop.zzz: unknown key (received loop.zzz=3); to add a new key use +"),
    ],
)
def test_a_key_typo_suggests_the_key_of_that_section(tmp_path, override, line):
    out, err = _tfrecipe(override, cwd=tmp_path)
    assert out == ["NO-TENSORFLOW 2"]
    assert len(err) == 1 and err[0].startswith(f"tfrecipe: invalid configuration: {line}"), err
    assert ("did you mean" in err[0]) == ("zzz" not in override)
    assert not (tmp_path / "outputs").exists()


def _write_table(path: Path) -> None:
    """Columns sepal, petal (numbers) and species, as CSV, gzip'd CSV or Parquet by suffix."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [(i + 0.5, float(i % 3), "ab"[i % 2]) for i in range(20)]
    if path.suffix == ".parquet":
        columns = dict(zip(("sepal", "petal", "species"), zip(*rows, strict=True), strict=True))
        pq.write_table(pa.table({name: list(values) for name, values in columns.items()}), path)
        return
    text = "sepal,petal,species\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows)
    path.write_bytes(gzip.compress(text.encode()) if path.suffix == ".gz" else text.encode())


@pytest.mark.parametrize(
    ("dataset", "file", "key", "value"),
    [
        ("csv", "t.csv", "label", "specie"),
        ("csv", "t.csv.gz", "features", "[sepal,petl]"),
        ("parquet", "t.parquet", "categorical", "[specis]"),
    ],
)
def test_a_wrong_column_is_refused_before_tensorflow_is_imported(
    tmp_path, dataset, file, key, value
):
    """The header is read in the pre-check: the line training would give, in seconds."""
    _write_table(tmp_path / file)
    overrides = [f"dataset={dataset}", f"dataset.path={file}", "dataset.label=species"]
    out, err = _tfrecipe(*overrides, f"dataset.{key}={value}", cwd=tmp_path)
    assert out == ["NO-TENSORFLOW 2"]
    wrong = value.strip("[]").split(",")[-1]
    right = {"specie": "species", "petl": "petal", "specis": "species"}[wrong]
    assert err == [
        f"tfrecipe: invalid configuration: dataset: {key}={wrong!r}: {file} has no such column "
        f"(did you mean {right!r}?); its columns are: sepal, petal, species"
    ]
    assert not (tmp_path / "outputs").exists()


def test_version_is_tfrecipe_s(tmp_path):
    out, _ = _tfrecipe("--version", cwd=tmp_path)
    assert out == [
        f"tfrecipe {version('tfrecipe')} (Hydra {version('hydra-core')})",
        "NO-TENSORFLOW 0",
    ]


def test_evaluate_without_arguments_says_what_it_needs(tmp_path):
    out, err = _tfrecipe("evaluate", cwd=tmp_path)
    assert out == ["NO-TENSORFLOW 2"]
    assert err == [
        "tfrecipe: invalid configuration: evaluate: expected RUN_DIR (a run directory: its "
        "config.yaml and model.keras), received nothing; usage: tfrecipe evaluate RUN_DIR "
        "[--model model.keras|best|model-NNN.keras] [key=value ...]"
    ]


def test_validate_says_the_data_was_not_read(tmp_path):
    out, _ = _tfrecipe(
        "validate", "dataset=csv", "dataset.path=missing.csv", "dataset.label=y", cwd=tmp_path
    )
    assert out[:2] == [
        "valid: dataset=csv dataset.path=missing.csv dataset.label=y",
        "  checked: every key and value, and every _target_ with its arguments; not read: the data "
        "(files, labels, shapes are checked when a run loads it)",
    ]
    assert out[-1] == "NO-TENSORFLOW 0"


RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def _header_commands(path: Path) -> list[list[str]]:
    """The `python -m tfrecipe ...` lines a recipe's header shows, as argument lists."""
    lines = [line[2:] for line in path.read_text().splitlines() if line.startswith("# python -m")]
    return [shlex.split(line)[3:] for line in lines]


@pytest.mark.parametrize("path", RECIPES, ids=lambda path: path.stem)
def test_every_command_a_recipe_shows_validates(path, capsys, tmp_path):
    """What a newcomer copies from a header must run (digits_finetune's second command too, its
    model.init_from the first command's run)."""
    from helpers.configs import with_earlier_runs

    from tfrecipe.cli.commands import validate

    commands = _header_commands(path)
    assert commands, path
    for args in commands:
        args = with_earlier_runs(args, tmp_path)
        validate([a for a in args if a != "-m" and not a.startswith("hydra.")])


def test_ls_shows_whole_first_sentences(tmp_path):
    out, _ = _tfrecipe("ls", cwd=tmp_path)
    entries, current = {}, None
    first_group = next(i for i, line in enumerate(out[1:], 1) if not line.startswith(" "))
    for line in out[1:first_group]:  # the recipes, up to the first group's heading
        if line.startswith("  ") and not line.startswith("   "):
            current, _, text = line.strip().partition(" ")
            entries[current] = text.strip()
        else:
            entries[current] += " " + line.strip()
    assert sorted(entries) == [path.stem for path in RECIPES]
    for name, text in entries.items():
        assert text.endswith((".", ".)")), (name, text)  # a sentence, not a line cut short
    assert entries["digits_finetune"] == (
        "Transfer learning, fully offline, in two runs: pretrain the cnn on digits 0-4, then "
        "train on 5-9 starting from its weights."
    )
