"""Reads the records of an offline W&B run file (`run-ID.wandb`), for tests.

W&B (0.31) has no public reader for its transaction log. The format is LevelDB's log format
behind a 7-byte header (":W&B", magic 0xBEE1, version): 32 KiB blocks of records, each
`crc32 (4) | length (2, little-endian) | type (1: full, 2: first, 3: middle, 4: last)`,
whose payloads are `wandb_internal_pb2.Record` protobufs.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2

_HEADER = 7
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def keep_local(monkeypatch, tmp_path: Path) -> None:
    """W&B quiet, its cache and settings in the test's own folder (not the user's home)."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    if len(data) < _HEADER:  # just created
        return []
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pending, offset = [], b"", _HEADER
    while offset + 7 <= len(data):
        if _BLOCK - offset % _BLOCK < 7:  # block trailer: padding
            offset += _BLOCK - offset % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        if offset + 7 + length > len(data):  # still being written
            break
        payload = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            break
        pending = payload if kind in (_FULL, _FIRST) else pending + payload
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def run_file(run_dir: Path, timeout: float = 60.0) -> Path:
    """The run's file, once W&B's service process has written all of it (its exit record): the
    service writes asynchronously, and on a loaded machine it can lag behind `run.finish()`."""
    deadline = time.monotonic() + timeout
    while True:
        paths = list(run_dir.glob("wandb/*-run-*/run-*.wandb"))
        if len(paths) == 1 and any(
            r.WhichOneof("record_type") == "exit" for r in records(paths[0])
        ):
            return paths[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no complete W&B run file under {run_dir}: {paths}")
        time.sleep(0.2)


def config(run_dir: Path) -> dict:
    values = {}
    for record in records(run_file(run_dir)):
        if record.WhichOneof("record_type") == "config":
            values |= {u.key: json.loads(u.value_json) for u in record.config.update}
        if record.WhichOneof("record_type") == "run":
            values |= {u.key: json.loads(u.value_json) for u in record.run.config.update}
    return values


def summary(run_dir: Path) -> dict:
    values = {}
    for record in records(run_file(run_dir)):
        if record.WhichOneof("record_type") == "summary":
            for update in record.summary.update:
                values[update.key or "/".join(update.nested_key)] = json.loads(update.value_json)
    return values


def history(run_dir: Path) -> list[dict]:
    """One dict per `wandb.log` call, in order."""
    return [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in r.history.item
        }
        for r in records(run_file(run_dir))
        if r.WhichOneof("record_type") == "history"
    ]


def tags(run_dir: Path) -> list[str]:
    """The run's tags as last set (at its start, or later by `run.tags = ...`)."""
    runs = [r.run for r in records(run_file(run_dir)) if r.WhichOneof("record_type") == "run"]
    return list(runs[-1].tags) if runs else []


def exit_code(run_dir: Path) -> int | None:
    codes = [
        r.exit.exit_code
        for r in records(run_file(run_dir))
        if r.WhichOneof("record_type") == "exit"
    ]
    return codes[-1] if codes else None
