"""Where a run's time goes (tfrecipe.perf): the perf block, its diagnosis, the profiler window,
the peak table and calibration cache, provenance, and how `compare` shows them."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from tfrecipe.perf import cache, peak, provenance, report

PERF_KEYS = {
    "examples_per_sec",
    "step_time_ms",
    "input_wait_fraction",
    "flops_per_example",
    "achieved_flops_per_sec",
    "peak_flops_per_sec",
    "peak_source",
    "mfu",
    "replicas",
    "per_replica",
    "wall_split",
    "diagnosis",
}
SLOW_INPUT = (
    "dataset._target_=tests.helpers.slow_input.slow_digits",
    "+dataset.seconds_per_example=0.004",
    "pipeline.cache=null",
    "pipeline.shuffle_buffer=32",  # the sleeping map feeds the shuffle buffer
    "allowed_targets=[tests.helpers]",
)


# --- pure functions: no training ---


def test_perf_block_totals_and_per_replica():
    timing = report.Timing(
        examples_per_sec=1000.0,
        step_time_ms={"median": 5.0, "p90": 6.0},
        input_wait=[0.1, 0.3],
        input_wait_note=None,
    )
    compute = report.Compute(
        flops_per_example=2e6,
        peak_per_replica=5e9,
        peak_source="calibration:float32 matmul",
        num_replicas=2,
    )
    block = report.perf_block(timing, compute)
    assert set(block) >= PERF_KEYS
    assert block["achieved_flops_per_sec"] == 2e9
    assert block["peak_flops_per_sec"] == 1e10
    assert block["mfu"] == 0.2
    assert block["input_wait_fraction"] == 0.2
    assert block["per_replica"] == {
        "examples_per_sec": 500.0,
        "achieved_flops_per_sec": 1e9,
        "peak_flops_per_sec": 5e9,
        "input_wait_fraction": [0.1, 0.3],
    }
    assert block["diagnosis"] is None  # 20% is not over the line


def test_diagnosis_names_what_to_try_only_when_input_bound():
    assert report.diagnosis(0.05) is None
    line = report.diagnosis(0.45)
    assert "\n" not in line
    assert "45%" in line
    for remedy in ("cache", "num_parallel_calls", "prefetch", "steps_per_execution", "hooks"):
        assert remedy in line


def test_diagnosis_names_only_what_the_run_does_not_do_already():
    """The default pipeline already caches, maps in parallel and prefetches: advising it would
    send a user in circles. A 0.8 ms step is mostly the work around it: the batch comes first.
    One call per epoch has no hook between its steps."""
    done = report.Knobs(
        cache="memory",
        num_parallel_calls="autotune",
        steps_per_call=10,
        steps_per_epoch=10,
        per_replica_batch=16,
        prefetches=True,
    )
    line = report.diagnosis(0.77, done, step_ms=5.0)
    assert "cache" not in line and "num_parallel_calls" not in line and "prefetch" not in line
    assert "steps per call" not in line  # one call per epoch already
    assert "hooks" not in line
    short = report.diagnosis(0.77, dataclasses.replace(done, steps_per_call=2), step_ms=0.76)
    # a value the run does not use already
    assert "a larger batch (batching.per_replica_batch_size=32, twice the run's 16" in short
    assert "2 of the epoch's 10)" in short
    assert "fewer per-step Python hooks" in short
    bounded = dataclasses.replace(
        done, steps_per_call=2, bounded_by=("logger.csv.every_n_steps=10",)
    )
    assert "2 of the epoch's 10; logger.csv.every_n_steps=10 bound it)" in report.diagnosis(
        0.77, bounded
    )
    assert short.index("larger batch") < short.index("steps per call")


def test_diagnosis_says_where_the_wall_time_went_when_the_steps_took_little_of_it():
    """A table recipe: 8 ms of steps an epoch against validation and a best-weights save. The
    larger share comes first, validation with the key (and value) that spaces it out."""
    knobs = report.Knobs(validation_freq=1)
    line = report.diagnosis(0.05, knobs, wall_split={"steps": 0.2, "validation": 0.3, "other": 0.5})
    assert line == (
        "the training steps took 20% of the wall time: epoch-end work 50% (best-weights saves, "
        "backups, exports, logs), validation 30% (loop.validation_freq=2 validates half as often "
        "as the run's 1)"
    )
    assert (
        report.diagnosis(0.05, knobs, wall_split={"steps": 0.6, "validation": 0.3, "other": 0.1})
        is None
    )
    both = report.diagnosis(0.45, knobs, wall_split={"steps": 0.2, "validation": 0.7, "other": 0.1})
    assert both.startswith("input-bound") and "; the training steps took 20%" in both


def test_the_profiler_window_takes_its_steps_one_per_call(tmp_path):
    """The custom loop's calls around a window at steps 5-6 with 4 planned per call: up to
    step 4 (which traces the loopless step), one per call through the window, then as planned."""
    from tfrecipe.perf.profiler import StepProfiler

    profiler = StepProfiler(tmp_path, first=5, calls=2)
    taken = []
    while profiler.steps_seen < 12:
        steps = profiler.call_steps(4)
        taken.append(steps)
        profiler._step += steps  # what on_train_batch_end counts (without starting a trace)
    assert taken == [4, 1, 1, 1, 4, 4]  # steps 0-3, 4, 5, 6, 7-10, 11-14


def test_perf_words_on_the_console_line():
    words = report.perf_words(
        {
            "examples_per_sec": 1234.5,
            "step_time_ms": {"median": 5.1, "p90": 6.0},
            "input_wait_fraction": 0.03,
            "achieved_flops_per_sec": 2.6e10,
            "peak_flops_per_sec": 1.4e11,
            "mfu": 0.186,
        }
    )
    assert words == (
        "perf 1234 ex/s, step 5.1 ms (p90 6), input wait 3%, 26 GFLOP/s of 140 (MFU 18.6%)"
    )
    assert report.perf_words(None) == ""


@pytest.mark.parametrize(
    ("description", "dtype", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12),
        ("NVIDIA H200", "float32", 494.7e12),  # TF32 on (TensorFlow's default)
        ("NVIDIA H100 PCIe", "float32", 378e12),
        ("Tesla T4", "float32", 8.1e12),  # no TF32: plain fp32
        ("NVIDIA H100 PCIe", "bfloat16", 756e12),
        ("NVIDIA H200", "float16", 989e12),
        ("NVIDIA A100-SXM4-40GB", "float32", 156e12),
        ("Tesla T4", "float16", 65e12),
        ("Tesla V100-SXM2-16GB", "bfloat16", None),  # no bf16 tensor cores: said, not guessed
        ("Some Future GPU", "float32", None),
    ],
)
def test_gpu_peak_table_from_device_descriptions(description, dtype, expected):
    found = peak.gpu_peak(description, dtype, tf32=True)
    assert found.flops_per_sec == expected
    assert found.source.startswith("table:" if expected else "none:")


def test_float32_is_held_to_plain_fp32_when_tf32_is_off():
    found = peak.gpu_peak("NVIDIA H200", "float32", tf32=False)
    assert (found.flops_per_sec, found.source) == (67e12, "table:H200 float32")
    assert peak.gpu_peak("NVIDIA H200", "float32", tf32=True).source == "table:H200 tensorfloat32"


def test_tpu_peak_table():
    assert peak.tpu_peak("v4-8", "float32").flops_per_sec == 275e12
    assert peak.tpu_peak("v5litepod-16", "bfloat16").flops_per_sec == 197e12
    assert peak.tpu_peak("TPU", "bfloat16").flops_per_sec is None


def test_cache_measures_once_and_writes_atomically(tmp_path, monkeypatch):
    path = tmp_path / "perf.json"
    monkeypatch.setenv(cache.CACHE_ENV, str(path))
    calls = []

    def measure():
        calls.append(1)
        return 123.0

    assert cache.remembered("peak", "m:float32", measure) == (123.0, False)
    assert cache.remembered("peak", "m:float32", measure) == (123.0, True)
    assert len(calls) == 1
    assert json.loads(path.read_text())["peak"]["m:float32"] == 123.0
    assert [p.name for p in tmp_path.iterdir()] == ["perf.json"]  # no temporary left behind
    path.write_text("{not json")  # a damaged cache is measured again, and left as it is
    assert cache.remembered("peak", "m:float32", measure) == (123.0, False)
    assert path.read_text() == "{not json"


@pytest.mark.parametrize("kind", ["folder", "link", "devnull", "user_file"])
def test_the_cache_never_replaces_what_it_did_not_write(kind, tmp_path, monkeypatch, caplog):
    """TFRECIPE_PERF_CACHE naming a folder, a link, /dev/null or someone's file: the value is
    measured, a warning says the cache was not written, and the target is left whole."""
    target = {
        "folder": tmp_path / "keep",
        "link": tmp_path / "link",
        "devnull": Path(os.devnull),
        "user_file": tmp_path / "notes.json",
    }[kind]
    if kind == "folder":
        target.mkdir()
        (target / "precious.txt").write_text("mine")
    elif kind == "link":
        (tmp_path / "real.txt").write_text("mine")
        target.symlink_to(tmp_path / "real.txt")
    elif kind == "user_file":
        target.write_text('{"settings": 1}')
    monkeypatch.setenv(cache.CACHE_ENV, str(target))
    monkeypatch.setattr(cache, "_WARNED", set())
    with caplog.at_level("WARNING", logger=cache.__name__):
        assert cache.remembered("peak", f"{kind}:float32", lambda: 7.0) == (7.0, False)
    assert "perf cache was not written" in caplog.text
    if kind == "folder":
        assert (target / "precious.txt").read_text() == "mine"
    elif kind == "link":
        assert target.is_symlink() and (tmp_path / "real.txt").read_text() == "mine"
    elif kind == "user_file":
        assert target.read_text() == '{"settings": 1}'
    else:
        assert target.is_char_device()


def test_provenance_differences():
    base = {
        "versions": {"tensorflow": "2.21.0", "keras": "3.15.1"},
        "cpu": {"model": "AMD EPYC", "flags": ["avx512_bf16"], "count": 2},
        "gpus": [],
        "hosts": 1,
        "replicas": 1,
    }
    other_cpu = {**base, "cpu": {**base["cpu"], "model": "Intel Xeon"}}
    other_tf = {**base, "versions": {**base["versions"], "tensorflow": "2.22.0"}}
    assert provenance.differences(base, base) == ""
    assert provenance.differences(other_cpu, base) == "hw:cpu.model"
    assert provenance.differences(other_tf, base) == "versions:tensorflow"
    assert provenance.differences(None, base) == "?"


def test_profiler_verdict_reads_xprof_tables():
    from tfrecipe.perf.profiler import verdict

    steps = {
        "cols": [{"id": "stepnum"}, {"id": "stepTimeMs"}],
        "rows": [{"c": [{"v": "train 5"}, {"v": 10.0}]}, {"c": [{"v": "train 6"}, {"v": 12.0}]}],
        "p": {
            "input_conclusion": "Your program is HIGHLY input-bound because 48.4% of the "
            "total step time sampled is waiting for input."
        },
    }
    found = verdict([{}, steps])
    assert found["steps"] == 2
    assert found["step_time_ms"] == 11.0
    assert found["input_percent"] == 48.4
    assert "HIGHLY input-bound" in found["verdict"]


def test_compare_shows_perf_and_marks_runs_from_other_hardware(tmp_path):
    from tfrecipe.cli.compare import find_runs, table

    base = {
        "versions": {"tensorflow": "2.21.0"},
        "cpu": {"model": "AMD EPYC", "flags": [], "count": 2},
        "gpus": [],
        "hosts": 1,
        "replicas": 1,
        "git": {"sha": "a", "dirty": False},
    }
    ran = {
        "a": base,
        "b": {**base, "git": {"sha": "b", "dirty": True}},  # another commit: still comparable
        "c": {**base, "cpu": {**base["cpu"], "model": "Intel Xeon"}},
    }
    for name, found in ran.items():
        (tmp_path / name).mkdir()
        summary = {
            "status": "completed",
            "metrics": {"loss": 0.1},
            "examples_per_sec": 100.0,
            "perf": {
                "step_time_ms": {"median": 4.0, "p90": 5.0},
                "input_wait_fraction": 0.02,
                "mfu": 0.19,
                "wall_split": {"steps": 0.7, "validation": 0.1, "other": 0.2},
            },
            "provenance": found,
        }
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    header, rows = table(find_runs([tmp_path]), [])
    shown = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert shown["a"]["step_ms"] == "4" and shown["a"]["input_wait"] == "0.02"
    assert shown["a"]["mfu"] == "0.19" and shown["a"]["steps_share"] == "0.7"
    assert [shown[name]["ran on"] for name in "abc"] == ["same", "same", "hw:cpu.model"]


# --- real runs ---


def test_default_run_reports_where_its_time_goes(train_run):
    """The default job (4 of its epochs, 3 in the steady state): every perf figure, provenance,
    and input that keeps up by the run's own rule (report.INPUT_BOUND, where the diagnosis
    would call it input-bound). The wait itself swings with the machine's load (0.04-0.06
    quiet, 0.102-0.104 at load 2-4 beside another test worker), so the test holds the rule
    the user is told, not a figure of one machine."""
    summary, _ = train_run("loop.epochs=4", "loop.verbose=0", tiny=False)
    perf = summary["perf"]
    assert set(perf) >= PERF_KEYS
    assert perf["examples_per_sec"] == pytest.approx(summary["examples_per_sec"], rel=1e-3)
    assert 0 < perf["step_time_ms"]["median"] <= perf["step_time_ms"]["p90"]
    assert perf["input_wait_fraction"] <= report.INPUT_BOUND, perf
    split = perf["wall_split"]
    assert split["steps"] > 0 and split["validation"] > 0 and split["other"] >= 0, split
    assert sum(split.values()) == pytest.approx(1, abs=0.01)
    assert perf["diagnosis"] is None or perf["diagnosis"].startswith("the training steps"), perf
    # the default CNN: 3.0 MFLOP forward (2 x MACs), a training step about 3x that
    assert 8e6 < perf["flops_per_example"] < 10e6
    assert perf["achieved_flops_per_sec"] > 0 and perf["peak_flops_per_sec"] > 0
    assert perf["peak_source"].startswith("calibration:float32")
    assert perf["mfu"] == pytest.approx(
        perf["achieved_flops_per_sec"] / perf["peak_flops_per_sec"], rel=1e-2
    )
    ran = summary["provenance"]
    assert ran["versions"]["tensorflow"] and ran["versions"]["keras"]
    assert ran["cpu"]["model"] and ran["cpu"]["count"] >= 1
    cores = ran["cpu"]["count"]
    assert ran["cpu"]["intra_op_threads"] == (1 if cores <= 2 else cores), ran["cpu"]
    assert (ran["hosts"], ran["replicas"], ran["gpus"], ran["cluster"]) == (1, 1, [], None)
    assert ran["graph_optimizer"] is False  # auto, on a machine of CPUs only


def test_a_held_split_waits_only_on_its_gather(train_run):
    """fit on a held split stamps its reads itself (tfrecipe.loops.resident_fit: each batch
    gathered while the step before it runs, a step's wait its batch's arrival after that step's
    end): the MLP's wait is its input's, not the call's around its steps, so it is not called
    input-bound; streamed, fit's `get_next` per step is its input, and the same job is."""
    common = ("model=mlp", "loop.epochs=3", "loop.verbose=0")
    held, _ = train_run(*common, "pipeline.resident=true", tiny=False)
    streamed, _ = train_run(*common, "pipeline.resident=false", tiny=False)
    assert held["resident"]["resident"] and not streamed["resident"]["resident"]
    wait = held["perf"]["input_wait_fraction"]
    assert wait < report.INPUT_BOUND < streamed["perf"]["input_wait_fraction"], (held, streamed)
    assert "input-bound" not in (held["perf"]["diagnosis"] or "")
    assert "input-bound" in streamed["perf"]["diagnosis"]


def test_the_custom_loop_waits_only_on_its_input(train_run):
    """The custom loop reads each step's batch while the step before it runs and stamps its
    arrival after that step's end (`Reads.steps`): the MLP on its held digits is not
    input-bound (stamped unordered, a loop's overlapping iterations counted the step before
    as waiting: 0.13-0.29 on a quiet machine); a slow map is (the test above). Not asserted
    streamed: there a loaded machine starves the prefetch thread, and the wait is real (0.29
    in a CI run beside another test process; 0.04 quiet)."""
    common = ("model=mlp", "loop=custom", "loop.epochs=3", "loop.verbose=0")
    summary, _ = train_run(*common, "pipeline.resident=true", tiny=False)
    assert summary["resident"]["resident"]
    assert summary["perf"]["input_wait_fraction"] < report.INPUT_BOUND, summary["perf"]


def test_intra_op_threads_are_set_before_tensorflow_starts_or_refused():
    """strategy.intra_op_threads: auto runs each op on one thread on a machine of at most 2
    cores (TensorFlow's default, every core, elsewhere); a number is set as given. Both apply
    before TensorFlow starts; after, auto keeps what runs and another number is a config
    error naming the key."""
    import subprocess
    import sys

    import tensorflow as tf

    from tfrecipe.distribute.strategy import configure_threads
    from tfrecipe.errors import ConfigError
    from tfrecipe.perf.provenance import cores

    script = (
        "import sys; from tfrecipe.distribute.strategy import configure_threads; "
        "import tensorflow as tf; value = sys.argv[1]; "
        "configure_threads(value if value == 'auto' else int(value)); tf.constant(1) + 1; "
        "print(tf.config.threading.get_intra_op_parallelism_threads())"
    )
    for value, expected in (("auto", 1 if cores() <= 2 else 0), ("3", 3)):
        ran = subprocess.run(
            [sys.executable, "-c", script, value], capture_output=True, text=True, check=True
        )
        assert ran.stdout.split()[-1] == str(expected), ran.stderr[-500:]
    tf.constant(1) + 1  # this process's TensorFlow has started
    running = tf.config.threading.get_intra_op_parallelism_threads()
    assert configure_threads("auto") == running
    with pytest.raises(ConfigError, match=r"strategy.intra_op_threads=7: .* fresh process"):
        configure_threads(7)


def test_the_graph_optimizer_is_off_for_cpus_only_unless_set():
    """strategy.graph_optimizer: auto turns Grappler off where a run's devices are this
    process's CPUs alone, and leaves it on elsewhere (GPUs, TPUs, parameter servers); true and
    false hold anywhere. What a run ran with is in its provenance."""
    import tensorflow as tf

    from tfrecipe.distribute.strategy import configure_graph_optimizer
    from tfrecipe.perf.provenance import graph_optimizer

    def disabled():
        return tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer")

    was = graph_optimizer()
    try:
        for setting, cpus_only, on in (
            ("auto", True, False),
            ("auto", False, True),
            (True, True, True),
            (False, False, False),
        ):
            assert configure_graph_optimizer(setting, cpus_only=cpus_only) is on
            assert bool(disabled()) is not on and graph_optimizer() is on
    finally:
        configure_graph_optimizer(was, cpus_only=True)


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_slow_input_is_measured_and_diagnosed_in_both_loops(train_run, loop):
    """A map that sleeps per example: the steps wait most of the time; the run says so in one
    line. Both loops profile steps 2 and 3 of the first epoch (outside the steady state the
    perf block measures), one step per call: xprof sees the steps (their time above 0) and the
    input they waited for. A profiled fit run takes one step per call throughout; the custom
    loop only around its window (calls of 1, 1, 1, 2 in its first epoch, then 6)."""
    summary, run_dir = train_run(
        f"loop={loop}",
        "loop.steps_per_epoch=6",
        *SLOW_INPUT,
        "logger=[tensorboard]",
        "logger.tensorboard.profile_batch=2",
        "logger.tensorboard.profile_steps=2",
    )
    assert summary["steps_per_execution"] == (1 if loop == "fit" else 6)
    perf = summary["perf"]
    assert perf["input_wait_fraction"] >= 0.3, perf
    assert "input-bound" in perf["diagnosis"]
    # What the run could do names its value (this one caches nothing; the map is parallel).
    assert "pipeline.cache=memory" in perf["diagnosis"]
    assert "num_parallel_calls" not in perf["diagnosis"]
    # fit here runs one step per call for its profile and custom whole epochs: neither is told
    # to take more steps per call (the plan would not apply it); the console's line: a run of
    # seconds keeps it in summary.json (tests/test_perf_advice.py).
    assert "more steps per call" not in perf["diagnosis"]
    profile = perf["profile"]
    assert profile["steps"] == 2 and profile["step_time_ms"] > 0, profile
    assert profile["input_percent"] >= 20, profile
    assert "input-bound" in profile["verdict"]
    assert (run_dir / "tensorboard" / profile["trace"]).is_file()
    import tensorflow as tf

    (events,) = (run_dir / "tensorboard" / "perf").glob("events.out.tfevents.*")
    tags = {
        v.tag for e in tf.compat.v1.train.summary_iterator(str(events)) for v in e.summary.value
    }
    assert {
        "perf/input_wait_fraction",
        "perf/mfu",
        "perf/wall_steps",
        "perf/wall_validation",
    } <= tags


def test_input_wait_is_measured_under_xla_in_fit(train_run):
    """XLA has no clock op: the step is compiled by itself and stamped from outside, so a GPU's
    default (Keras turns XLA on there) still measures its input wait."""
    summary, _ = train_run("batching.jit_compile=true", "loop.steps_per_epoch=6", *SLOW_INPUT)
    assert summary["jit_compile"] is True
    perf = summary["perf"]
    assert perf["input_wait_fraction"] >= 0.3, perf
    assert "input_wait_note" not in perf
    assert "input-bound" in perf["diagnosis"]


def test_xla_under_mirrored_trains_and_says_why_its_wait_is_not_measured(train_run):
    """MirroredStrategy all-reduces inside the step (a merge_call, refused in a nested function):
    there fit keeps Keras' XLA around the strategy's whole step, and the wait is not measured."""
    summary, _ = train_run(
        "strategy=mirrored", "batching.jit_compile=true", "loop.steps_per_epoch=3"
    )
    assert summary["status"] == "completed" and summary["jit_compile"] is True
    assert "XLA" in summary["perf"]["input_wait_note"]


def test_xla_on_several_local_devices_is_refused_before_training(train_run):
    from tfrecipe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"batching.jit_compile=true: .* exactly one device.*2"):
        train_run("strategy=mirrored", "strategy.logical_cpus=2", "batching.jit_compile=true")


def test_two_replicas_report_per_replica_and_in_total(train_run):
    """Mirrored on two logical CPUs of one machine: each replica's wait is measured; they
    share the CPU's peak, so the total peak is the machine's."""
    summary, _ = train_run("strategy=mirrored", "strategy.logical_cpus=2", "loop=custom")
    perf = summary["perf"]
    assert perf["replicas"] == 2 and summary["provenance"]["replicas"] == 2
    per_replica = perf["per_replica"]
    assert len(per_replica["input_wait_fraction"]) == 2
    assert perf["peak_flops_per_sec"] == pytest.approx(
        2 * per_replica["peak_flops_per_sec"], rel=1e-3
    )
    assert "shared by 2 replicas" in perf["peak_source"]
    assert perf["examples_per_sec"] == pytest.approx(2 * per_replica["examples_per_sec"], rel=1e-3)


def test_a_peak_the_run_beat_is_measured_again_and_the_larger_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "perf.json"))
    assert cache.remembered("peak", "k", lambda: 50.0) == (50.0, False)  # a busy machine
    assert cache.remembered("peak", "k", lambda: 40.0, at_least=45.0) == (50.0, True)
    # beaten, but measured within the hour: not again (each calibration costs seconds)
    assert cache.remembered("peak", "k", lambda: 90.0, at_least=60.0) == (50.0, True)
    monkeypatch.setattr(cache, "RECHECK_AFTER_S", 0)
    assert cache.remembered("peak", "k", lambda: 90.0, at_least=60.0) == (90.0, False)
    assert cache.remembered("peak", "k", lambda: 70.0, at_least=95.0) == (90.0, False)
    assert cache.remembered("peak", "k", lambda: 1.0) == (90.0, True)


def test_allreduce_time_from_device_descriptions():
    """A ring all-reduce moves 2(n-1)/n of the gradients over each GPU's link."""
    gradients = 100e6  # 25M float32 weights
    assert peak.allreduce_seconds(gradients, 8, "NVIDIA H100 80GB HBM3") == pytest.approx(
        2 * 7 / 8 * gradients / 450e9
    )
    assert peak.allreduce_seconds(gradients, 2, "Tesla T4") == pytest.approx(gradients / 16e9)
    # PCIe H100s are not NVLink ones; one GPU all-reduces nothing; an unknown link is not guessed
    assert peak.allreduce_seconds(gradients, 2, "NVIDIA H100 PCIe") == pytest.approx(
        gradients / 64e9
    )
    assert peak.allreduce_seconds(gradients, 1, "NVIDIA H100 80GB HBM3") is None
    assert peak.allreduce_seconds(gradients, 4, "Some Future GPU") is None


def test_a_deterministic_run_says_why_it_has_no_input_wait(train_run):
    """TensorFlow refuses clock ops under op determinism: the run trains, and says so."""
    summary, _ = train_run("deterministic=true", "model=mlp", "model.hidden_units=[16]")
    perf = summary["perf"]
    assert perf["input_wait_fraction"] is None
    assert "deterministic=true" in perf["input_wait_note"]
    assert perf["step_time_ms"]["median"] > 0 and perf["flops_per_example"] > 0


def test_warm_up_splits_the_first_epochs_extra_time():
    """The first call's tracing (and compiling), the first validation's, the rest; and what a
    steady epoch spends outside its calls and validation (saving, logs)."""
    from tfrecipe.perf.clock import StepClock

    clock = StepClock(None)
    assert clock.warm_up() is None  # no epochs yet
    clock.calls = [(0, 10, 2.0), (0, 10, 0.2), (1, 10, 0.1), (1, 10, 0.1)]
    clock._walls = [(3.0, 2.2, 0.5), (0.5, 0.2, 0.1)]  # (wall, calls, validation) per epoch
    clock._tracing._spans = {"first_call": 1.2, "first_validation": 0.1}  # TensorFlow's counter
    assert clock.warm_up() == {
        "first_call": 1.9,  # 2.0 s against 10 steady steps of 10 ms
        "first_validation": 0.4,
        "tracing": 1.3,  # of those two, Python traced into graphs
        "compile": 1.0,  # the rest of those two: the programs built (with XLA, compiled)
        "first_epoch_rest": 0.2,
        "epoch_end": 0.2,
    }


def test_the_first_calls_tracing_is_read_from_tensorflows_counter():
    """compat.tracing_seconds moves by the time a tf.function takes to trace, and not when a
    traced function runs again."""
    import tensorflow as tf

    from tfrecipe import compat

    @tf.function
    def doubled(x):
        return x * 2

    before = compat.tracing_seconds()
    doubled(tf.constant(1.0))
    traced = compat.tracing_seconds()
    doubled(tf.constant(2.0))
    assert traced > before and compat.tracing_seconds() == traced
