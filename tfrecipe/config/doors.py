"""The door inventory: every config key and file that reaches import, instantiation, a shell,
the environment, a file opened or a path written, and the one check that guards it.

A door is where data (a recipe, a run dir, a sweep's params, a file read) could turn into code
that runs, a file written elsewhere, a secret sent away or memory exhausted.
tests/trust/test_doors.py holds this table to the code: it imports each door's guard, tries a
payload through each door, fails when a config key whose name says it reaches one of these sinks
has no entry here, and fails when a module writes files, imports by name, starts programs or
changes the environment outside the places listed in `SINK_SITES`. tests/trust/test_door_sweep.py
finds the keys that take free text from the composed configs and fails when one has no entry
here; docs/security.md's table is its report. A new key or file that reaches a sink joins this
table in the same commit.
"""

from __future__ import annotations

import dataclasses
import fnmatch

# Where tfrecipe's own code writes, imports, starts programs or sets the environment outside the
# one writer (tests/trust/test_doors.py reads it here).
from tfrecipe.config.sink_sites import SINK_SITES as SINK_SITES

# What a door reaches.
IMPORT = "import"  # code imported or called by name
SHELL = "shell"  # a command line of a shell
ENV = "env"  # the environment of this process and its children
WRITE = "write"  # a path written
READ = "read"  # a path opened for reading
NETWORK = "network"  # data sent to another host
NAME = "name"  # text that becomes a path or a name on disk (a secret must not)
DATA = "data"  # a value handed to an allow-listed builder or library: never imported or run


@dataclasses.dataclass(frozen=True)
class Door:
    """One way in.

    Attributes:
      key: a config key (`*` for one name) or, for a file, `RUN_DIR/NAME` / `INPUT`.
      sink: what it reaches (IMPORT, SHELL, ENV, WRITE, READ, NETWORK, NAME).
      guard: the check every use goes through: its dotted name under `tfrecipe` first (which
        tests/trust/test_doors.py imports: a renamed or removed check fails there), then,
        after a space or a colon, what it checks.
      probes: the payloads tests/trust/test_doors.py tries through it ("code", "outside",
        "secret", "non_regular", "oversize").
    """

    key: str
    sink: str
    guard: str
    probes: tuple[str, ...] = ()


CONFIG_DOORS = (
    Door(
        "allowed_targets",
        IMPORT,
        "config.grants.allowed_prefix_problem: the command line's Trust only",
        ("code",),
    ),
    Door("model._target_", IMPORT, "config.instantiate.target_problem (kind MODEL)", ("code",)),
    Door("dataset._target_", IMPORT, "config.instantiate.target_problem (kind DATASET)", ("code",)),
    Door(
        "callbacks.extra.*._target_",
        IMPORT,
        "config.instantiate.target_problem (CALLBACK)",
        ("code",),
    ),
    Door("task.loss._target_", IMPORT, "config.instantiate.target_problem (kind LOSS)", ("code",)),
    Door(
        "task.metrics.*._target_",
        IMPORT,
        "config.instantiate.target_problem (kind METRIC)",
        ("code",),
    ),
    Door(
        "hydra.sweeper._target_",
        IMPORT,
        "config.instantiate.HYDRA_PLUGIN: HYDRA_PLUGIN kind, SWEEPER_KEYS",
        ("code",),
    ),
    Door(
        "hydra.launcher._target_",
        IMPORT,
        "config.instantiate.HYDRA_PLUGIN: HYDRA_PLUGIN kind",
        ("code",),
    ),
    Door(
        "hydra.sweeper.sampler._target_",
        IMPORT,
        "config.instantiate.OPTUNA_SAMPLER (kind OPTUNA_SAMPLER)",
    ),
    Door(
        "hydra.sweeper.custom_search_space",
        IMPORT,
        "config.hydra_node._search_space_problems",
        ("code",),
    ),
    Door("hydra.sweeper.params", IMPORT, "cli.sweeps.sweep_problems: every job checked", ("code",)),
    Door(
        "hydra.sweeper.search_space",
        IMPORT,
        "cli.sweeps._search_space_axis: expanded like params",
        ("code",),
    ),
    Door(
        "hydra.sweeper.storage",
        NETWORK,
        "config.hydra_node._storage_problems (sqlite or journal file; a server: command line "
        "only); config.hydra_keys.SWEEP_PATHS: a file outside the sweep dir, command line only",
    ),
    Door("hydra.sweeper.pruner", NAME, "tracking.optuna_trial.make_pruner: a fixed table of names"),
    Door("hydra.callbacks", IMPORT, "config.hydra_node._callback_problems (refused)", ("code",)),
    Door(
        "hydra.job_logging",
        WRITE,
        "config.hydra_node._logging_problems (.log in the run dir; no '.' setters or cfg://)",
        ("outside",),
    ),
    Door("hydra.hydra_logging", WRITE, "config.hydra_node._logging_problems", ("outside",)),
    Door("hydra.output_subdir", WRITE, "config.hydra_node._output_subdir_problems", ("outside",)),
    Door("hydra.job.env_set", ENV, "config.hydra_node._env_set_problems: SAFE_ENV only", ("code",)),
    Door("hydra.job.env_copy", NAME, "config.hydra_node._env_copy_problems (no secret's name)"),
    Door(
        "hydra.launcher.setup",
        SHELL,
        "config.hydra_node._launcher_shell_problems: command line only",
        ("code",),
    ),
    Door("hydra.launcher.srun_args", SHELL, "config.hydra_node._launcher_shell_problems"),
    Door(
        "hydra.launcher.additional_parameters", SHELL, "config.hydra_node._launcher_shell_problems"
    ),
    Door(
        "hydra.run.dir",
        WRITE,
        "cli.precheck._hold_run_dir (lock, fresh-dir check), secrets",
        ("secret",),
    ),
    Door(
        "hydra.sweep.dir",
        WRITE,
        "config.secrets.hydra_value_problems: no secret in a path Hydra writes; "
        "cli.precheck.claim_sweep_dir: no file of a sweep's record names that no sweep wrote",
        ("secret",),
    ),
    Door(
        "hydra.sweep.subdir",
        WRITE,
        "config.secrets.hydra_value_problems: no secret in a path Hydra writes",
    ),
    Door(
        "hydra.job.name",
        SHELL,
        "config.hydra_keys.hydra_key_problems: command line only (the sbatch job name, log "
        "names); config.secrets.hydra_value_problems: no secret",
    ),
    Door(
        "hydra.launcher.submitit_folder", WRITE, "config.hydra_keys.SWEEP_PATHS: in the sweep dir"
    ),
    Door("hydra.launcher.*", SHELL, "config.hydra_keys.INERT: numbers, flags, choices only"),
    Door("hydra.job.*", NAME, "config.hydra_keys.INERT: numbers, flags, choices only"),
    Door("hydra.sweeper.*", NAME, "config.hydra_keys.INERT: numbers, flags, choices only"),
    Door("pipeline.cache", WRITE, "config.checks.command_line_only_problems", ("outside",)),
    Door(
        "batching.compile_cache",
        IMPORT,
        "config.checks.command_line_only_problems: XLA loads programs from it; "
        "config.compile_cache.unsafe_folder: yours, not a link, nobody else may write it",
        ("outside",),
    ),
    Door("dataset.path", READ, "reading.open_file: data readers (regular files, size caps)"),
    Door("dataset.validation_path", READ, "reading.open_file: data readers"),
    Door("dataset.test_path", READ, "reading.open_file: data readers"),
    Door("dataset.train_files", READ, "reading.open_file: data readers"),
    Door("dataset.validation_files", READ, "reading.open_file: data readers"),
    Door("dataset.test_files", READ, "reading.open_file: data readers"),
    Door("dataset.data_dir", READ, "data.tfds.load: prepared data only, never downloads"),
    Door(
        "model.init_from",
        READ,
        "models.warm_start.init_from (a run dir, .keras or weights file)",
    ),
    Door("model.weights", READ, "models.keras_app.keras_app (imagenet, none or a weights file)"),
    Door("logger.wandb.project", NETWORK, "rundir.public_config: chief only, secrets redacted"),
    Door("logger.wandb.entity", NETWORK, "rundir.public_config: chief only, secrets redacted"),
    Door("logger.wandb.name", NAME, "config.secrets.redact_text: secrets redacted"),
    Door(
        "logger.mlflow.tracking_uri",
        NETWORK,
        "config.checks.command_line_only_problems",
        ("outside",),
    ),
    Door("logger.mlflow.run_name", NAME, "config.secrets.redact_text: secrets redacted"),
    Door(
        "export.name",
        WRITE,
        "config.export_limits.server_name_problem: one folder under RUN_DIR/exports/{serving,triton}",
        ("outside",),
    ),
    Door("resume", READ, "fault.recovery.candidates: a backup or run dir, read through reading"),
    Door("resume_allow_changes", DATA, "config.changes.changed_keys: key names compared"),
    Door("callbacks.early_stopping.monitor", DATA, "callbacks.build_callbacks: a metric's name"),
    Door("task.positive_class", DATA, "config.schema.validate: a label value, compared"),
    Door("strategy.device", DATA, "distribute.strategy: a TensorFlow device name (tf.device)"),
    Door("strategy.parameter_device", DATA, "distribute.strategy: a TensorFlow device name"),
    Door("strategy.tpu", NETWORK, "distribute.strategy: strategy=tpu, Cloud TPU's resolver"),
    Door("strategy.zone", NETWORK, "distribute.strategy: strategy=tpu, Cloud TPU's resolver"),
    # The rest of a section that an allow-listed target builds: its arguments, as values.
    Door("dataset.*", DATA, "config.instantiate.target_problem: the builder's argument, a value"),
    Door("model.*", DATA, "config.instantiate.target_problem: the builder's argument, a value"),
    Door("logger.wandb.*", NETWORK, "config.secrets.redact_config: sent to W&B, redacted"),
    Door("logger.mlflow.*", NETWORK, "config.secrets.redact_config: sent to MLflow, redacted"),
)

# What tfrecipe reads from the environment that decides where it connects or what it grants.
ENV_DOORS = (
    Door(
        "TFRECIPE_TRUST", IMPORT, "config.trust.Trust.of_this_process (never settable by a config)"
    ),
    Door(
        "TFRECIPE_K8S_*, JOB_COMPLETION_INDEX",
        NETWORK,
        "distribute.cluster.k8s_task: validated names",
    ),
    Door("TF_CONFIG", NETWORK, "distribute.cluster.check_environment"),
    Door(
        "MLFLOW_TRACKING_URI",
        NETWORK,
        "config.schema.environment_problems: your environment's choice, checked as "
        "logger.mlflow.tracking_uri is",
    ),
    Door(
        "TFRECIPE_SWEEP_KEYS",
        NAME,
        "tracking.hparams.hyperparameters: names of HParams keys only",
    ),
    Door(
        "TFRECIPE_SWEEP_STORAGE",
        NETWORK,
        "cli.optuna_study.storage_url: your environment's study storage",
    ),
    Door(
        "TFRECIPE_OPTUNA_TRIAL",
        NETWORK,
        "tracking.optuna_trial.TrialHandle.of_this_process: the sweeper's checked storage and trial (no config sets it)",
    ),
    Door("TFRECIPE_SWEEP_WORKER", NAME, "cli.optuna_workers.WORKER_ENV: a worker's number only"),
    Door("TFRECIPE_TYPED_SECRET_*", DATA, "config.secrets.typed_by_reference: a value"),
    Door(
        "TF_XLA_FLAGS",
        IMPORT,
        "perf.xla_cache.use: a cache folder it names is yours, kept as it is",
    ),
    Door(
        "TFRECIPE_PERF_CACHE, XDG_CACHE_HOME",
        WRITE,
        "files.write_atomic: through files.write_atomic",
    ),
)

# Files tfrecipe reads from a run dir or from the user, and what guards each.
FILE_DOORS = (
    Door(
        "RUN_DIR/config.yaml",
        IMPORT,
        "runs.RunDir.config: schema.validate with the command line's Trust only",
        ("non_regular",),
    ),
    Door("RUN_DIR/signature.json", READ, "signature.read", ("non_regular",)),
    Door(
        "RUN_DIR/model.keras",
        IMPORT,
        "reading.check_archive: zip sized before inflating; keras safe_mode",
        ("non_regular",),
    ),
    Door(
        "RUN_DIR/best.weights.h5",
        READ,
        "runs.TrainedModel.load: keras load_weights into the configured model (a resumed "
        "run's early stopping too: callbacks.EarlyStopping, in a run dir files.check_tree "
        "checked)",
    ),
    Door(
        "RUN_DIR/data_stats.json",
        READ,
        "data.tabular.StatsCache.get: fingerprint- and digest-checked",
    ),
    Door("RUN_DIR/summary.json", READ, "rundir.RunFiles.summary", ("non_regular",)),
    Door("RUN_DIR/history.csv", READ, "rundir.RunFiles.history: resumed epochs", ("non_regular",)),
    Door("RUN_DIR/members/*/summary.json", READ, "runs.RunDir.summary (ensemble.seeds: a member)"),
    Door(
        "RUN_DIR/members/*/model.keras",
        IMPORT,
        "training.ensemble.load: keras safe_mode load (ensemble members)",
    ),
    Door(
        "RUN_DIR/members/*/signature.json",
        READ,
        "runs.RunDir.signature (copied to the ensemble's)",
    ),
    Door("RUN_DIR/lr_find.png", WRITE, "files.write_atomic, a name tfrecipe chose"),
    Door("RUN_DIR/lr_find.csv", WRITE, "files.write_atomic, a name tfrecipe chose"),
    Door(
        "SWEEP_DIR/study.db",
        WRITE,
        "cli.optuna_study.storage_url: Optuna's sqlite file, the default name",
    ),
    Door("STUDY_FILE.trials/ID", WRITE, "cli.optuna_lease.lease_dir: lease files, by trial id"),
    Door("SWEEP_DIR/optimization_results.yaml", WRITE, "files.write_atomic, a name tfrecipe chose"),
    Door(
        "RUN_DIR/.tfrecipe-files",
        WRITE,
        "files.Manifest.owned: reading.read_text (16 MB); lists only paths inside the run dir",
        ("non_regular",),
    ),
    Door(
        "RUN_DIR/* (a received run dir)",
        WRITE,
        "files.check_tree when a run takes it (no link out, no FIFO/device); each write through files.write_atomic/write_weights/replace_with (best.weights.h5 from weights_file's thread)/open_log/library_dir (tests/trust/test_run_dir_writes.py)",
    ),
    Door("RUN_DIR/.hydra/config.pickle", IMPORT, "cli.precheck._refuse_rerun (never unpickled)"),
    Door("RUN_DIR/.hydra/overrides.yaml", READ, "reading.read_yaml (compare, sweep report)"),
    Door(
        "RUN_DIR/data_fingerprint.json",
        READ,
        "data.fingerprint.load: compared, never trusted",
        ("non_regular",),
    ),
    Door(
        "RUN_DIR/stall-TASK.txt",
        READ,
        "fault.watchdog.recorded_stalls: only a file the run's manifest lists; known fields, "
        "their types only",
        ("non_regular",),
    ),
    Door(
        "RUN_DIR/mlflow/run.json",
        NETWORK,
        "tracking.mlflow_store.read_record (reading, 1 MB): a run id; its URI unused",
        ("non_regular",),
    ),
    Door(
        "RUN_DIR/mlflow/local.db",
        NETWORK,
        "tracking.mlflow_store.check_local_store (a regular file, 4 GB); its run's artifact "
        "location confined beside it (confine_artifacts), else mlflow-sync and a resume refuse it",
        ("non_regular",),
    ),
    Door(
        "SWEEP_DIR/mlflow/parent.json",
        NETWORK,
        "tracking.mlflow_store.read_record: a run id only",
    ),
    Door(
        "SWEEP_DIR/sweep.json",
        READ,
        "cli.sweep_report.read_report (reading, 64 MB); compare rebuilds its command "
        "(printed.command_line) and escapes the rest (printed.printable)",
        ("non_regular",),
    ),
    Door(
        "RUN_DIR/wandb/run_id",
        NETWORK,
        "tracking.wandb_run.WandbTracker: reading.read_text, 4 KB",
    ),
    Door(
        "DATA_DIR/*/features.json (dataset=tfds)",
        IMPORT,
        "data.tfds._foreign_feature: TFDS' own feature classes only (TFDS imports the module of "
        "a class named there); read through reading",
    ),
    Door("INPUT (predict)", READ, "data.readers.open_sources"),
    Door("--output (predict)", WRITE, "files.check_output", ("outside",)),
    Door(
        "--name (export)",
        WRITE,
        "config.export_limits.server_name_problem: one folder, then the one writer",
    ),
    Door(
        "--host (serve)",
        NETWORK,
        "cli.serve.bind: 127.0.0.1 unless the command line names another (the start-up line says)",
    ),
    Door("--name (serve)", NAME, "config.export_limits.server_name_problem: a URL segment"),
    Door(
        "OVERRIDES (k8s)",
        NETWORK,
        "cli.k8s._secret_problems: no secret in the Job's pod args or the comment line",
    ),
    Door(
        "RUN_DIR (serve)",
        READ,
        "runs.RunDir.trained_model: the one reader; the server writes nothing; its curl line "
        "is built word by word (cli.serve.try_line: signature.json's column names quoted)",
    ),
    Door("RUN_DIR/MODEL_CARD.md", WRITE, "files.write_atomic, under runs.RunDir.lock (card)"),
)

# Keys whose last name reads like a sink, but which reach none: name -> why not a door.
NOT_DOORS = {
    "callbacks.early_stopping.restore_best_weights": "a flag",
    "cluster.name": "an option name (none, local, ...)",
    "dataset.column_names": "names of table columns",
    "dataset.images_checked_per_file": "a count",
    "dataset.name": "a TFDS or builder name, looked up in TFDS' registry",
    "hydra.help.app_name": "text of --help",
    "hydra.job.chdir": "a flag (false: the job stays in the current directory)",
    "logger.tensorboard.profile_batch": "batch numbers",
    "logger.wandb.log_every_n_steps": "a count",
    "logger.wandb.log_model": "a flag",
    "loop.name": "an option name",
    "model.name": "a keras.applications class name, checked against that module",
    "optimizer.name": "an option name",
    "strategy.name": "an option name",
    "strategy.project": "a Cloud TPU project name (tpu strategy), sent to Google's resolver",
    "task.name": "an option name",
    "baseline.name": "an option name (none | auto)",
}


def find(key: str) -> Door | None:
    """The config door `key` goes through (a key inside a door's node counts: hydra.job_logging's
    handlers are that door's)."""
    for door in CONFIG_DOORS:
        if fnmatch.fnmatchcase(key, door.key) or fnmatch.fnmatchcase(key, door.key + ".*"):
            return door
    return None
