"""`tfrecipe predict RUN_DIR INPUT... [--output FILE] [--model final|best] [--batch-size N]
[--keep COL]`: a trained run's predictions for new files.

Reads what training reads: CSV and Parquet tables, files or folders of them (streamed in record
batches with pyarrow, never a whole file in memory), image folders or files, text folders or `.txt` files, `.npz` arrays and
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
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfrecipe import files, reading, tasks
from tfrecipe.data.readers import Batch, Source, open_sources
from tfrecipe.errors import ConfigError
from tfrecipe.runs import MODEL_FILES, RunDir, TrainedModel

OUTPUT_FORMATS = (".csv", ".parquet", ".jsonl")


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
    parser.add_argument("--model", default="final", choices=list(MODEL_FILES))
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


# --- what is written --------------------------------------------------------------------------
def output_columns(record: dict[str, Any]) -> list[str]:
    """The prediction columns after the pass-through ones."""
    return tasks.outputs_of(record["task"]).columns(record["outputs"])


def predictions(record: dict[str, Any], outputs: np.ndarray) -> dict[str, np.ndarray]:
    """The model's outputs (logits, or values) as named columns."""
    outputs = np.asarray(outputs, dtype=np.float64)
    outputs = outputs.reshape(len(outputs), int(np.prod(outputs.shape[1:])))  # also of no rows
    decode = tasks.outputs_of(record["task"]).decode
    return decode(outputs, record["outputs"], record.get("threshold"))


def no_rows(record: dict[str, Any], keep: Sequence[str], model) -> dict[str, np.ndarray]:
    """The columns of no rows (a table of a header alone), so the output still names them."""
    kept = {name: np.array([], dtype=object) for name in keep}
    return kept | predictions(record, np.zeros((0, model.outputs[0].shape[-1])))


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
def normalizer(record: dict[str, Any]):
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


def predict_batches(
    model, run: TrainedModel, batches: Iterator[Batch]
) -> Iterator[dict[str, np.ndarray]]:
    """Pass-through columns and prediction columns, batch by batch."""
    normalize = normalizer(run.signature)
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
def _source(request: Request, run: TrainedModel) -> Source:
    """The inputs, checked against the run's signature, before TensorFlow loads."""
    produced = output_columns(run.signature)
    clash = [name for name in request.keep if name in produced]
    if clash:  # the prediction's column would replace the kept one in the output
        raise ConfigError(
            f"predict: --keep={','.join(clash)}: the output has its own column(s) of that name "
            f"({', '.join(produced)}); rename the input's column to keep it"
        )
    try:
        return open_sources(request.inputs, run.signature, dataset=run.dataset, keep=request.keep)
    except reading.UnreadableFile as error:
        raise ConfigError(f"predict: {error}") from None


def main(args: list[str]) -> None:
    request = parse(args)
    if request.output is not None:  # not an input, a folder, a link or a run's file
        files.check_output(
            request.output, inputs=[*request.inputs, request.run_dir], key="predict: --output"
        )
    run = RunDir.at(request.run_dir).trained_model(request.model)
    source = _source(request, run)
    from tfrecipe.cli.console import discover_devices

    discover_devices()  # TensorFlow only now, with everything checked
    model = run.load()
    writer, rows, names = Writer(request.output), 0, []
    try:
        with _progress(source.num_rows()) as advance:
            for columns in predict_batches(model, run, source.batches(request.batch_size)):
                writer.write(columns)
                names, count = list(columns), len(next(iter(columns.values())))
                rows += count
                advance(count)
            if rows == 0:  # the header alone, not "wrote 0 rows" and no file
                columns = no_rows(run.signature, request.keep, model)
                writer.write(columns)
                names = list(columns)
        writer.commit()
    except BaseException:
        writer.discard()
        raise
    if request.output is not None:  # stdout carries the rows otherwise
        print(f"predict: wrote {rows} rows to {request.output} (columns: {', '.join(names)})")
