"""Where tfrecipe's own code writes files, imports by name, starts programs or sets the
environment outside the one writer (tfrecipe/files.py), and why it may: part of the door
inventory (tfrecipe/config/doors.py re-exports it as `doors.SINK_SITES`;
tests/trust/test_doors.py holds the code to it)."""

from __future__ import annotations

from collections.abc import Mapping

# Where tfrecipe's own code writes files, imports by name, starts programs or sets the
# environment, outside the one writer (tfrecipe/files.py): module -> {call: why it may}.
SINK_SITES: Mapping[str, Mapping[str, str]] = {
    "tfrecipe/files.py": {"*": "the one writer"},
    "tfrecipe/__init__.py": {"importlib.import_module": "the package's lazy public names"},
    "tfrecipe/compat.py": {"importlib.import_module": "TensorFlow's private modules, by name"},
    "tfrecipe/config/instantiate.py": {"importlib.import_module": "targets that passed the check"},
    "tfrecipe/callbacks.py": {
        "keras.callbacks.TensorBoard": "its log_dir is files.library_dir(RUN_DIR/tensorboard)",
        "tf.summary.create_file_writer": "files.library_dir(RUN_DIR/tensorboard/train)",
        "self._writer.save": "best.weights.h5: weights_file checks it (files.check_writable) and "
        "writes it through files.replace_with",
    },
    "tfrecipe/cli/console.py": {
        "subprocess.Popen": "this Python isolated (-I -S) running the fixed _FILTER; no shell",
        "os.environ.*": "TF_CPP_MIN_LOG_LEVEL (a default, before TensorFlow loads)",
    },
    "tfrecipe/cli/commands.py": {
        "open(x)": "`tfrecipe cp`: a new file only (mode x), never over one",
        "Path(copy.name).unlink": "removes the half copy it made itself",
    },
    "tfrecipe/cli/main.py": {
        "os.environ.*": "TF_CPP_MIN_LOG_LEVEL (a default)",
        "os.environ[]=": "HYDRA_FULL_ERROR: Hydra's errors reach the one-line report",
        "os.open": "os.devnull, under a quiet stdout",
    },
    "tfrecipe/cli/precheck.py": {
        "os.environ.*": "the command line's Trust, for this process's jobs and a sweep's",
        "os.environ[]=": "the keys a sweep varies, for TensorBoard's HParams view",
    },
    "tfrecipe/cli/sweep_jobs.py": {
        "open(a)": "the sweep's job list, a temporary file it made itself",
        "tempfile.mkstemp": "that job list",
        "Path(path).unlink": "that job list",
        "os.environ.*": "that job list's name, for the jobs, removed after",
        "os.environ[]=": "the same",
    },
    "tfrecipe/cli/train_command.py": {
        "log_file.unlink": "an empty log Hydra made for a refused run",
        "job_dir / files.MANIFEST.unlink": "the manifest this invocation began, on a late refusal",
        "shutil.rmtree": "a run dir this invocation made and a config error discards",
        "os.environ.*": "the inherited Trust set aside; the sweep's keys removed after",
        "os.environ[]=": "the inherited Trust, restored",
        "typed_by_reference": "the secrets typed on this command line, into TFRECIPE_TYPED_SECRET_*",
    },
    "tfrecipe/cli/optuna_study.py": {
        "os.environ.*": "the running trial's handle (tracking.optuna_trial), removed after",
    },
    "tfrecipe/cli/optuna_workers.py": {"subprocess.*": "workers: tfrecipe_command(own argv)"},
    "tfrecipe/cli/optuna_lease.py": {
        "os.open": "a trial's empty lease file beside the study's file (O_NOFOLLOW)",
        "path.unlink": "that lease, once its trial was told (or its worker is gone)",
    },
    "tfrecipe/cli/export.py": {
        "shutil.rmtree": "a folder the failed export made itself (not there before it began)",
        "path.unlink": "a file the failed export wrote itself (not there before it began)",
    },
    "tfrecipe/cli/predict.py": {
        "open(?)": "the output, inside its scratch folder (files.put moves it)",
        "tempfile.mkdtemp": "that scratch folder",
        "shutil.rmtree": "that scratch folder",
    },
    "tfrecipe/distribute/cluster.py": {"os.environ.*": "GRPC_FAIL_FAST for parameter servers"},
    "tfrecipe/distribute/processes.py": {
        "subprocess.Popen": "the local cluster's tasks: this Python with -P (the current folder "
        "off the import path) -m tfrecipe, argv from launcher.task_argv, no shell",
        "tempfile.mkdtemp": "the tasks' logs",
        "shutil.rmtree": "those logs",
    },
    "tfrecipe/fault/backup.py": {
        "*.save": "tf.train.CheckpointManager in RUN_DIR/backup",
        "tf.train.CheckpointManager": "its directory is files.library_dir's (RUN_DIR/backup)",
    },
    "tfrecipe/fault/disk.py": {
        "os.open": "its own .reserve file: O_EXCL | O_NOFOLLOW, after removing one left there",
        "path.unlink": "its own .reserve file",
        "log_file.unlink": "an empty log Hydra made for a start the full disk stopped",
        "run_dir / RESERVE.unlink": "its own .reserve file",
        "shutil.rmtree": "a worker's scratch dir",
    },
    "tfrecipe/fault/preemption.py": {
        "*save": "PreemptionCheckpointHandler's checkpoint in RUN_DIR/backup",
        "tf.train.CheckpointManager": "an empty one, in its own mkdtemp folder",
        "os.environ.*": "TF_CONFIG for the handler, restored",
        "os.environ[]=": "the same",
        "tempfile.mkdtemp": "a worker's checkpoint dir",
        "shutil.rmtree": "that dir",
    },
    "tfrecipe/models/export.py": {
        "model.save": "into files.replace_with's scratch folder",
        "tempfile.mkdtemp": "a format's scratch folder (files.put moves the file)",
        "shutil.rmtree": "that scratch folder",
    },
    "tfrecipe/models/warm_start.py": {"model.save_weights": "a temporary file it reads back"},
    "tfrecipe/rundir.py": {"os.environ[]=": "the run dir's lock holder, for its tasks"},
    "tfrecipe/tracking/hparams.py": {
        "tf.summary.create_file_writer": "files.library_dir(RUN_DIR/tensorboard)",
    },
    "tfrecipe/perf/xla_cache.py": {
        "os.environ[]=": "TF_XLA_FLAGS: XLA's persistent cache folder (batching.compile_cache), "
        "added to the flags there; never one a TF_XLA_FLAGS of yours names already",
    },
    "tfrecipe/training/performance.py": {
        "tf.summary.create_file_writer": "files.library_dir(RUN_DIR/tensorboard/perf)",
    },
    "tfrecipe/tracking/mlflow_run.py": {
        "open(a)": "a lock file of its own in SWEEP_DIR/mlflow (nothing written to it)",
    },
    "tfrecipe/tracking/mlflow_store.py": {
        "os.environ.*": "MLflow's HTTP timeouts while it logs, restored",
    },
}
