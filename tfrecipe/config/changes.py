"""A resumed run continues the run its dir holds, so its config must be that run's.

Resuming with another dataset would mix two datasets into one model without a word, another model
fails to restore half-way, another batch size or seed reads the input from the wrong position. So
`resume=auto` compares the composed config with the run dir's `config.yaml` and refuses any
difference (exit 2, naming the keys), except:

- what changes how long a run trains, what it prints and logs, and how it saves and restarts
  (`RESUMABLE`): a preempted run may get more epochs, a quieter console or another W&B name;
- the keys the command line names in `resume_allow_changes=[KEY, ...]` (a key allows itself and
  every key under it), for changes the user knows are safe, e.g. `dataset.data_dir` on another
  machine.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tfrecipe import reading, rundir
from tfrecipe.errors import ConfigError

# Keys a resumed run may change without saying so: none changes what the saved state means.
RESUMABLE = (
    "loop.epochs",  # train on for longer (or stop sooner)
    "loop.verbose",
    "loop.validation_freq",
    "logger",
    "callbacks.progress",
    "callbacks.backup",
    "callbacks.export",
    "callbacks.early_stopping",  # when to stop, not what the saved state is
    "callbacks.extra",  # the user's callbacks: e.g. one that failed, removed to resume
    # How the processes start and find each other: the local launcher's workers record
    # cluster=tf_config for the user's cluster=local, and restarts/requeues may come from either.
    "cluster",
    "sweep",
    "resume",
    "resume_allow_changes",
    "allowed_targets",  # what may be imported, not what is trained
    "model.init_from",  # a resumed run restores its own backup, never init_from
    "baseline",  # fitted beside the model, from the data alone
    "loop.lr_find",  # a sweep whose model is put back: the saved state means the same
    # where XLA keeps compiled programs (another machine's folder; absent from older runs)
    "batching.compile_cache",
)

_SHOWN = 4  # changed keys named in the one line (and how many more)


@dataclasses.dataclass(frozen=True)
class Resuming:
    """How a run continues the run its dir holds: `resume` ("auto", "never", ...) and the keys
    it may change (`resume_allow_changes`: each allows itself and every key under it), which
    always travel together.

    Attributes:
      mode: the config's `resume`.
      allow_changes: the config's `resume_allow_changes`.
    """

    mode: str = "auto"
    allow_changes: tuple[str, ...] = ()

    @classmethod
    def of(cls, run) -> Resuming:
        """The `resume` and `resume_allow_changes` of a validated config (schema.RunConfig)."""
        return cls(run.resume, tuple(run.resume_allow_changes))


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` as `{"a.b": 1}`; lists stay values (a list changes as a whole)."""
    if not isinstance(node, Mapping) or (prefix and not node):
        return {prefix: node}
    items: dict[str, Any] = {}
    for key, value in node.items():
        items.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return items


def changed_keys(saved: Mapping, now: Mapping, resuming: Resuming = Resuming()) -> list[str]:
    """The dotted keys whose values differ (or that only one side has), except those under a
    RESUMABLE key or one `resuming` allows to change."""
    before, after = flat(saved), flat(now)
    accepted = (*RESUMABLE, *resuming.allow_changes)
    return [
        key
        for key in sorted(before.keys() | after.keys())
        if before.get(key, _ABSENT) != after.get(key, _ABSENT)
        and not any(key == a or key.startswith(f"{a}.") for a in accepted)
    ]


_ABSENT = object()


def check_resume_unchanged(
    run_dir: Path, config: Mapping, resuming: Resuming, *, remedy: str | None = None
) -> None:
    """Refuses to continue the run in `run_dir` with a config that differs from its
    `config.yaml` (see the module's docstring); `config` is the public config this run would
    save (`rundir.public_config`). Nothing to compare: a new dir, `resume=never`. `remedy`: what
    to do instead of a new hydra.run.dir or allowing the changes (a sweep's finished job).

    Raises:
      ConfigError: one line naming the changed keys and how to accept them.
    """
    path = run_dir / rundir.CONFIG
    resume = resuming.mode
    if resume == "never" or not (run_dir / rundir.SUMMARY).is_file() or not path.is_file():
        return
    try:  # the run dir's file: data, read through the reader (a regular file, YAML)
        saved = OmegaConf.to_container(reading.read_yaml(path, what="a run's config.yaml"))
    except reading.UnreadableFile as error:
        raise ConfigError(f"resume: {error}") from None
    changed = changed_keys(saved, config, resuming)
    if not changed:
        return
    before, after = flat(saved), flat(config)
    # Another builder (`X._target_`) first: it says what changed, and `X` covers its options.
    swapped = [k.removesuffix("._target_") for k in changed if k.endswith("._target_")]
    changed.sort(key=lambda k: not k.endswith("._target_"))
    shown = [
        f"{k} ({_show(before.get(k, _ABSENT))} -> {_show(after.get(k, _ABSENT))})"
        for k in changed[:_SHOWN]
    ]
    more = f" and {len(changed) - _SHOWN} more" if len(changed) > _SHOWN else ""
    keys = swapped + [k for k in changed if not any(k.startswith(f"{s}.") for s in swapped)]
    allow = f"resume_allow_changes=[{','.join(keys)}]"
    raise ConfigError(
        f"resume={resume}: hydra.run.dir={run_dir} holds a run started with another config; "
        f"changed: {', '.join(shown)}{more}. "
        + (remedy or f"Choose a new hydra.run.dir for a new run, or continue this one with {allow}")
    )


def _show(value: Any) -> str:
    return "unset" if value is _ABSENT else repr(value)


def _job_files_subdir(*, _root_: DictConfig) -> str | None:
    """`hydra.output_subdir` (conf/config.yaml): where Hydra saves a job's config files, `.hydra`,
    or None (Hydra saves none) where the job will be refused (`_refused_in`). Hydra saves them
    before the job runs, so a sweep job refused then would overwrite that run's record (its
    overrides, which the sweep's report and `tfrecipe compare` read)."""
    from hydra.core.hydra_config import HydraConfig

    # unset outside a job (--cfg hydra --resolve)
    hydra = HydraConfig.get() if HydraConfig.initialized() else None
    output_dir = OmegaConf.select(hydra, "runtime.output_dir", default=None) if hydra else None
    return None if output_dir and _refused_in(Path(output_dir), _root_) else ".hydra"


def _refused_in(run_dir: Path, cfg: DictConfig) -> bool:
    """Whether the job of `cfg` (with Hydra's node) will be refused in `run_dir`: another
    process trains there, or it holds a run of another config; a finished one is compared as a
    sweep rerun compares it before skipping it, with no change allowed (cli.job)."""
    from tfrecipe.outcome import FINISHED

    held = rundir.RunFiles(run_dir)
    if held.in_use_by_another():
        return True
    summary = held.summary()
    if summary is None:  # a new dir, or a summary.json that cannot be read (the job refuses it)
        return os.path.lexists(run_dir / rundir.SUMMARY)
    job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    try:
        config = rundir.public_config(job)
    except Exception:  # the job reports its own bad interpolation
        return False
    allowed = OmegaConf.select(job, "resume_allow_changes", default=None) or ()
    resuming = Resuming(str(OmegaConf.select(job, "resume", default="auto")), tuple(allowed))
    try:
        check_resume_unchanged(
            run_dir, config, Resuming() if summary.get("status") in FINISHED else resuming
        )
    except ConfigError:
        return True
    return False


# Registered wherever a config is composed or a job runs (every process imports this module
# before Hydra resolves `hydra.output_subdir`: the command line, joblib and submitit workers).
OmegaConf.register_new_resolver("tfrecipe_job_files", _job_files_subdir, replace=True)
