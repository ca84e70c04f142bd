"""What measuring a run's performance keeps per machine: the CPU's matmul peak per dtype and the
FLOPs of each model's training step. One JSON file under the user's cache dir (or the file
`TFRECIPE_PERF_CACHE` names: the test suite shares one per session), written atomically through
the one writer. Only a file this cache wrote is replaced: a folder, a link, `/dev/null` or
another program's file at that path is left as it is, and a cache that cannot be written costs a
warning (measured again next time), never the run."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "TFRECIPE_PERF_CACHE"
log = logging.getLogger(__name__)
# What the cache keeps: the matmul peaks (perf.peak) and models' FLOPs per step (perf.flops).
SECTIONS = frozenset({"peak", "flops"})
# A cached value a run beat is measured again, but not within this long of its last measuring:
# on a busy machine runs beat a peak often, and each calibration costs seconds.
RECHECK_AFTER_S = 3600


def cache_path() -> Path:
    named = os.environ.get(CACHE_ENV)
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tfrecipe" / "perf.json"


def remembered(
    section: str, key: str, measure: Callable[[], float | None], *, at_least: float = 0.0
) -> tuple[float | None, bool]:
    """`measure()`'s value for `key`, from the cache when it has one above `at_least`:
    (value, from_cache). Below it (a peak measured while the machine was busy, which a run
    then beat) it is measured again and the larger value kept."""
    assert section in SECTIONS, section  # a new section joins SECTIONS (what _is_cache owns)
    path = cache_path()
    entries = _read(path).get(section, {})
    value = entries.get(key)
    if isinstance(value, int | float) and value > 0:
        checked = entries.get(f"{key}@checked", 0)
        recent = isinstance(checked, int | float) and time.time() - checked < RECHECK_AFTER_S
        if value >= at_least or recent:  # on a busy machine: at most once an hour
            return float(value), True
    old = value if isinstance(value, int | float) else 0.0
    value = measure()
    if value:
        value = max(value, old)
        data = _read(path)  # another process may have added its entries meanwhile
        data.setdefault(section, {})[key] = value
        data[section][f"{key}@checked"] = time.time()
        _write(path, data)
    return value, False


def _read(path: Path) -> dict:
    from tfrecipe import reading

    try:
        data = reading.read_json(path, what="the perf cache")
    except (OSError, ValueError):  # absent, damaged or not a regular file: measured again
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    """Through the one writer, over nothing or over this cache's own file; a warning (once per
    process and path) when it cannot be written."""
    from tfrecipe import files

    try:
        files.write_cache(path, json.dumps(data, indent=1, sort_keys=True), is_ours=_is_cache)
    except (OSError, files.NotOurs) as error:
        if str(path) not in _WARNED:
            _WARNED.add(str(path))
            log.warning("the perf cache was not written (%s); measured again next run", error)


_WARNED: set[str] = set()


def _is_cache(content: bytes) -> bool:
    """Whether `content` is a perf cache: a JSON object of `SECTIONS`, each an object."""
    try:
        data = json.loads(content)
    except ValueError:
        return False
    return (
        isinstance(data, dict)
        and set(data) <= SECTIONS
        and all(isinstance(v, dict) for v in data.values())
    )
