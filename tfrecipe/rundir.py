"""What a run directory holds (`LAYOUT`, the one table of its names) and `RunFiles`, the readers
and writers of its own files: resolved config, summary, history, curves, the lock (the model:
models/export.py). `tfrecipe.runs.RunDir`, a `RunFiles`, is the object train() and the commands
open a run dir through.

Files are read through tfrecipe/reading.py and written through tfrecipe/files.py: to a temporary
name renamed into place, so a crash never leaves a half-written summary, history or model behind.
"""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import io
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tfrecipe import files, reading

# looks_secret and secret_values lived here: imports of them from this module keep working.
from tfrecipe.config.secrets import looks_secret, redact, redact_config, secret_values  # noqa: F401
from tfrecipe.errors import ConfigError

log = logging.getLogger("tfrecipe")

# Every name a run dir holds: name -> (its path inside the run dir, what it is). The modules
# that read or write one take its name from here.
LAYOUT: Mapping[str, tuple[str, str]] = {
    "config": ("config.yaml", "the resolved config that ran, secrets redacted"),
    "summary": ("summary.json", "how the run went and ended (RunSummary; record_status)"),
    "signature": ("signature.json", "what the model takes and what its outputs mean"),
    "history": ("history.csv", "one row per epoch, Keras' metric names as columns"),
    "curves": ("curves.png", "loss and the main metric per epoch"),
    "data_stats": ("data_stats.json", "a table's statistics pass, fingerprint-checked"),
    "fingerprint": ("data_fingerprint.json", "what the run trained on, for a resume"),
    "model": ("model.keras", "the exported model"),
    "best_weights": ("best.weights.h5", "the best epoch's weights (save_best_only)"),
    "steps": ("steps.csv", "the step clock's log (perf)"),
    "saved_model": ("saved_model", "the exported SavedModel (export.formats)"),
    "onnx": ("model.onnx", "the exported ONNX model (export.formats)"),
    "litert": ("model.tflite", "the exported LiteRT model (export.formats)"),
    "evaluation": ("evaluation.json", "`tfrecipe evaluate`'s result"),
    "traceback": ("traceback.txt", "a failed run's traceback, secrets redacted"),
    "backup": ("backup", "the chief's training-state backups, which every worker restores from"),
    "exports": ("exports", "`tfrecipe export`'s formats"),
    "members": ("members", "an ensemble's members, one run dir each (members/0, ...)"),
    "manifest": (files.MANIFEST, "the files tfrecipe wrote here (files.py: the one writer)"),
    "lock": (".", "an flock on the run dir itself: the process that trains into it"),
}
# What Hydra writes into the run dir's `hydra.output_subdir` (.hydra): the job's composed config,
# Hydra's own, and the command line's overrides.
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
CONFIG, SUMMARY, SIGNATURE, HISTORY, CURVES = (
    LAYOUT[name][0] for name in ("config", "summary", "signature", "history", "curves")
)
DATA_STATS, FINGERPRINT, MODEL, BEST_WEIGHTS, EVALUATION, TRACEBACK = (
    LAYOUT[name][0]
    for name in ("data_stats", "fingerprint", "model", "best_weights", "evaluation", "traceback")
)
BACKUP, EXPORTS, MEMBERS = (LAYOUT[name][0] for name in ("backup", "exports", "members"))
# What a run writes into its dir besides summary.json (written first): a dir holding one of these
# without a summary.json is not a tfrecipe run's, and its files are not tfrecipe's to replace.
RUN_FILES = tuple(
    LAYOUT[name][0]
    for name in LAYOUT
    if name not in ("summary", "fingerprint", "members", "manifest", "lock")
)


def public_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config without Hydra's node, secrets redacted: what may be saved, printed or
    sent to a tracker. A secret is a value under a key that looks like an API key, token or
    password, or any text holding a secret environment variable's value (`secret_values`)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra", None)
    return redact_config(resolved)


# "PID:RUN_DIR" of the process holding RUN_DIR's lock, for the processes it starts (the local
# launcher's workers train into the run dir their launcher holds).
LOCK_HOLDER_ENV = "TFRECIPE_RUN_DIR_LOCK"
_held: dict[Path, int] = {}  # run dir -> the descriptor whose flock this process holds


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """A run dir's own files (`LAYOUT`) and its lock: read through tfrecipe/reading.py, written
    through tfrecipe/files.py. `tfrecipe.runs.RunDir` adds what the commands and a training
    process need.

    Attributes:
      path: the run dir.
    """

    path: Path

    def file(self, name: str) -> Path:
        """The path of `name` (a key of `LAYOUT`: "summary", "config", ...) in this dir."""
        return self.path / LAYOUT[name][0]

    def write_config(self, config: Mapping[str, Any]) -> None:
        """The run's `public_config` (resolved: what actually ran), beside Hydra's `.hydra/`
        originals."""
        files.write_atomic(self.path / CONFIG, OmegaConf.to_yaml(dict(config)))

    # --- the lock: the one process that trains here ------------------------------------------
    def lock(self, *, command: str | None = None) -> None:
        """Makes this process the one that trains into this dir until it exits, creating it;
        `command` (evaluate, export, ...) names the command that writes there instead.

        An exclusive `flock` on the directory itself: no file is added, and the kernel releases
        it when the process ends in any way (even SIGKILL), so a preempted or crashed run's dir
        can be resumed at once. Nothing happens when this process, or its parent that started it
        to train there (the local launcher), already holds it.

        Raises:
          ConfigError: another process holds it ("run dir in use by PID ...").
        """
        run_dir = self.path.resolve()
        if run_dir in _held or os.environ.get(LOCK_HOLDER_ENV) == f"{os.getppid()}:{run_dir}":
            _own(run_dir)
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(run_dir, os.O_RDONLY)  # close-on-exec: not inherited by programs
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise ConfigError(_in_use(run_dir, command)) from None
        except OSError as error:  # a file system without locks (some network mounts)
            os.close(descriptor)
            log.warning(
                "cannot lock the run dir %s (%s): nothing stops a second run there", run_dir, error
            )
            return
        _held[run_dir] = descriptor
        os.environ[LOCK_HOLDER_ENV] = f"{os.getpid()}:{run_dir}"
        _own(run_dir)

    def in_use_by_another(self) -> bool:
        """Whether another process holds this dir's lock (not this one, nor the launcher that
        started this one to train there). Takes and gives back the lock to find out."""
        run_dir = self.path.resolve()
        if run_dir in _held or os.environ.get(LOCK_HOLDER_ENV) == f"{os.getppid()}:{run_dir}":
            return False
        try:
            descriptor = os.open(run_dir, os.O_RDONLY)
        except OSError:  # not there (yet): nobody trains in it
            return False
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # a file system without locks: nothing to tell
            return False
        finally:
            os.close(descriptor)  # closing gives back a lock taken here
        return False

    def held(self) -> bool:
        """Whether this process holds this dir's lock (`lock`)."""
        return self.path.resolve() in _held

    def unlock(self) -> None:
        """Gives back this dir's lock, for `train()` in a process that goes on (a sweep's
        jobs, a notebook); a no-op when this process does not hold it."""
        run_dir = self.path.resolve()
        descriptor = _held.pop(run_dir, None)
        if descriptor is None:
            return
        files.Manifest.of(run_dir).release()  # its writes finished, before another may take it
        os.close(descriptor)  # its only descriptor: closing it releases the flock
        if os.environ.get(LOCK_HOLDER_ENV) == f"{os.getpid()}:{run_dir}":
            del os.environ[LOCK_HOLDER_ENV]

    # --- summary.json: how the run went and ended ----------------------------------------------
    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """summary.json, secret values redacted (an error message may quote one)."""
        text = json.dumps(redact(summary), indent=2, sort_keys=False) + "\n"
        files.write_atomic(self.path / SUMMARY, text)

    def record_status(
        self, status: str, error: str, *, fields: Mapping[str, Any] | None = None, **more: Any
    ) -> None:
        """How a run ended, in summary.json, where nothing else can say it (a failure before
        or outside training, a stall, a killed chief): `fields` (None: the summary the dir
        holds, or none) with its `status`, `error` and `more`. A run that trains says it
        through `training.summary.RunSummary.finish`."""
        summary = dict((self.summary() or {}) if fields is None else fields)
        summary.update(status=status, error=error, **more)
        self.write_summary(summary)

    def summary(self) -> dict[str, Any] | None:
        """summary.json's fields; None where there is none or it cannot be read as one."""
        try:
            summary = reading.read_json(self.path / SUMMARY)
        except (OSError, UnicodeDecodeError, ValueError):  # reading.UnreadableFile: a ValueError
            return None
        return summary if isinstance(summary, dict) else None

    # --- history.csv and curves.png: the epochs ------------------------------------------------
    def write_history(self, rows: Sequence[Mapping[str, float]]) -> None:
        """history.csv: one row per epoch with Keras' metric names as columns (blank where an
        epoch had no validation)."""
        names = list(dict.fromkeys(k for row in rows for k in row))
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)
        files.write_atomic(self.path / HISTORY, out.getvalue())

    def history(self) -> list[dict[str, float]]:
        """history.csv's rows (what `write_history` wrote; blanks left out), [] when there is
        none. Read through tfrecipe/reading.py (a regular file of a history's size): a resumed
        run's dir may have been received from someone else.

        Raises:
          reading.UnreadableFile: it is not a regular file, or too large for one.
        """
        path = self.path / HISTORY
        if not os.path.lexists(path):
            return []
        text = reading.read_text(path, limit=reading.MAX_JSON_BYTES, what=f"a run's {HISTORY}")
        rows = []
        for row in csv.DictReader(io.StringIO(text)):
            parsed = {k: float(v) for k, v in row.items() if v not in ("", None)}
            if "epoch" in parsed:
                parsed["epoch"] = int(parsed["epoch"])
            rows.append(parsed)
        return rows

    def plot_curves(self, rows: Sequence[Mapping[str, float]], metric: str = "accuracy") -> None:
        """curves.png: loss and the task's main `metric` per epoch, training and validation.

        Draws on a bare `Figure` (no pyplot: its global state is not thread-safe, and it costs
        an import), so it can run beside the test evaluation (`plot_curves_in_background`)."""
        files.write_atomic(self.path / CURVES, _curves_png(rows, metric))

    def plot_curves_in_background(
        self, rows: Sequence[Mapping[str, float]], metric: str = "accuracy"
    ):
        """Starts `plot_curves` on a copy of `rows` in a thread (TensorFlow's evaluation and
        export leave the interpreter free); returns the thread to join before the run reports
        done."""
        import threading

        rows = [dict(row) for row in rows]

        def plot() -> None:
            try:
                self.plot_curves(rows, metric)
            except OSError as error:  # a full disk: the run reports it where it writes next
                log.warning("curves.png not written: %s", error)

        thread = threading.Thread(target=plot, name="plot_curves")
        thread.start()
        return thread


def _own(run_dir: Path) -> None:
    """The held dir's files are the run's to write (tfrecipe/files.py's manifest); a run dir of
    an earlier version (a summary, no manifest) has its files adopted. A dir holding a link that
    leads out of it is refused first (a received run dir: files.check_tree)."""
    files.check_tree(run_dir)
    files.Manifest.of(run_dir).own(adopt=(run_dir / SUMMARY).exists())


def _in_use(run_dir: Path, command: str | None) -> str:
    """The line for a dir another process holds: to a run training there, or to a command."""
    holder = _lock_holder(run_dir)
    if command is None:
        return (
            f"hydra.run.dir={run_dir}: run dir in use by PID {holder} (another run trains into "
            "it); wait for it to end, or choose another hydra.run.dir"
        )
    return (
        f"{command}: RUN_DIR={run_dir}: run dir in use by PID {holder} (a run training there, or "
        "a command writing its files); wait for it to end, then run this again"
    )


def _lock_holder(run_dir: Path) -> str:
    """The PID holding `run_dir`'s flock, from /proc/locks (Linux); "unknown" elsewhere."""
    stat = os.stat(run_dir)
    where = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return "unknown"
    for fields in (line.split() for line in lines):
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146483 0 EOF" (waiters have a "->" field)
        if len(fields) == 8 and fields[1] == "FLOCK" and fields[5] == where:
            return fields[4]
    return "unknown"


def summary_value(summary: Mapping[str, Any], name: str) -> float | None:
    """A number from a summary by the names sweeps and `compare` use: `test_X` is the test split's
    X, a final metric (`loss`, `val_accuracy`, ...) by its Keras name, else a top-level field
    (`examples_per_sec`, `wall_time_s`, ...). None when the run has no such number."""
    if name.startswith("test_"):
        value = (summary.get("test") or {}).get(name.removeprefix("test_"))
    else:
        value = (summary.get("metrics") or {}).get(name, summary.get(name))
    return float(value) if isinstance(value, int | float) else None


def _curves_png(rows: Sequence[Mapping[str, float]], metric: str) -> bytes:
    """curves.png's bytes: loss and `metric` per epoch, training and validation."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    for ax, shown in zip(axes, ("loss", metric), strict=True):
        for name, style in ((shown, "-"), (f"val_{shown}", "--")):
            points = [(row["epoch"], row[name]) for row in rows if row.get(name) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), style, marker="o", label=name)
        ax.set_xlabel("epoch")
        ax.set_title(shown)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
