"""The one list of a data folder's files: what the readers train on, what the data fingerprint
vouches for and what `tfrecipe predict` reads are the same files.

A name starting with "." is no data, in any folder: a hidden file (`.notes.txt`, `.DS_Store`)
and everything under a hidden folder (`.ipynb_checkpoints/`, `.git/`) are left out by all three
alike. A link to a folder is not followed (a folder's data is what lies in it). Entries are
returned whatever they are: each reader checks what it reads (`reading.check_file`: a link to
/dev/zero or a FIFO is refused, never read). No TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def hidden(name: str) -> bool:
    return name.startswith(".")


def folder_files(root: str | os.PathLike, suffixes: Sequence[str] = ()) -> list[Path]:
    """The entries under `root` and its subfolders (not hidden, not links) that are not folders,
    sorted, hidden ones left out.

    Args:
      root: a folder.
      suffixes: keep only names ending with one of these, in any case (`(".txt",)`); all if
        empty.
    """
    wanted = tuple(s.lower() for s in suffixes)
    found = []
    for parent, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not hidden(d))
        found += [
            Path(parent, name)
            for name in names
            if not hidden(name) and (not wanted or name.lower().endswith(wanted))
        ]
    return sorted(found)
