"""`tfrecipe export RUN_DIR --format F [--format F ...] [--quantize Q] [--model final|best]
[--name NAME] [key=value ...]`: a finished run's model in more formats.

The same exports as `export.formats` at the end of training (tfrecipe/models/export.py): each
file is loaded in its own runtime and compared with Keras on the run's held-out examples (its
test split, rebuilt from the run's `config.yaml`; overrides adapt it, e.g. `dataset.path=...` on
another machine), kept only within `--tolerance`, and recorded under `exports` in the run's
`summary.json` as `final/FORMAT` (`best/FORMAT`), beside training's own records. A format that
cannot carry the model is refused with the reason (exit 2).

The files go to `RUN_DIR/exports/final/` (or `exports/best/`): an export adds files and never
replaces what training wrote (its model.keras, saved_model/, ...), and one that fails
removes every file it wrote. With `--name NAME` the
SavedModel goes to `RUN_DIR/exports/serving/NAME/1/` (TF Serving's layout) and the ONNX file to
`RUN_DIR/exports/triton/NAME/1/model.onnx` with its `config.pbtxt` (Triton's). The run dir is
locked while it exports, so a run still training there is not written into.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tfrecipe import rundir
from tfrecipe.config.export_limits import server_name_problem
from tfrecipe.config.grants import Grants
from tfrecipe.config.schema import EXPORT_FORMATS
from tfrecipe.errors import ConfigError

QUANTIZE = ("none", "dynamic", "float16", "int8")
EXPORTS = rundir.EXPORTS  # RUN_DIR/exports/final|best: what `tfrecipe export` adds


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit code 2, as every usage mistake
        raise ConfigError(f"export: {message} (tfrecipe export --help)")


def _parse(args: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="tfrecipe export", description=__doc__.split("\n\n")[1])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--format", action="append", required=True, choices=EXPORT_FORMATS)
    parser.add_argument("--quantize", default="none", choices=QUANTIZE, help="LiteRT quantization")
    parser.add_argument("--model", default="final", choices=["final", "best"])
    parser.add_argument("--tolerance", type=float, default=None, help="default: the run's")
    parser.add_argument(
        "--name", default=None, help="lay saved_model and onnx out for servers under this name"
    )
    parser.add_argument("overrides", nargs="*", help="key=value changes to the run's config")
    options = parser.parse_args(args)
    if options.tolerance is not None and not options.tolerance > 0:  # NaN too
        raise ConfigError(
            f"export: --tolerance={options.tolerance}: expected a positive number (the largest "
            "difference from Keras an exported file may have)"
        )
    if options.quantize != "none" and "litert" not in options.format:
        raise ConfigError(f"export: --quantize={options.quantize}: needs --format litert")
    if options.name is not None and server_name_problem(options.name):
        raise ConfigError(f"export: --name={options.name!r}: {server_name_problem(options.name)}")
    return options


def main(args: list[str]) -> None:
    options = _parse(args)
    from tfrecipe.models.export import missing_packages
    from tfrecipe.runs import RunDir

    home = RunDir.at(options.run_dir)
    run_files = home.trained_model(options.model, command="export")  # the files, checked
    missing = missing_packages(options.format)
    if missing:
        raise ConfigError(
            f"export: --format={','.join(options.format)}: needs {', '.join(missing)}, which are "
            "not installed; pip install 'tfrecipe[export]'"
        )
    from tfrecipe.cli.console import discover_devices

    run = home.config(options.overrides, command="export")
    _check_name(options, run.export)
    discover_devices()
    result = _export(options, run, run_files)
    print(json.dumps(result, indent=2))


def _check_name(options, trained) -> None:
    """`--name` lays the server formats out where training did for `export.name`: never over
    what training wrote there (a server loads it)."""
    laid_out = [f for f in options.format if f in ("saved_model", "onnx") and f in trained.formats]
    if options.name is not None and options.name == trained.name and laid_out:
        raise ConfigError(
            f"export: --name={options.name}: the run's training laid its {', '.join(laid_out)} "
            f"out under that name (export.name={trained.name}), and an export never replaces "
            f"what training wrote; name another (e.g. --name {options.name}-{options.model})"
        )


def _export(options, run, run_files) -> dict:
    from tfrecipe.data.fingerprint import check_run_data
    from tfrecipe.models import export
    from tfrecipe.runs import RunDir
    from tfrecipe.training.dataset import load_splits

    home = RunDir.at(options.run_dir)
    home.lock(command="export")  # refuses a run dir a run is writing
    out = Path(EXPORTS, options.model)
    model = run_files.load(command="export")
    for fmt in options.format:
        why = export.unsupported(model, fmt)
        if why is not None:
            raise ConfigError(f"export: --format={fmt}: cannot carry this model ({why})")
    spec = run.export
    settings = export.ExportOptions(
        formats=tuple(options.format),
        tolerance=options.tolerance or spec.tolerance,
        check_examples=spec.check_examples,
        quantize=options.quantize,
        representative_examples=spec.litert.representative_examples,
        name=options.name,
    )
    # the check examples compare Keras with each format on the data the run was trained on
    check_run_data(home, run, command="export")
    splits = load_splits(run.dataset, grants=Grants.of(run.allowed_targets), task=run.task)
    exports = options.run_dir / EXPORTS
    before = _tree(exports)
    try:
        report = export.export_run(
            model,
            options.run_dir / out,
            settings,
            splits=splits,
            pipeline=run.pipeline,
            task=run.task,
            batch_size=run.batching.per_replica_batch_size,
            root=options.run_dir,  # paths in the report are the run dir's
        )
    except BaseException as error:  # nothing it wrote stays (model.keras goes first)
        _remove_added(exports, before)
        if isinstance(error, export.ExportError):
            raise SystemExit(f"tfrecipe export: failed: {error}") from None
        raise
    summary = home.summary() or {}
    # keyed by where they went (final/onnx): training's own records stay as they were
    added = {f"{options.model}/{fmt}": record for fmt, record in report.items()}
    summary["exports"] = {**summary.get("exports", {}), **added}
    home.write_summary(summary)
    return report


def _tree(folder: Path) -> set[Path]:
    """`folder` and everything under it (nothing when it does not exist)."""
    return {folder, *folder.rglob("*")} if folder.is_dir() else set()


def _remove_added(folder: Path, before: set[Path]) -> None:
    """Removes what a failed export added under `folder` since `before` (`_tree`'s): the files
    it finished before one failed its check, and the folders it made for them."""
    import shutil

    for path in sorted(_tree(folder) - before, key=lambda p: len(p.parts)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            path.unlink()
