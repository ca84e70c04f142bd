"""`batching.compile_cache`: XLA's persistent cache of compiled programs, decided from the device
description (tfrecipe.config.compile_cache), refused where its folder is unsafe, said by the plan,
and reused by a second identical run (the slow test: two real runs with XLA on this CPU)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tfrecipe.config import compile_cache
from tfrecipe.config.compile_cache import Devices
from tfrecipe.errors import ConfigError

GPU = Devices(frozenset({"GPU"}), distributed=False)
TWO_GPUS = Devices(frozenset({"GPU"}), distributed=True)  # MirroredStrategy over them
CPU = Devices(frozenset({"CPU"}), distributed=False)
TPU = Devices(frozenset({"TPU"}), distributed=False)


def _choose(setting, jit_compile, devices, **environment):
    asked = []

    def machine():  # read only for a folder in use (a run start pays milliseconds for it)
        asked.append(True)
        return "m1"

    choice = compile_cache.choose(
        setting, jit_compile=jit_compile, devices=devices, machine=machine, environment=environment
    )
    assert bool(asked) == (choice.directory is not None), choice
    return choice


@pytest.mark.parametrize(
    ("setting", "jit_compile", "devices", "on", "why"),
    [
        ("auto", "auto", GPU, True, "jit_compile=auto on a GPU"),
        ("auto", "auto", TPU, True, "jit_compile=auto on a TPU"),
        ("auto", True, GPU, True, "jit_compile=true"),
        ("auto", "auto", TWO_GPUS, False, "off under a tf.distribute strategy"),
        ("auto", "auto", CPU, False, "off on a CPU"),
        ("auto", True, CPU, False, "off on a CPU (XLA:CPU's loader logs"),
        ("auto", False, GPU, False, "nothing compiles with XLA (batching.jit_compile=false)"),
        (False, True, GPU, False, "compile_cache=false"),
        ("/srv/xla", True, CPU, True, "compile_cache=/srv/xla: on, batching.jit_compile=true"),
    ],
)
def test_the_cache_is_on_where_the_run_compiles_with_xla(setting, jit_compile, devices, on, why):
    choice = _choose(setting, jit_compile, devices, XDG_CACHE_HOME="/home/u/.cache")
    assert (choice.directory is not None) == on and why in choice.reason, choice
    if on:  # a folder per machine, under the user's cache dir or the folder named
        root = "/home/u/.cache/tfrecipe/xla" if setting == "auto" else setting
        assert choice.directory == Path(root) / "m1"
        assert choice.fields() == {"directory": f"{root}/m1", "reason": choice.reason}


def test_a_cache_your_tf_xla_flags_names_is_kept_and_other_flags_stay():
    flags = "--tf_xla_persistent_cache_directory=/mine"
    choice = _choose("auto", True, GPU, TF_XLA_FLAGS=flags)
    assert choice.directory is None and "TF_XLA_FLAGS names XLA's cache already" in choice.reason
    added = compile_cache.flags_with("--tf_xla_auto_jit=2", Path("/c/m1"))
    assert added == "--tf_xla_auto_jit=2 --tf_xla_persistent_cache_directory=/c/m1"
    assert _choose("auto", True, GPU).directory == Path.home() / ".cache/tfrecipe/xla/m1"


def test_a_resumed_run_may_change_its_cache_folder_or_predate_the_key():
    from tfrecipe.config.changes import changed_keys

    older = {"batching": {"jit_compile": True}}
    now = {"batching": {"jit_compile": True, "compile_cache": "/elsewhere/xla"}}
    assert changed_keys(older, now) == []
    assert changed_keys(older, {"batching": {"jit_compile": False}}) == ["batching.jit_compile"]


def _problem(*overrides: str) -> str:
    from tfrecipe.config.compose import compose
    from tfrecipe.config.schema import validate
    from tfrecipe.config.trust import Trust

    with pytest.raises(ConfigError) as refused:
        validate(compose(list(overrides)), trust=Trust.from_command_line(overrides))
    return refused.value.report()


def test_an_unsafe_folder_is_refused_in_one_line_naming_the_key(tmp_path):
    assert "batching.compile_cache=xla: expected auto, false or an absolute path" in _problem(
        "batching.compile_cache=xla"
    )
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    report = _problem(f"batching.compile_cache={shared}")
    assert "is writable by others: XLA would load programs they put there" in report
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert "is a link" in _problem(f"batching.compile_cache={link}")
    assert len(_problem("batching.compile_cache=true").splitlines()) == 1


def test_the_plan_says_whether_the_cache_is_used():
    from tfrecipe.config.compose import compose
    from tfrecipe.config.plan import RunPlan
    from tfrecipe.config.schema import validate
    from tfrecipe.config.trust import Trust

    def line(*overrides: str) -> str:
        run = validate(compose(list(overrides)), trust=Trust.from_command_line(overrides))
        return next(x for x in RunPlan.from_config(run).lines() if x.startswith("compile cache"))

    assert "on a GPU or TPU" in line() and "off on a CPU, where it does not" in line()
    assert "off (batching.jit_compile=auto under strategy=mirrored" in line("strategy=mirrored")
    assert "off (XLA compiles every run afresh)" in line("batching.compile_cache=false")
    assert "on a CPU too" in line("batching.jit_compile=true", "batching.compile_cache=/srv/x")


def test_the_plan_says_what_xla_compiles():
    from tfrecipe.config.compose import compose
    from tfrecipe.config.plan import RunPlan
    from tfrecipe.config.schema import validate
    from tfrecipe.config.trust import Trust

    def line(*overrides: str) -> str:
        run = validate(compose(list(overrides)), trust=Trust.from_command_line(overrides))
        return next(x for x in RunPlan.from_config(run).lines() if x.startswith("xla:"))

    held = "each call on a training split held on one device is one XLA program"
    assert line().startswith("xla: batching.jit_compile=auto: off on a CPU;") and held in line()
    forced = line("batching.jit_compile=true")
    assert held in forced and "on a CPU: models without convolutions" in forced
    assert "strategy=mirrored" in line("strategy=mirrored")
    assert line("batching.jit_compile=false") == "xla: batching.jit_compile=false: off"


def test_the_run_makes_its_folder_for_this_user_only(tmp_path, monkeypatch):
    from tfrecipe.perf import xla_cache

    monkeypatch.setattr(xla_cache, "_in_use", None)
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # this process's XLA keeps its flags
    choice = xla_cache.use(str(tmp_path / "xla"), jit_compile=True, devices=CPU)
    assert choice.directory.parent == tmp_path / "xla"
    assert (choice.directory.stat().st_mode & 0o777) == 0o700
    assert os.environ["TF_XLA_FLAGS"] == f"--tf_xla_persistent_cache_directory={choice.directory}"
    assert xla_cache.chosen(os.environ)["directory"] == str(choice.directory)
    # this test process imported TensorFlow before: the choice says the flag may come too late
    assert "TensorFlow was loaded before" in choice.reason


def test_the_devices_are_read_without_tensorflow(monkeypatch):
    """Read before TensorFlow lists its devices (which is when it reads TF_XLA_FLAGS)."""
    from tfrecipe.perf import xla_cache

    monkeypatch.setattr(xla_cache, "_gpu_models", lambda: ["NVIDIA H200"])
    assert xla_cache.devices("default", {}) == GPU
    assert xla_cache.devices("mirrored", {}).distributed
    assert xla_cache.devices("default", {"CUDA_VISIBLE_DEVICES": "-1"}).kinds == {"CPU"}
    monkeypatch.setattr(xla_cache, "_gpu_models", lambda: [])
    assert xla_cache.devices("default", {"TPU_ACCELERATOR_TYPE": "v5litepod-8"}) == TPU


def _run(cli, tmp_path: Path, name: str, cache: Path) -> tuple[dict, str]:
    overrides = [
        "loop.epochs=2",
        "loop.steps_per_epoch=2",
        "loop.verbose=0",
        "batching.per_replica_batch_size=16",
        "batching.jit_compile=true",
        f"batching.compile_cache={cache}",
        f"hydra.run.dir={tmp_path / name}",
    ]
    done = cli(*overrides, fresh=True)  # a new interpreter: TensorFlow reads the flag at start
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / name / "summary.json").read_text()), done.stderr


def _programs(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*.pb")}


@pytest.mark.slow
def test_a_second_identical_run_loads_what_the_first_compiled(cli, tmp_path):
    """Two processes, one cache folder: the first compiles its programs with XLA and saves them;
    the second loads every one (nothing new written, nothing rewritten). Both split the first
    call's extra into tracing and compiling."""
    cache = tmp_path / "xla"
    first, _ = _run(cli, tmp_path, "first", cache)
    saved = _programs(cache)
    assert first["jit_compile"] is True and len(saved) >= 2, saved  # training and evaluation
    assert first["compile_cache"]["directory"].startswith(str(cache))
    second, stderr = _run(cli, tmp_path, "second", cache)
    assert _programs(cache) == saved, "the second run compiled a program the first saved"
    # XLA's loader says "Loading XLA:CPU AOT result" on an Intel Xeon and nothing on an AMD EPYC
    # without AVX-512, where the second run's compile went 6.4 s -> 0.88 s all the same: what it
    # saves is the figure (#47: the second run's compile at most 20% of the first's)
    compiled = [summary["perf"]["warm_up_s"]["compile"] for summary in (first, second)]
    assert compiled[1] < compiled[0] / 2, (compiled, stderr[-2000:])
    for summary in (first, second):
        warm_up = summary["perf"]["warm_up_s"]
        assert warm_up["tracing"] > 0 and warm_up["compile"] > 0, warm_up
        assert warm_up["tracing"] + warm_up["compile"] == pytest.approx(
            warm_up["first_call"] + warm_up["first_validation"], abs=0.002
        )
