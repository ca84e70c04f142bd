"""The door inventory (tfrecipe/config/doors.py) holds: a payload through each door is refused,
a config key that reads like a sink has an entry, and code that writes, imports by name, starts
programs or changes the environment does so only where the inventory says."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import re
import textwrap

import pytest
from conftest import REPO
from omegaconf import OmegaConf

from tfrecipe.config import doors
from tfrecipe.errors import ConfigError

# --- every key that reads like a sink is a door, or says why not ----------------------------------
SINK_NAMES = re.compile(
    r"(_target_|path|paths|dir|file|files|cache|uri|url|init_from|weights|env|setup|args|storage"
    r"|command|module|host|project|entity|name|log|subdir|parameters|server|endpoint)$",
    re.IGNORECASE,
)


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list) and node and isinstance(node[0], dict):
        for value in node:
            yield from _leaves(value, f"{prefix}.N")
    else:
        yield prefix


def _config_keys() -> set[str]:
    """Every key of every shipped option, recipe and the root config, as a user writes it."""
    keys = set()
    sources = [(p, p.parent.name) for p in (REPO / "conf").glob("*/*.yaml")]
    sources += [(REPO / "conf" / "config.yaml", "")]
    sources += [(p, "") for p in (REPO / "recipes").glob("*.yaml")]
    for path, group in sources:
        node = OmegaConf.to_container(OmegaConf.load(path))
        node.pop("defaults", None)
        keys.update(_leaves(node, group))
    return keys


def test_every_key_that_reads_like_a_sink_is_in_the_inventory():
    keys = _config_keys()
    assert "pipeline.cache" in keys and "model._target_" in keys, "the walk finds keys"
    unlisted = sorted(
        key
        for key in keys
        if SINK_NAMES.search(key.rsplit(".", 1)[-1])
        and doors.find(key) is None
        and key not in doors.NOT_DOORS
    )
    assert not unlisted, (
        f"add these to tfrecipe/config/doors.py (CONFIG_DOORS or NOT_DOORS): {unlisted}"
    )


_ALL_DOORS = doors.CONFIG_DOORS + doors.ENV_DOORS + doors.FILE_DOORS


@pytest.mark.parametrize("door", _ALL_DOORS, ids=lambda door: door.key)
def test_every_guard_names_a_check_that_exists(door):
    """A door's guard starts with the dotted name of its check under `tfrecipe`: renamed or
    removed, the check fails here instead of leaving the inventory naming nothing."""
    dotted = re.split(r"[ :,(]", door.guard, maxsplit=1)[0]
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            found = importlib.import_module(".".join(["tfrecipe", *parts[:split]]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:]:
            assert hasattr(found, name), f"{door.key}: {dotted}: no {name} in {found!r}"
            found = getattr(found, name)
        return
    raise AssertionError(f"{door.key}: {dotted} names no module under tfrecipe")


def test_the_guard_check_can_fail():
    bad = doors.Door("x", doors.READ, "config.grants.no_such_check: gone")
    with pytest.raises(AssertionError, match="no no_such_check"):
        test_every_guard_names_a_check_that_exists(bad)


def test_the_inventory_names_no_key_that_is_gone():
    """A door or non-door whose key no config has any more is a stale entry."""
    keys = _config_keys()
    stale = [k for k in doors.NOT_DOORS if k not in keys]
    assert not stale, stale


# --- code writes, imports, starts programs and sets the environment only where listed -------------
_FILE_MODULES = {"io", "gzip", "bz2", "lzma", "tarfile", "zipfile", "codecs"}  # open(path, mode)
# Calls that write, delete, import or run by their name alone; the last row: library calls that
# write files under a path they are given.
_SINK_NAMES = {
    "write_text",
    "write_bytes",
    "rmtree",
    "mkstemp",
    "mkdtemp",
    "unlink",
    "save",
    "save_weights",
    "symlink_to",
    "import_module",
    "Popen",
    "system",
    "putenv",
    "__import__",
    "TensorBoard",
    "ModelCheckpoint",
    "CSVLogger",
    "BackupAndRestore",
    "create_file_writer",
    "CheckpointManager",
}


# os.execv*, os.spawn*, os.posix_spawn*, os.popen, os.system, pty.spawn, os.startfile: each starts
# a program, as subprocess does.
_PROGRAM_STARTS = ("exec", "spawn", "posix_spawn", "popen", "system", "startfile", "fork")


def _sink_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "pty"):
            yield f"from {node.module} import"  # names that would start programs unseen
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            yield from ("from os import" for a in node.names if a.name.startswith(_PROGRAM_STARTS))
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and ast.unparse(target.value) == "os.environ":
                    yield "os.environ[]="
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        base = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if name == "open" and base == "os":  # os.open(path, flags): writing flags
            if any(flag in ast.unparse(node) for flag in ("O_WRONLY", "O_RDWR", "O_CREAT")):
                yield "os.open"
        elif name == "open":  # open(p, "w"), gzip.open(p, "wb"); a Path's p.open("w")
            path_method = (
                base not in _FILE_MODULES
                and node.args[:1]
                and isinstance(node.args[0], ast.Constant)
            )  # Path.open(mode); not ZipFile.open(name, mode)
            at = 0 if base and path_method else 1
            mode = node.args[at] if len(node.args) > at else None
            mode = next((k.value for k in node.keywords if k.arg == "mode"), mode)
            text = mode.value if isinstance(mode, ast.Constant) else ("?" if mode else "r")
            if any(c in text for c in "wax?+"):
                yield f"{base}.open({text})" if base else f"open({text})"
        elif name in _SINK_NAMES:
            yield f"{base}.{name}" if base else name
        elif base in ("os", "shutil") and name in {
            "replace",
            "rename",
            "move",
            "copy",
            "copy2",
            "copyfile",
            "copytree",
            "remove",
        }:
            yield f"{base}.{name}"
        elif base == "subprocess":
            yield f"subprocess.{name}"
        elif base in ("os", "pty") and name.startswith(_PROGRAM_STARTS):
            yield f"{base}.{name}"
        elif base == "os.environ" and name in {"setdefault", "update", "pop", "clear"}:
            yield "os.environ.*"


def test_writes_imports_programs_and_environment_only_where_the_inventory_says():
    unlisted = []
    for path in sorted((REPO / "tfrecipe").rglob("*.py")):
        module = str(path.relative_to(REPO))
        allowed = doors.SINK_SITES.get(module, {})
        for call in _sink_calls(ast.parse(path.read_text())):
            if not any(fnmatch.fnmatchcase(call, pattern) for pattern in allowed):
                unlisted.append(f"{module}: {call}")
    assert not unlisted, (
        "write through tfrecipe.files, or list the call in doors.SINK_SITES with why: "
        f"{sorted(set(unlisted))}"
    )


def test_the_sink_scan_sees_a_new_door():
    """The scan is not blind: each kind of sink is found in a snippet."""
    snippet = textwrap.dedent("""\
        open(p, "w"); Path(p).write_text("x"); os.replace(a, b); importlib.import_module(m)
        subprocess.run(["x"]); os.environ["A"] = "1"; os.environ.update(B="2")
        self.path.open("a", newline=""); gzip.open(p, "wb"); os.open(p, os.O_WRONLY)
        keras.callbacks.TensorBoard(log_dir=d); tf.summary.create_file_writer(d)
        open(p); self.path.open(); os.open(d, os.O_RDONLY)
        os.execvp("git", ["git"]); pty.spawn(["sh"]); os.posix_spawn("/bin/sh", [], {})
        from subprocess import run as go
        """)
    found = set(_sink_calls(ast.parse(snippet)))
    assert found == {
        "open(w)",
        "Path(p).write_text",
        "os.replace",
        "importlib.import_module",
        "subprocess.run",
        "os.environ[]=",
        "os.environ.*",
        "self.path.open(a)",
        "gzip.open(wb)",
        "os.open",
        "keras.callbacks.TensorBoard",
        "tf.summary.create_file_writer",
        "os.execvp",
        "pty.spawn",
        "os.posix_spawn",
        "from subprocess import",
    }


# --- a payload through each door --------------------------------------------------------------
# (door key, probe) -> (a shared recipe carrying the payload, what the refusal must name).
PAYLOADS = {
    ("allowed_targets", "code"): ("allowed_targets: [mypkg]\n", "allowed_targets"),
    ("model._target_", "code"): (
        "model: {_target_: posix.system, command: 'true'}\n",
        "model._target_",
    ),
    ("dataset._target_", "code"): (
        "dataset: {_target_: mako.template.Template, text: x}\n",
        "dataset._target_",
    ),
    ("callbacks.extra.*._target_", "code"): (
        "callbacks: {extra: {x: {_target_: code.InteractiveConsole}}}\n",
        "callbacks.extra.x",
    ),
    ("task.loss._target_", "code"): ("task: {loss: {_target_: os.system}}\n", "task.loss"),
    ("task.metrics.*._target_", "code"): (
        "task: {metrics: [{_target_: runpy.run_path, path_name: x}]}\n",
        "task.metrics.0",
    ),
    ("hydra.sweeper._target_", "code"): (
        "hydra: {sweeper: {_target_: posix.system}}\n",
        "hydra.sweeper._target_",
    ),
    ("hydra.launcher._target_", "code"): (
        "hydra: {launcher: {_target_: posix.system}}\n",
        "hydra.launcher._target_",
    ),
    ("hydra.sweeper.custom_search_space", "code"): (
        "defaults: [{override /hydra/sweeper: optuna}]\n"
        "hydra: {sweeper: {custom_search_space: posix.system}}\n",
        "hydra.sweeper",
    ),
    ("hydra.sweeper.params", "code"): (
        "hydra: {mode: MULTIRUN, sweeper: {params: {allowed_targets: '[mypkg]'}}}\n",
        "allowed_targets",
    ),
    ("hydra.sweeper.search_space", "code"): (
        "defaults: [{override /hydra/sweeper: optuna}]\nhydra: {mode: MULTIRUN, sweeper: "
        "{search_space: {allowed_targets: {type: categorical, choices: ['[mypkg]']}}}}\n",
        "allowed_targets",
    ),
    ("hydra.callbacks", "code"): (
        "hydra: {callbacks: {x: {_target_: tempfile.mkdtemp}}}\n",
        "hydra.callbacks.x",
    ),
    ("hydra.job_logging", "outside"): (
        "hydra: {job_logging: {handlers: {f: {class: logging.FileHandler, "
        "filename: /tmp/tfrecipe-probe.pth}}}}\n",
        "hydra.job_logging.handlers.f.filename",
    ),
    ("hydra.hydra_logging", "outside"): (
        "hydra: {hydra_logging: {handlers: {f: {class: logging.FileHandler, "
        "filename: ../outside.log}}}}\n",
        "hydra.hydra_logging.handlers.f.filename",
    ),
    ("hydra.output_subdir", "outside"): ("hydra: {output_subdir: /tmp}\n", "hydra.output_subdir"),
    ("hydra.job.env_set", "code"): (
        "hydra: {job: {env_set: {LD_PRELOAD: /tmp/x.so}}}\n",
        "hydra.job.env_set.LD_PRELOAD",
    ),
    ("hydra.launcher.setup", "code"): (
        "defaults: [{override /hydra/launcher: submitit_slurm}]\n"
        "hydra: {launcher: {setup: ['touch /tmp/ran']}}\n",
        "hydra.launcher.setup",
    ),
    ("hydra.run.dir", "secret"): (
        "hydra: {run: {dir: 'out/r_${oc.env:HF_TOKEN}'}}\n",
        "hydra.run.dir",
    ),
    ("hydra.sweep.dir", "secret"): (
        "hydra: {mode: MULTIRUN, sweep: {dir: 'out/s_${oc.env:HF_TOKEN}'}}\n",
        "hydra.sweep.dir",
    ),
    ("pipeline.cache", "outside"): (
        "pipeline: {cache: /tmp/tfrecipe-probe-cache}\n",
        "pipeline.cache",
    ),
    ("batching.compile_cache", "outside"): (
        "batching: {compile_cache: /tmp/tfrecipe-probe-xla}\n",
        "batching.compile_cache",
    ),
    ("logger.mlflow.tracking_uri", "outside"): (
        "defaults: [{override /logger: [csv, mlflow]}]\n"
        "logger: {mlflow: {tracking_uri: 'http://203.0.113.9:5000'}}\n",
        "logger.mlflow.tracking_uri",
    ),
    ("export.name", "outside"): ("export: {name: ../../outside}\n", "export.name"),
}


def _config_probes():
    return [(d.key, probe) for d in doors.CONFIG_DOORS for probe in d.probes]


def test_every_probe_the_inventory_declares_has_a_payload():
    missing = [probe for probe in _config_probes() if probe not in PAYLOADS]
    assert not missing, f"add a payload to PAYLOADS for {missing}"


@pytest.mark.parametrize(
    ("key", "probe"), _config_probes(), ids=[f"{k}:{p}" for k, p in _config_probes()]
)
def test_a_payload_through_each_config_door_is_refused(key, probe, tmp_path, monkeypatch):
    from tfrecipe.cli.commands import validate

    monkeypatch.setenv("HF_TOKEN", "hf_probeSECRET123")
    monkeypatch.chdir(tmp_path)
    content, named = PAYLOADS[(key, probe)]
    recipe = tmp_path / f"probe_{abs(hash(key))}.yaml"
    recipe.write_text(f"# @package _global_\n{content}")
    with pytest.raises(ConfigError) as refused:
        validate([str(recipe)])
    report = refused.value.report()
    assert named in report, report
    assert "hf_probeSECRET123" not in report
    assert sorted(p.name for p in tmp_path.iterdir()) == [recipe.name], "nothing written"


def test_an_output_may_not_be_an_input_a_folder_a_link_or_a_runs_file(tmp_path):
    from tfrecipe import files

    data = tmp_path / "data.csv"
    data.write_text("a\n1\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    link = tmp_path / "link.csv"
    link.symlink_to(tmp_path / "elsewhere.csv")
    for output, named in [
        (data, "input"),
        (tmp_path, "directory"),
        (link, "link"),
        (run_dir / "history.csv", "run dir"),
    ]:
        with pytest.raises(files.NotOurs, match=named):
            files.check_output(output, inputs=[data])
    files.check_output(tmp_path / "scores.csv", inputs=[data])  # a new file is fine


def test_the_writer_never_replaces_what_the_run_did_not_write_nor_follows_a_link(tmp_path):
    from tfrecipe import files

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("the user's")
    (run_dir / "planted").symlink_to(tmp_path / "target")
    files.Manifest.of(run_dir).own()
    try:
        files.write_atomic(run_dir / "summary.json", "{}")
        files.write_atomic(run_dir / "summary.json", '{"a": 1}')  # its own: replaced
        with pytest.raises(files.NotOurs, match="not written by this run"):
            files.write_atomic(run_dir / "notes.txt", "x")
        with pytest.raises(files.NotOurs, match="symbolic link"):
            files.write_atomic(run_dir / "planted", "x")
    finally:
        files.Manifest.of(run_dir).release()
    assert (run_dir / "notes.txt").read_text() == "the user's"
    assert not (tmp_path / "target").exists()
    assert (run_dir / "summary.json").read_text() == '{"a": 1}'
    assert sorted(p.name for p in run_dir.iterdir()) == [
        files.MANIFEST,
        "notes.txt",
        "planted",
        "summary.json",
    ], "no temporary file left"


def test_evaluate_refuses_a_run_dir_another_process_is_writing(tmp_path, capsys):
    """The lock a training run holds keeps `evaluate` from writing into its dir."""
    import subprocess
    import sys

    from tfrecipe.cli.main import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(run_dir),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as stop:
            main(["evaluate", str(run_dir)])
        assert stop.value.code == 2 and "in use by PID" in capsys.readouterr().err
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert list(run_dir.iterdir()) == []


# --- a file door that is a link to /dev/zero is refused or skipped, never read --------------------
def _read_config(run_dir):
    from tfrecipe.runs import RunDir

    return RunDir.at(run_dir).config([], command="evaluate")


def _read_model(run_dir):
    from tfrecipe import (
        reading,  # RunDir.trained_model's and evaluate's check before Keras opens it
    )

    return reading.check_archive(run_dir / "model.keras", what="model.keras")


def _read_signature(run_dir):
    from tfrecipe import signature
    from tfrecipe.rundir import RunFiles

    return signature.read(RunFiles(run_dir))


def _read_fingerprint(run_dir):
    from tfrecipe.data import fingerprint
    from tfrecipe.rundir import RunFiles

    return fingerprint.load(RunFiles(run_dir))


def _read_stalls(run_dir):
    from tfrecipe.fault.watchdog import recorded_stalls
    from tfrecipe.rundir import RunFiles

    assert recorded_stalls(RunFiles(run_dir)) == [], "a linked stall record is skipped"


def _read_summary(run_dir):
    from tfrecipe import rundir

    assert rundir.RunFiles(run_dir).summary() is None, "an unreadable summary reads as none"


def _read_history(run_dir):
    from tfrecipe.runs import RunDir

    return RunDir.at(run_dir).history()  # a resumed run reads the epochs it trained


def _read_manifest(run_dir):
    from tfrecipe import files

    return files.Manifest.of(run_dir).owned()


def _read_mlflow_record(run_dir):
    from tfrecipe.tracking.mlflow_store import read_record

    return read_record(run_dir / "mlflow" / "run.json")


def _read_local_store(run_dir):
    from tfrecipe.tracking.mlflow_store import check_local_store

    return check_local_store(run_dir / "mlflow" / "local.db")


def _read_sweep_report(sweep_dir):
    from tfrecipe.cli.sweep_report import read_report

    return read_report(sweep_dir)


# file door -> (the name in the run dir, what reads it the way tfrecipe does)
FILE_READERS = {
    "RUN_DIR/.tfrecipe-files": (".tfrecipe-files", _read_manifest),
    "RUN_DIR/mlflow/run.json": ("mlflow/run.json", _read_mlflow_record),
    "RUN_DIR/mlflow/local.db": ("mlflow/local.db", _read_local_store),
    "SWEEP_DIR/sweep.json": ("sweep.json", _read_sweep_report),
    "RUN_DIR/config.yaml": ("config.yaml", _read_config),
    "RUN_DIR/model.keras": ("model.keras", _read_model),
    "RUN_DIR/signature.json": ("signature.json", _read_signature),
    "RUN_DIR/data_fingerprint.json": ("data_fingerprint.json", _read_fingerprint),
    "RUN_DIR/stall-TASK.txt": ("stall-worker-1.txt", _read_stalls),
    "RUN_DIR/summary.json": ("summary.json", _read_summary),
    "RUN_DIR/history.csv": ("history.csv", _read_history),
}
_FILE_PROBES = [d.key for d in doors.FILE_DOORS if "non_regular" in d.probes]


def test_every_file_door_with_a_probe_has_a_reader_here():
    assert sorted(_FILE_PROBES) == sorted(FILE_READERS)


@pytest.mark.parametrize("door", _FILE_PROBES)
def test_a_file_door_linked_to_dev_zero_is_refused_not_read(door, tmp_path):
    """Each read would never end (or exhaust memory) if it followed the link."""
    name, read = FILE_READERS[door]
    run_dir = tmp_path / "received"
    (run_dir / name).parent.mkdir(parents=True)
    (run_dir / name).symlink_to("/dev/zero")
    try:
        read(run_dir)
    except (ConfigError, ValueError) as refused:
        assert name.split("-")[0] in str(refused) or "/dev/zero" in str(refused), refused
