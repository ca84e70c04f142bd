"""`tfrecipe predict RUN_DIR INPUT... [--output FILE] [--model final|best] [--batch-size N]
[--keep COL]`: a trained run's predictions for new files.

Reads what training reads: CSV and Parquet tables (streamed in record batches with pyarrow, never
a whole file in memory), image folders or files, text folders or `.txt` files, `.npz` arrays and
TFRecord files. The run dir says what the model takes and what its outputs mean
(`signature.json`): the input columns and their kinds, the class names, the task's threshold. A
label column in the input is ignored. Writes one row per example: the `--keep` columns (a table's
ids) or the example's `path`, then `prediction` (a class name, or a value in the targets' own
units) and one `prob_CLASS` column per class. The output's suffix picks the format (`.csv`,
`.parquet`, `.jsonl`); without `--output`, CSV to stdout. A file is written under a temporary name
and renamed when complete. Everything given is checked before TensorFlow is imported: a mistake
exits with code 2 and one line (a missing column by name, a bad cell as file:line:column).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfrecipe import files, reading, tasks
from tfrecipe import signature as signatures
from tfrecipe.data.readers import Batch, Source, open_sources
from tfrecipe.errors import ConfigError

OUTPUT_FORMATS = (".csv", ".parquet", ".jsonl")
MODELS = {"final": "model.keras", "best": "best.weights.h5"}


@dataclasses.dataclass(frozen=True)
class Request:
    """What the command line asked for, checked."""

    run_dir: Path
    inputs: tuple[Path, ...]
    output: Path | None  # None: CSV on stdout
    model: str  # final | best
    batch_size: int
    keep: tuple[str, ...]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit code 2, as every usage mistake
        raise ConfigError(f"predict: {message} (tfrecipe predict --help)")


def parse(args: Sequence[str]) -> Request:
    parser = _Parser(
        prog="tfrecipe predict",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, help="a finished run's directory")
    parser.add_argument("inputs", type=Path, nargs="+", metavar="INPUT", help="files or folders")
    parser.add_argument(
        "--output", "-o", type=Path, help=f"{' | '.join(OUTPUT_FORMATS)} (default: CSV on stdout)"
    )
    parser.add_argument("--model", default="final", choices=list(MODELS))
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--keep", action="append", default=[], metavar="COL", help="an input column to copy over"
    )
    options = parser.parse_args(args)
    if options.batch_size <= 0:
        raise ConfigError(f"predict: --batch-size={options.batch_size}: expected a positive number")
    if options.output is not None and options.output.suffix.lower() not in OUTPUT_FORMATS:
        raise ConfigError(
            f"predict: --output={options.output}: unknown format; expected a file ending in "
            f"{', '.join(OUTPUT_FORMATS)}"
        )
    return Request(
        run_dir=options.run_dir,
        inputs=tuple(options.inputs),
        output=options.output,
        model=options.model,
        batch_size=options.batch_size,
        keep=tuple(dict.fromkeys(options.keep)),
    )


@dataclasses.dataclass(frozen=True)
class Run:
    """What a run dir holds for predictions."""

    signature: dict[str, Any]
    dataset: dict[str, Any]  # the run's `dataset` config (how its files were read)
    model_files: tuple[Path, ...]  # model.keras, then best.weights.h5 for --model best


def read_run(run_dir: Path, which: str) -> Run:
    """What `run_dir` holds for predictions, every file read through `tfrecipe.reading` (a run
    dir may be someone else's: its files are data, checked before anything loads them).

    Raises:
      ConfigError: one line: no run dir, no or a damaged signature.json or config.yaml, a model
        file missing, not a regular file or an archive that would inflate too far.
    """
    if not run_dir.is_dir():
        raise ConfigError(f"predict: RUN_DIR={run_dir}: not a directory")
    try:
        record = signatures.read(run_dir)
    except reading.UnreadableFile as error:
        raise ConfigError(f"predict: {error}") from None
    if record is None:
        raise ConfigError(
            f"predict: RUN_DIR={run_dir}: holds no {signatures.SIGNATURE} (a run trained by this "
            "version of tfrecipe writes it when training starts)"
        )
    files = [run_dir / MODELS["final"]]
    if which == "best":
        files.append(run_dir / MODELS["best"])
    for path in files:
        if not os.path.lexists(path):
            raise ConfigError(
                f"predict: --model={which}: {path} does not exist (model.keras is written when a "
                "run completes; best.weights.h5 by callbacks.model_checkpoint)"
            )
    try:
        reading.check_archive(files[0], what="model.keras")  # sizes before Keras inflates it
        for path in files[1:]:
            reading.check_file(path, limit=reading.MAX_INFLATED_BYTES, what="a weights file")
        config = _run_config(run_dir / "config.yaml")
    except reading.UnreadableFile as error:
        raise ConfigError(f"predict: {error}") from None
    return Run(signature=record, dataset=config.get("dataset", {}), model_files=tuple(files))


def _run_config(path: Path) -> dict[str, Any]:
    """The run's resolved config as plain data (only its `dataset` says how files were read)."""
    from omegaconf import OmegaConf

    try:
        config = reading.read_yaml(path, what="a run's config.yaml")
    except FileNotFoundError:
        raise reading.UnreadableFile(
            f"{path}: no such file; a tfrecipe run dir holds the config it ran"
        ) from None
    container = OmegaConf.to_container(config) if config is not None else None
    dataset = container.get("dataset", {}) if isinstance(container, dict) else None
    if not isinstance(dataset, dict):
        raise reading.UnreadableFile(
            f"{path}: holds no mapping of keys with a `dataset` mapping (a tfrecipe run's config)"
        )
    return container


# --- what is written --------------------------------------------------------------------------
def output_columns(record: dict[str, Any]) -> list[str]:
    """The prediction columns after the pass-through ones."""
    return tasks.outputs_of(record["task"]).columns(record["outputs"])


def predictions(record: dict[str, Any], outputs: np.ndarray) -> dict[str, np.ndarray]:
    """The model's outputs (logits, or values) as named columns."""
    outputs = np.asarray(outputs, dtype=np.float64).reshape(len(outputs), -1)
    decode = tasks.outputs_of(record["task"]).decode
    return decode(outputs, record["outputs"], record.get("threshold"))


class Writer:
    """Rows to CSV, Parquet or JSON lines, into a file of a scratch folder made beside the
    output and moved into place on `commit` by the one writer (tfrecipe/files.py; stdout: CSV as
    it goes)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.format = ".csv" if path is None else path.suffix.lower()
        self.partial = None
        self._scratch = None
        self._writer = None
        self._file = None

    def write(self, columns: dict[str, np.ndarray]) -> None:
        import pyarrow as pa

        table = pa.table({name: _arrow(values) for name, values in columns.items()})
        if self._file is None:
            self._open(table.schema)
        if self.format == ".jsonl":
            for row in table.to_pylist():
                self._file.write(json.dumps(row) + "\n")
        else:
            self._writer.write_table(table)

    def _open(self, schema) -> None:
        import pyarrow.csv as pa_csv
        import pyarrow.parquet as pq

        if self.path is None:
            self._file = sys.stdout.buffer
        else:
            import tempfile

            self.path.parent.mkdir(parents=True, exist_ok=True)
            name = f".{self.path.name}."
            self._scratch = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=name, suffix=".tmp"))
            self.partial = self._scratch / self.path.name
            self._file = open(self.partial, "x" if self.format == ".jsonl" else "xb")  # noqa: SIM115
        if self.format == ".csv":
            self._writer = pa_csv.CSVWriter(self._file, schema)
        elif self.format == ".parquet":
            self._writer = pq.ParquetWriter(self._file, schema)

    def commit(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._file is not None and self.partial is not None:
            self._file.close()
            files.put(self.partial, self.path)
            shutil.rmtree(self._scratch, ignore_errors=True)
        elif self._file is not None:
            self._file.flush()

    def discard(self) -> None:
        if self._scratch is not None:
            with contextlib.suppress(Exception):
                if self._writer is not None:
                    self._writer.close()
                if self._file is not None:
                    self._file.close()
            shutil.rmtree(self._scratch, ignore_errors=True)


def _arrow(values: np.ndarray):
    import pyarrow as pa

    values = np.asarray(values)
    if values.dtype == object:
        return pa.array([v.decode() if isinstance(v, bytes) else v for v in values])
    return pa.array(values)


# --- the model --------------------------------------------------------------------------------
def load_model(run: Run):
    """The run's model (`read_run` checked its files: regular, sizes known before inflating).

    Raises:
      ConfigError: one line naming the file Keras cannot load (a damaged archive, layers this
        version does not know, weights of another model).
    """
    import keras

    from tfrecipe import compat
    from tfrecipe.models.build import register_custom_objects

    compat.cache_saving_skipsets()  # each load walks every layer and metric: ~20% of a small one
    register_custom_objects()
    path = run.model_files[0]
    try:
        model = keras.saving.load_model(path, compile=False)
        if len(run.model_files) > 1:  # the best epoch's weights in the final model's architecture
            path = run.model_files[1]
            model.load_weights(path)
    except Exception as error:  # zipfile's, h5py's, Keras' own: all say "cannot be loaded"
        raise ConfigError(
            f"predict: {path} cannot be loaded ({reading.first_line(error)}); is it this run's "
            "model, written by this version of tfrecipe?"
        ) from None
    return model


def _normalizer(record: dict[str, Any]):
    """The per-batch normalization training applied outside the model (`pipeline.normalize`)."""
    import tensorflow as tf

    from tfrecipe.data.pipeline import PipelineOptions, batch_transform

    transform = batch_transform(PipelineOptions(normalize=record.get("normalize", "scale")))
    return lambda x: transform(tf.constant(x), tf.zeros([0]))[0]


def model_inputs(features, normalize):
    """A batch of features as the model takes them: columns by name (strings as tf.string),
    or one normalized array."""
    import tensorflow as tf

    from tfrecipe.models.export import as_model_input

    if isinstance(features, dict):
        return {name: tf.constant(as_model_input(values)) for name, values in features.items()}
    features = as_model_input(features)
    if features.dtype == object:
        return tf.constant(features)
    return normalize(features)


def predict_batches(model, run: Run, batches: Iterator[Batch]) -> Iterator[dict[str, np.ndarray]]:
    """Pass-through columns and prediction columns, batch by batch."""
    normalize = _normalizer(run.signature)
    for batch in batches:
        outputs = model.predict_on_batch(model_inputs(batch.features, normalize))
        yield batch.passthrough | predictions(run.signature, np.asarray(outputs))


@contextlib.contextmanager
def _progress(total: int | None) -> Iterator[Any]:
    """A progress bar on stderr where stderr is a terminal; else nothing (a log stays clean)."""
    if not sys.stderr.isatty():
        yield lambda rows: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = [BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("predict", total=total)
        yield lambda rows: progress.advance(task, rows)


# --- the command ------------------------------------------------------------------------------
def main(args: list[str]) -> None:
    request = parse(args)
    if request.output is not None:  # not an input, a folder, a link or a run's file
        files.check_output(
            request.output, inputs=[*request.inputs, request.run_dir], key="predict: --output"
        )
    run = read_run(request.run_dir, request.model)
    try:
        source: Source = open_sources(
            request.inputs, run.signature, dataset=run.dataset, keep=request.keep
        )
    except reading.UnreadableFile as error:
        raise ConfigError(f"predict: {error}") from None
    from tfrecipe.cli.console import discover_devices

    discover_devices()  # TensorFlow only now, with everything checked
    model = load_model(run)
    writer = Writer(request.output)
    try:
        with _progress(source.num_rows()) as advance:
            for columns in predict_batches(model, run, source.batches(request.batch_size)):
                writer.write(columns)
                advance(len(next(iter(columns.values()))))
        writer.commit()
    except BaseException:
        writer.discard()
        raise
