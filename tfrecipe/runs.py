"""`RunDir`: one run directory as one object, for train() and every command that opens a run.

What a run dir holds is named once, in `tfrecipe.rundir.LAYOUT`; each file is read through
tfrecipe/reading.py and written through tfrecipe/files.py. A `RunDir` adds what a reader of a
finished run needs (its validated config, summary, final status, history, signature, lock) and
what a training process needs (the chief's dir beside a worker's scratch dir, the resume checks,
the statistics cache, the records of what the run trains on, the stall watchdog).

A run dir may have been received from someone else: its files are data. Its config.yaml grants
nothing; only this invocation's command line does (`Trust`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfrecipe import reading, rundir, signature
from tfrecipe.errors import ConfigError

if TYPE_CHECKING:
    from tfrecipe.config import schema
    from tfrecipe.config.changes import Resuming
    from tfrecipe.config.trust import Trust
    from tfrecipe.data.tabular import StatsCache
    from tfrecipe.distribute import cluster
    from tfrecipe.fault import watchdog


# `--model` of predict and export: the files each choice loads (best: its weights into the
# final model's architecture).
MODEL_FILES = {"final": rundir.MODEL, "best": rundir.BEST_WEIGHTS}


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """What a run dir holds for predictions and exports, every file checked."""

    signature: dict[str, Any]
    dataset: dict[str, Any]  # the run's `dataset` config (how its files were read)
    model_files: tuple[Path, ...]  # model.keras, then best.weights.h5 for --model best

    def load(self, *, command: str = "predict"):
        """The run's model, uncompiled (its files were checked: regular, sizes known before
        Keras inflates them).

        Raises:
          ConfigError: one line naming the file Keras cannot load (a damaged archive, layers
            this version does not know, weights of another model).
        """
        import keras

        from tfrecipe import compat
        from tfrecipe.models.build import register_custom_objects

        compat.cache_saving_skipsets()  # each load walks every layer and metric: ~20% of one
        register_custom_objects()
        path = self.model_files[0]
        try:
            model = keras.saving.load_model(path, compile=False)
            if len(self.model_files) > 1:  # the best epoch's weights in the final architecture
                path = self.model_files[1]
                model.load_weights(path)
        except Exception as error:  # zipfile's, h5py's, Keras' own: all say "cannot be loaded"
            raise ConfigError(
                f"{command}: {path} cannot be loaded ({reading.first_line(error)}); is it this "
                "run's model, written by this version of tfrecipe?"
            ) from None
        return model


@dataclasses.dataclass(frozen=True)
class RunDir(rundir.RunFiles):
    """A run directory: its files and lock (`rundir.RunFiles`), and what commands and a
    training process read and check there.

    Attributes:
      path: where this process writes: the run dir itself on the chief (and for a finished run),
        a scratch dir on another worker of a cluster.
      shared: the chief's run dir, which every worker restores its backups from.
    """

    shared: Path

    @classmethod
    def at(cls, path: str | os.PathLike) -> RunDir:
        """The run dir `path`, as its chief (or a command reading a finished run) opens it."""
        return cls(Path(path), Path(path))

    def member(self, index: int) -> RunDir:
        """Ensemble member `index`'s run dir (RUN_DIR/members/INDEX)."""
        return RunDir.at(self.path / rundir.MEMBERS / str(index))

    @property
    def chief(self) -> bool:
        return self.path == self.shared

    @property
    def backup_dir(self) -> Path:
        return self.shared / rundir.BACKUP  # every worker reads the chief's

    # --- a finished run, as the commands read it -----------------------------------------------
    def config(
        self, overrides: list[str], *, command: str, trust: Trust | None = None
    ) -> schema.RunConfig:
        """The run's resolved config (config.yaml) with `overrides`, validated. Its config.yaml
        grants nothing: `trust` (None: what the `overrides` of this command line grant) does.

        Raises:
          ConfigError: one line naming `command` (`evaluate`, `export`, `baseline`): no
            config.yaml, an override that is not key=value or does not apply, an unreadable or
            damaged file, or a config that does not validate.
        """
        from omegaconf import DictConfig, OmegaConf

        from tfrecipe.config import schema
        from tfrecipe.config.trust import Trust

        path = self.file("config")
        if not os.path.lexists(path):
            raise ConfigError(
                f"{command}: {self.path} holds no {rundir.CONFIG} (is it a tfrecipe run dir?)"
            )
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ConfigError(f"{command}: expected key=value overrides, received {' '.join(bad)}")
        try:  # a regular file of a config's size, then YAML: one line for either
            saved = reading.read_yaml(path, what="a run's config.yaml")
        except reading.UnreadableFile as error:
            raise ConfigError(f"{command}: {error}") from None
        if not isinstance(saved, DictConfig):
            raise ConfigError(
                f"{command}: {path} holds no mapping of keys (a tfrecipe run's config)"
            )
        try:
            cfg = OmegaConf.merge(saved, OmegaConf.from_dotlist(overrides))
        except Exception as error:
            raise ConfigError(
                f"{command}: overrides {' '.join(overrides)} do not apply "
                f"({reading.first_line(error)})"
            ) from None
        return schema.validate(cfg, trust=trust or Trust.from_command_line(overrides))

    def plain_config(self) -> dict[str, Any]:
        """The run's resolved config as plain data, not validated (`predict` reads only its
        `dataset`: how the run's files were read).

        Raises:
          reading.UnreadableFile: none there, unreadable, or no mapping with a `dataset` mapping.
        """
        from omegaconf import OmegaConf

        path = self.file("config")
        try:
            config = reading.read_yaml(path, what="a run's config.yaml")
        except FileNotFoundError:
            raise reading.UnreadableFile(
                f"{path}: no such file; a tfrecipe run dir holds the config it ran"
            ) from None
        container = OmegaConf.to_container(config) if config is not None else None
        dataset = container.get("dataset", {}) if isinstance(container, dict) else None
        if not isinstance(dataset, dict):
            raise reading.UnreadableFile(
                f"{path}: holds no mapping of keys with a `dataset` mapping (a tfrecipe run's "
                "config)"
            )
        return container

    def trained_model(self, which: str, *, command: str = "predict") -> TrainedModel:
        """What this dir holds for predictions (`which`: a key of MODEL_FILES), every file read
        or checked through `tfrecipe.reading` before anything loads it.

        Raises:
          ConfigError: one line naming `command`: no run dir, no or a damaged signature.json or
            config.yaml, a model file missing, not a regular file or an archive that would
            inflate too far.
        """
        if not self.path.is_dir():
            raise ConfigError(f"{command}: RUN_DIR={self.path}: not a directory")
        try:
            record = self.signature()
        except reading.UnreadableFile as error:
            raise ConfigError(f"{command}: {error}") from None
        if record is None:
            raise ConfigError(
                f"{command}: RUN_DIR={self.path}: holds no {rundir.SIGNATURE} (a run trained by "
                "this version of tfrecipe writes it when training starts)"
            )
        paths = [self.path / MODEL_FILES["final"]]
        if which == "best":
            paths.append(self.path / MODEL_FILES["best"])
        for path in paths:
            if not os.path.lexists(path):
                raise ConfigError(
                    f"{command}: --model={which}: {path} does not exist (model.keras is written "
                    "when a run completes; best.weights.h5 by callbacks.model_checkpoint)"
                )
        try:
            reading.check_archive(paths[0], what=rundir.MODEL)  # sized before Keras inflates it
            for path in paths[1:]:
                reading.check_file(path, limit=reading.MAX_INFLATED_BYTES, what="a weights file")
            config = self.plain_config()
        except reading.UnreadableFile as error:
            raise ConfigError(f"{command}: {error}") from None
        return TrainedModel(record, config.get("dataset", {}), tuple(paths))

    def status(self) -> str | None:
        """How the run ended ("completed", "failed", "preempted", ...), or "running"; None
        without a summary."""
        status = (self.summary() or {}).get("status")
        return status if isinstance(status, str) else None

    def signature(self) -> dict[str, Any] | None:
        """signature.json (what the model takes, what its outputs mean); None when absent."""
        return signature.read(self)

    # --- a run in training -------------------------------------------------------------------
    def stats_cache(self) -> StatsCache:
        """The table statistics: the chief computes them, the others wait for its."""
        from tfrecipe.data.tabular import STATS_WAIT_S, StatsCache

        return StatsCache(self.shared, chief=self.chief, wait_s=0 if self.chief else STATS_WAIT_S)

    def claim(self, config: Mapping[str, Any], resuming: Resuming) -> None:
        """Locks the chief's run dir when it exists (another run may train there), then checks
        it holds no run this one must not continue, nor one it would continue differently."""
        from tfrecipe.config.changes import check_resume_unchanged
        from tfrecipe.outcome import ensure_fresh_run_dir

        if self.chief and self.path.exists():
            self.lock()
        ensure_fresh_run_dir(self.path, resume=resuming.mode)
        check_resume_unchanged(self.path, config, resuming)

    def check_batch(self, *, global_batch: int, num_replicas: int) -> None:
        """A resumed run continues at the global batch it trained at (`check_resume_batch`)."""
        from tfrecipe.outcome import check_resume_batch

        shared = rundir.RunFiles(self.shared)
        check_resume_batch(shared, global_batch=global_batch, num_replicas=num_replicas)

    def check_data(self, dataset: schema.Target, resuming: Resuming):
        """What the run trains on (the chief's record), taken first: a resume on other data
        is refused."""
        from tfrecipe.data import fingerprint

        if not self.chief:
            return None
        node = dataset.model_dump(by_alias=True)
        return fingerprint.check_resumed(self, node, resuming)

    def record_inputs(self, signature_fields: Mapping[str, Any], data_files) -> None:
        """What predictions need (signature.json) and what the run trained on (the chief)."""
        from tfrecipe.data import fingerprint

        if self.chief:
            signature.write(self, signature_fields)
            fingerprint.record(self, data_files)

    def earlier_stalls(self) -> list[dict[str, Any]]:
        """The stalls of earlier starts of this run (their stack files, summary.json)."""
        from tfrecipe.fault import watchdog

        if not self.chief:
            return []
        return watchdog.recorded_stalls(self, (self.summary() or {}).get("stalls"))

    def stall_watchdog(
        self, stall_timeout: float | None, task: cluster.Task
    ) -> watchdog.StallWatchdog | None:
        """The progress watchdog (`cluster.stall_timeout`), when it is on: stack files go to the
        chief's run dir."""
        from tfrecipe.fault import watchdog

        return watchdog.build_watchdog(
            stall_timeout,
            task=f"{task.type}-{task.index}" if task.type is not None else None,
            home=rundir.RunFiles(self.shared),
            chief=self.chief,
        )
