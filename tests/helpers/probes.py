"""Small probes several test files share: what a redacting log handler wrote, and the memory a
piece of code takes in a fresh process."""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def redacted_log(name: str) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """Logger `name` with a handler that redacts as tfrecipe's log and console do
    (`RedactSecrets`), and the stream it writes to; the handler goes when the block ends."""
    from tfrecipe.config.secrets import RedactSecrets

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactSecrets())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)


def peak_memory_growth(*, setup: str, measured: str) -> int:
    """Bytes by which `measured` (Python source) raises a fresh process's peak resident memory,
    after `setup` ran there."""
    script = (
        f"import resource\n{setup}\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"{measured}\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    return int(done.stdout.split()[-1])
