"""What native code writes to the console, less the lines a user need not see (LiteRT's INFO
line about its XNNPACK delegate, on every interpreter's first call)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

XNNPACK_LINE = re.compile(rb"^INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.$")


@contextlib.contextmanager
def without_lines(hidden: re.Pattern[bytes]) -> Iterator[None]:
    """What native code writes to file descriptor 2 meanwhile, less the lines `hidden` matches
    (passed on when the block ends: it is short)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught if not hidden.match(line.rstrip(b"\n"))]
            os.write(2, b"".join(kept))
