"""What measuring a run's performance keeps per machine: the CPU's matmul peak per dtype and the
FLOPs of each model's training step. One JSON file under the user's cache dir (or the file
`TFRECIPE_PERF_CACHE` names: the test suite shares one per session), written atomically; a
process that cannot write it measures again next time."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "TFRECIPE_PERF_CACHE"


def cache_path() -> Path:
    named = os.environ.get(CACHE_ENV)
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tfrecipe" / "perf.json"


def remembered(
    section: str, key: str, measure: Callable[[], float | None]
) -> tuple[float | None, bool]:
    """`measure()`'s value for `key`, from the cache when it has one: (value, from_cache)."""
    path = cache_path()
    value = _read(path).get(section, {}).get(key)
    if isinstance(value, int | float) and value > 0:
        return float(value), True
    value = measure()
    if value:
        data = _read(path)  # another process may have added its entries meanwhile
        data.setdefault(section, {})[key] = value
        with contextlib.suppress(OSError):  # a read-only home: measured again next time
            _write(path, data)
    return value, False


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(data, file, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
