"""Boolean cells of a CSV file (pandas writes True/False, Spark and R true/false), read as
Parquet's bool columns are read: 1.0/0.0 in a numeric column, "true"/"false" in a categorical or
label column. So one table trains the same model as CSV and as Parquet (the same classes, the
same features), and `predict` takes either for a model trained on the other. No TensorFlow.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

TRUE_WORDS = ("true", "True", "TRUE")
FALSE_WORDS = ("false", "False", "FALSE")
WORDS = frozenset((*TRUE_WORDS, *FALSE_WORDS))
# The data rows at a CSV file's start that say whether a column holds booleans.
PEEK_ROWS = 1000


def columns_of(
    records: Iterable[list[str]], columns: Sequence[str], na_values: Iterable[str]
) -> tuple[str, ...]:
    """The columns whose cells in `records` (a CSV file's first data rows) are true/false words
    (at least one; missing cells aside)."""
    missing = {"", *na_values}
    word_seen = dict.fromkeys(columns, False)  # the columns still possibly of booleans
    for values in itertools.islice(records, PEEK_ROWS):
        for name, cell in zip(columns, values, strict=False):  # a ragged row: refused later
            if name in word_seen and cell not in missing:
                if cell in WORDS:
                    word_seen[name] = True
                else:
                    del word_seen[name]
        if not word_seen:
            break
    return tuple(name for name in columns if word_seen.get(name))


def as_read(column, *, string: bool, of_words: bool):
    """A CSV column as the table readers yield it: a `string` column (categorical, label)
    trimmed, "true"/"false" if `of_words`; a numeric one as Arrow read it, 1.0/0.0 float32 if
    `of_words` (read by Arrow as booleans)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not string:
        return pc.cast(column, pa.float32()) if of_words else column
    column = pc.utf8_trim_whitespace(column)
    if not of_words:
        return column
    column = pc.if_else(pc.is_in(column, value_set=pa.array(TRUE_WORDS)), "true", column)
    return pc.if_else(pc.is_in(column, value_set=pa.array(FALSE_WORDS)), "false", column)
