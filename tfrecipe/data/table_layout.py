"""A table dataset's files and the columns its config names (`dataset=csv`, `dataset=parquet`),
opened and checked without TensorFlow: the headers give the columns, every name the config
gives is checked against them.

`tabular` builds its splits on this; the command line's pre-check calls `check_table` before
TensorFlow is imported, so a wrong column is reported in the time a config typo is.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable, Mapping, Sequence

from tfrecipe.data import table_files
from tfrecipe.data.table_files import CsvOptions, Table

# The builders whose tables `check_table` reads (tfrecipe.data.tabular's, by their config name).
CSV_TARGET = "tfrecipe.data.tabular.csv"
PARQUET_TARGET = "tfrecipe.data.tabular.parquet"


@dataclasses.dataclass(frozen=True)
class Named:
    """The columns a table's config names.

    Attributes:
      label: the target column, or several 0/1 columns (a multi-hot target).
      features: the input columns; None: every column but the label.
      categorical: input columns read as strings and one-hot encoded.
    """

    label: str | Sequence[str]
    features: Sequence[str] | None = None
    categorical: Sequence[str] = ()

    @property
    def labels(self) -> list[str]:
        return [self.label] if isinstance(self.label, str) else list(self.label)


def csv_opener(
    *,
    delimiter: str = ",",
    header: bool = True,
    column_names: Sequence[str] | None = None,
    na_values: Sequence[str] = (),
) -> Callable[..., Table]:
    """`table_files.open_table` for CSV files read with these options."""
    options = CsvOptions(
        delimiter=delimiter,
        header=header,
        column_names=tuple(column_names) if column_names else None,
        na_values=tuple(na_values),
    )
    return functools.partial(table_files.open_table, format="csv", csv=options)


def parquet_opener() -> Callable[..., Table]:
    """`table_files.open_table` for Parquet files."""
    return functools.partial(table_files.open_table, format="parquet")


def input_columns(tables: Sequence[Table], named: Named) -> list[str]:
    """The feature columns, every named column checked to exist in every table (the training
    table first).

    Raises:
      ValueError: one line: `label='x': FILE has no such column ...; its columns are: ...`, a
        column both feature and label, no feature left.
    """
    labels, features, categorical = named.labels, named.features, named.categorical
    if not labels:
        raise ValueError("label=[]: name the target column (or several 0/1 columns)")
    for key, names in (
        ("label", labels),
        ("features", features or ()),
        ("categorical", categorical),
    ):
        twice = [name for i, name in enumerate(names) if name in names[:i]]
        if twice:
            raise ValueError(f"{key}={list(names)}: {twice[0]!r} is named twice; name it once")
    for table in tables:
        _check_columns(
            table, {"label": labels, "features": features or (), "categorical": categorical}
        )
    columns = tables[0].columns
    inputs = list(features) if features is not None else [c for c in columns if c not in labels]
    for key, names in (("features", inputs), ("categorical", categorical)):
        both = [name for name in names if name in labels]
        if both:
            raise ValueError(f"{key}: {both[0]!r} is the label; a column is a feature or the label")
    outside = [name for name in categorical if name not in inputs]
    if outside:
        raise ValueError(
            f"categorical={outside[0]!r}: not among the features ({', '.join(inputs)})"
        )
    if not inputs:
        raise ValueError("features=[]: the model needs at least one input column")
    return inputs


def check_fractions(validation: float, test: float) -> None:
    if not (0 <= validation < 1 and 0 <= test < 1 and validation + test < 1):
        raise ValueError(
            f"validation_fraction={validation}, test_fraction={test}: each in [0, 1) and "
            "together below 1, so that rows are left to train on"
        )


def check_counts(*, stats_rows: int | None, max_vocabulary: int) -> None:
    for key, value in (("stats_rows", stats_rows), ("max_vocabulary", max_vocabulary)):
        if value is not None and value < 1:
            every = " (null: every row)" if key == "stats_rows" else ""
            raise ValueError(f"{key}={value}: at least 1{every}")


def check_table(target: str, arguments: Mapping) -> None:
    """For `tabular.csv` and `tabular.parquet` (nothing for another `target`): the files of
    `path`, `validation_path` and `test_path` exist and hold the columns `arguments` name. Only
    the headers are read (Parquet: its footer's schema).

    Raises:
      ValueError: the line `tabular` raises for the same arguments.
    """
    if target == CSV_TARGET:
        options = ("delimiter", "header", "column_names", "na_values")
        open_table = csv_opener(**{key: arguments[key] for key in options if key in arguments})
    elif target == PARQUET_TARGET:
        open_table = parquet_opener()
    else:
        return
    check_counts(
        stats_rows=arguments.get("stats_rows"), max_vocabulary=arguments.get("max_vocabulary", 1)
    )
    paths = [(key, arguments.get(key)) for key in ("path", "validation_path", "test_path")]
    tables = [open_table(path, key=key) for key, path in paths if path]
    named = Named(
        label=arguments.get("label", ()),
        features=arguments.get("features"),
        categorical=arguments.get("categorical") or (),
    )
    input_columns(tables, named)


def _check_columns(table: Table, named: Mapping[str, Sequence[str]]) -> None:
    """Every column a config key names exists in the table.

    Raises:
      ValueError: `key='name': FILE has no such column; its columns are: ...`.
    """
    for key, names in named.items():
        for name in names:
            if name not in table.columns:
                close = difflib.get_close_matches(name, table.columns, n=1)
                guess = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"{key}={name!r}: {table.files[0]} has no such column{guess}; its columns "
                    f"are: {', '.join(table.columns)}{delimiter_hint(table)}"
                )


# The separators a header read with another one shows inside its names, as the override sets them.
_OTHER_DELIMITERS = {"\t": "'\\t'", ";": "';'", "|": "'|'", ",": "','"}


def delimiter_hint(table: Table, *, predict: bool = False) -> str:
    """What to do when the header was split on the wrong character (a TSV read with `,`: one
    column whose name holds the tabs), else "": training sets `dataset.delimiter`; `predict`
    reads with the run's, so the file must use it."""
    if table.format != "csv" or not table.csv.header:
        return ""
    ran = table.csv.delimiter
    for separator, shown in _OTHER_DELIMITERS.items():
        if separator != ran and any(separator in c for c in table.columns):
            mismatch = f"; the header has {shown} between its names, not {ran!r}"
            if predict:
                return (
                    f"{mismatch}: the run was trained with dataset.delimiter={ran!r} and predict "
                    f"reads its input with it: write the file with {ran!r} between the values"
                )
            return f"{mismatch}: set dataset.delimiter={shown}"
    return ""
