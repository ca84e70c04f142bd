"""What a sweep ends with: SWEEP_DIR/sweep.json, a table on the console and sweep.png, naming
the best job and the command line that reruns it.

Everything is read from the sweep directory (each job's summary.json and Hydra's
`.hydra/overrides.yaml`), never from the memory of the process that launched the jobs: jobs may
run in joblib workers or as SLURM jobs. A sweep resumed or extended into the same directory
rewrites the one file with every job there, and keeps the list of its invocations.

The best job is the completed job with the best value of the sweep's metric: `sweep.metric`, else
the objective an optimizing sweeper (Optuna) optimized in its direction, else the validation value
of the task's main metric (val_accuracy, val_auc, val_mae, ...). A failed, preempted or unfinished
job is listed as such and never wins. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from tfrecipe.files import write_atomic
from tfrecipe.printed import printable
from tfrecipe.rundir import SUMMARY, summary_value
from tfrecipe.runs import RunDir

SWEEP_FILE = "sweep.json"
SWEEP_PLOT = "sweep.png"
# What a sweep writes into its dir (Hydra's record, the report, the Optuna sweeper's results and
# default study), and replaces when it runs there again: a file of these names that no sweep wrote
# is refused (cli.precheck.claim_sweep_dir).
SWEEP_RECORDS = ("multirun.yaml", SWEEP_FILE, SWEEP_PLOT, "optimization_results.yaml", "study.db")


@dataclasses.dataclass(frozen=True)
class SweepSetup:
    """What the launching process knows of a sweep before it starts.

    Attributes:
      sweep_dir: `hydra.sweep.dir`, resolved once (the jobs get it pinned).
      metric: the summary value that picks the best job (`rundir.summary_value`'s names).
      direction: "max" or "min".
      chosen_by: where the metric came from, in the user's words.
      command: how the command line starts before the overrides (`python -m tfrecipe` plus
        --config-dir/--config-name when given).
      run_mode: the rerun needs `hydra.mode=RUN` (a config file asked for the multirun).
      mlflow_uri: the MLflow store the jobs log to (`logger=mlflow`), else None.
      recipes: (stem, path as the user typed it) of each `recipe=PATH.yaml` on the command line:
        the jobs' overrides name it by its stem (how Hydra finds it); the rerun names the file.
    """

    sweep_dir: Path
    metric: str
    direction: str
    chosen_by: str
    command: tuple[str, ...] = ("python", "-m", "tfrecipe")
    run_mode: bool = False
    mlflow_uri: str | None = None
    recipes: tuple[tuple[str, str], ...] = ()


def plan_from(cfg, sweep_dir: Path, *, command: Sequence[str], run_mode: bool) -> SweepSetup:
    """The plan of a sweep whose first job composes to `cfg` (a config with Hydra's node)."""
    metric, direction, chosen_by = _metric(cfg)
    return SweepSetup(
        sweep_dir,
        metric,
        direction,
        chosen_by,
        tuple(command),
        run_mode,
        _mlflow_uri(cfg, sweep_dir),
    )


def _mlflow_uri(cfg, sweep_dir: Path) -> str | None:
    """Where the jobs' MLflow runs go (`tfrecipe.tracking.mlflow_run.tracking_uri`)."""
    if OmegaConf.select(cfg, "logger.mlflow", default=None) is None:
        return None
    import os

    from tfrecipe.tracking.mlflow_store import DEFAULT_STORE

    return (
        OmegaConf.select(cfg, "logger.mlflow.tracking_uri", default=None)
        or os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{(sweep_dir / DEFAULT_STORE).resolve()}"
    )


def _metric(cfg) -> tuple[str, str, str]:
    """(metric, direction, where it came from): sweep.metric, the Optuna objective, the task's."""
    from tfrecipe.tasks import DEFAULT_TASK, main_metric_named, monitor_mode

    metric = OmegaConf.select(cfg, "sweep.metric", default=None)
    if metric:
        return metric, direction_of(metric), "sweep.metric"
    sweeper = str(OmegaConf.select(cfg, "hydra.sweeper._target_", default="") or "")
    direction = OmegaConf.select(cfg, "hydra.sweeper.direction", default=None)
    if "optuna" in sweeper.lower() and isinstance(direction, str):
        objective = str(OmegaConf.select(cfg, "sweep.objective", default="val_loss"))
        mode = "max" if direction.lower().startswith("max") else "min"
        return objective, mode, f"sweep.objective ({direction}, as the sweeper optimized it)"
    task = str(OmegaConf.select(cfg, "task.name", default=None) or DEFAULT_TASK)
    metric = f"val_{main_metric_named(task)}"
    return metric, monitor_mode(metric), f"task={task}'s main metric"


# Summary numbers besides the task's metrics that are better bigger (`compare`'s columns too).
_HIGHER_IS_BETTER = ("examples_per_sec", "mfu", "steps_share")


def direction_of(name: str) -> str:
    """ "max" or "min" for a number by its name: throughput up, the task's metrics (also under
    val_/test_) as tfrecipe.tasks says, anything else (loss, wall_time_s) down."""
    from tfrecipe.tasks import monitor_mode

    if name in _HIGHER_IS_BETTER:
        return "max"
    return monitor_mode(name.removeprefix("test_"))


@dataclasses.dataclass
class Job:
    number: int
    run_dir: Path
    overrides: dict[str, str]
    status: str  # completed | failed | preempted | running (killed) | not started
    metric: float | None
    metrics: dict[str, float | None]
    wall_time_s: float | None

    def record(self, plan: SweepSetup) -> dict[str, Any]:
        return {
            "job": self.number,
            "run_dir": str(self.run_dir),
            "overrides": self.overrides,
            "status": self.status,
            plan.metric: self.metric,
            "metrics": self.metrics,
            "wall_time_s": self.wall_time_s,
        }


def recipe_paths(argv: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """(stem, path as typed) of each `recipe=PATH.yaml` among a command line's overrides."""
    typed = (str(arg).partition("=")[2] for arg in argv if str(arg).startswith("recipe="))
    return tuple((Path(v).expanduser().stem, v) for v in typed if v.endswith((".yaml", ".yml")))


def find_jobs(sweep_dir: Path, metric: str) -> list[Job]:
    """Every job directory of the sweep (`_job_dirs`), in job order. A job's overrides are kept
    with every secret redacted (`printed.redact_words`): sweep.json and the table never hold
    one."""
    jobs = []
    for run_dir in _job_dirs(sweep_dir):
        overrides_file = run_dir / ".hydra" / "overrides.yaml"
        overrides = _overrides(overrides_file)
        summary = RunDir.at(run_dir).summary() or {}
        status = str(summary.get("status", "not started"))
        tested = [f"test_{name}" for name in summary.get("test") or {} if name != "loss"]
        jobs.append(
            Job(
                number=_job_number(run_dir, len(jobs)),
                run_dir=run_dir.resolve(),
                overrides=overrides,
                status=status,
                metric=summary_value(summary, metric),
                metrics={name: summary_value(summary, name) for name in tested[:1]},
                wall_time_s=summary.get("wall_time_s"),
            )
        )
    return sorted(jobs, key=lambda job: job.number)


# Directories that hold copies of runs, not runs: MLflow's artifact stores (a sweep that logged to
# MLflow keeps its jobs' summary.json and history.csv there too).
COPIES = ("mlartifacts", "mlruns")


def _job_dirs(directory: Path) -> Iterator[Path]:
    """The job directories under a sweep dir, in name order: each a directory with Hydra's
    overrides or a summary.json, as deep as `hydra.sweep.subdir` puts them (`runs/${...}`).
    Nothing inside a job is another job (an ensemble's members), nor MLflow's copies of runs;
    a link is no job's (Hydra makes each job's dir), so a job never names a directory outside
    the sweep dir."""
    children = (p for p in directory.iterdir() if not p.is_symlink() and p.is_dir())
    for child in sorted(children):
        if (child / ".hydra" / "overrides.yaml").is_file() or (child / SUMMARY).is_file():
            yield child
        elif child.name not in COPIES and not child.name.startswith("."):
            yield from _job_dirs(child)  # a level of hydra.sweep.subdir, or no job's at all


def _overrides(path: Path) -> dict[str, str]:
    from tfrecipe import printed, reading

    try:
        listed = reading.read_yaml(path, what="Hydra's overrides.yaml")
    except (OSError, ValueError):  # a job dir's file is data: unreadable means none
        return {}
    if not isinstance(listed, Sequence) or isinstance(listed, str):
        return {}
    words = printed.redact_words([str(o) for o in listed if "=" in str(o)])
    pairs = (word.split("=", 1) for word in words)
    return {key: value for key, value in pairs}


def _job_number(run_dir: Path, position: int) -> int:
    """Hydra's job number: the subdir's name by default (`hydra.sweep.subdir`), else Hydra's
    record of it, else the directory's position."""
    if run_dir.name.isdigit():
        return int(run_dir.name)
    from tfrecipe import reading

    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    try:
        return int(OmegaConf.select(reading.read_yaml(hydra_file), "hydra.job.num"))
    except Exception:  # a job dir's file is data: unreadable means the position
        return position


def best_job(jobs: Sequence[Job], direction: str) -> Job | None:
    """The completed job with the best finite metric (the first of equals); None if none."""
    ranked = [
        job
        for job in jobs
        if job.status == "completed" and job.metric is not None and math.isfinite(job.metric)
    ]
    if not ranked:
        return None
    pick = max if direction == "max" else min
    return pick(ranked, key=lambda job: job.metric)


def varied_keys(jobs: Sequence[Job]) -> list[str]:
    """The override keys whose value differs between jobs, in the order they appear."""
    keys = dict.fromkeys(key for job in jobs for key in job.overrides)
    return [key for key in keys if len({job.overrides.get(key) for job in jobs}) > 1]


def rerun_words(plan: SweepSetup, job: Job) -> list[str]:
    """The words of the command that trains this job again, into a new run dir: the job's
    overrides (secrets redacted), a recipe file by the path the user typed."""
    from tfrecipe import printed

    typed = dict(plan.recipes)
    overrides = [
        f"recipe={typed[value]}" if key == "recipe" and value in typed else f"{key}={value}"
        for key, value in job.overrides.items()
    ]
    if plan.run_mode:
        overrides.append("hydra.mode=RUN")
    return printed.redact_words([*plan.command, *overrides])


def rerun_command(plan: SweepSetup, job: Job) -> str:
    """`rerun_words` as one line for a shell (each word quoted: `printed.command_line`)."""
    from tfrecipe import printed

    return printed.command_line(rerun_words(plan, job), [])


def write_report(plan: SweepSetup, *, invocation: Mapping[str, Any]) -> dict[str, Any]:
    """Writes sweep.json and sweep.png into the sweep dir; returns what sweep.json holds."""
    jobs = find_jobs(plan.sweep_dir, plan.metric)
    best = best_job(jobs, plan.direction)
    previous = _read(plan.sweep_dir / SWEEP_FILE)
    keys = varied_keys(jobs)
    report = {
        "sweep_dir": str(plan.sweep_dir),
        "metric": plan.metric,
        "direction": plan.direction,
        "chosen_by": plan.chosen_by,
        "varied": keys,
        "counts": _counts(jobs),
        "best": None if best is None else _with_command(plan, best),
        "jobs": [_with_command(plan, job) for job in jobs],
        "plot": SWEEP_PLOT if jobs else None,
        "invocations": [*previous.get("invocations", []), dict(invocation)],
    }
    if jobs:
        _plot(jobs, keys, plan, best, plan.sweep_dir / SWEEP_PLOT)
    write_atomic(plan.sweep_dir / SWEEP_FILE, json.dumps(report, indent=2) + "\n")
    return report


def _with_command(plan: SweepSetup, job: Job) -> dict[str, Any]:
    """A job's record with the command that reruns it: its words (what `tfrecipe compare`
    rebuilds the line from) and the line."""
    from tfrecipe import printed

    words = rerun_words(plan, job)
    return {**job.record(plan), "argv": words, "command": printed.command_line(words, [])}


def _read(path: Path) -> dict[str, Any]:
    """The sweep.json the sweep dir holds, through the one reader; {} where there is none, or
    what is there is no report (a link to /dev/zero, a FIFO, damaged JSON: data, replaced)."""
    from tfrecipe import reading

    try:
        report = reading.read_json(path, what="a sweep.json")
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def read_report(sweep_dir: Path) -> dict[str, Any] | None:
    """sweep.json of a sweep dir, None where there is none (or it is not one).

    Raises:
      reading.UnreadableFile: sweep.json is not a regular file of a report's size, or not JSON.
    """
    from tfrecipe import reading

    path = sweep_dir / SWEEP_FILE
    if not path.is_symlink() and not path.exists():
        return None
    report = reading.read_json(path, what="a sweep.json")
    return report if isinstance(report, dict) and isinstance(report.get("jobs"), list) else None


def _counts(jobs: Sequence[Job]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.status] = counts.get(job.status, 0) + 1
    return counts


def invocation(argv: Sequence[str], started: float) -> dict[str, Any]:
    from tfrecipe import printed

    return {
        "argv": printed.redact_words(argv),
        "started": _timestamp(started),
        "ended": _timestamp(time.time()),
    }


def _timestamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(seconds))


def console_text(report: Mapping[str, Any]) -> str:
    """The table (a row per job: what differs, status, the metric, the first test metric, wall
    time; the best job marked *), then the best job and how to rerun it. Every cell read from
    a job's files is shown with its control characters escaped (`printed.printable`)."""
    from tfrecipe import printed
    from tfrecipe.cli.display import number

    jobs, metric, keys = report["jobs"], report["metric"], report["varied"]
    best = report["best"]
    extra = list(dict.fromkeys(n for job in jobs for n in job["metrics"] if n != metric))
    header = ["job", *keys, "status", metric, *extra, "wall_s", ""]
    rows = [
        [
            str(job["job"]),
            *(job["overrides"].get(key, "") for key in keys),
            job["status"],
            "" if job[metric] is None else number(job[metric]),
            *("" if job["metrics"].get(n) is None else number(job["metrics"][n]) for n in extra),
            "" if job["wall_time_s"] is None else f"{job['wall_time_s']:.1f}",
            "*" if best and job["run_dir"] == best["run_dir"] else "",
        ]
        for job in jobs
    ]
    header, rows = (
        [printed.printable(c) for c in header],
        [list(map(printed.printable, r)) for r in rows],
    )
    widths = [max(map(len, column)) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    counts = ", ".join(f"{n} {status}" for status, n in report["counts"].items())
    lines.insert(0, f"sweep: {len(jobs)} jobs ({counts})")
    lines.extend(map(printed.printable, _best_lines(report, number)))
    sweep_dir = Path(report["sweep_dir"])
    plot = f" and {sweep_dir / report['plot']}" if report.get("plot") else ""
    lines.append(printed.printable(f"wrote {sweep_dir / SWEEP_FILE}{plot}"))
    return "\n".join(lines)


def _best_lines(report: Mapping[str, Any], number: Callable[[float], str]) -> list[str]:
    """The best job, by what and how it was chosen, and the command that reruns it."""
    best, metric, keys = report["best"], report["metric"], report["varied"]
    if best is None:
        return [f"best: none (no completed job has {metric})"]
    shown = " ".join(f"{key}={best['overrides'].get(key, '')}" for key in keys)
    return [
        f"best: job {best['job']} ({shown or best['run_dir']}): {metric}="
        f"{number(best[metric])} ({report['direction']}; {report['chosen_by']})",
        f"rerun: {best['command']}",
    ]


def _plot(jobs: Sequence[Job], keys: list[str], plan: SweepSetup, best: Job | None, path: Path):
    """sweep.png: the metric against each varied key, a panel per key (numbers on a number
    axis, other values as categories in job order); the best job is a star, jobs without the
    metric (failed, preempted, unfinished) are counted in the title."""
    from matplotlib.figure import Figure

    scored = [j for j in jobs if j.metric is not None and math.isfinite(j.metric)]
    panels = keys or ["job"]
    fig = Figure(figsize=(4.2 * len(panels), 3.8))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, key in zip(axes, panels, strict=True):
        # a job's file's text, its control codes escaped (a glyph the font lacks otherwise)
        values = [
            str(j.number) if key == "job" else printable(j.overrides.get(key, "")) for j in jobs
        ]
        numeric = _as_numbers(values)
        if numeric is None:
            categories = list(dict.fromkeys(values))
            position = {v: i for i, v in enumerate(categories)}
            ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
        by_job = {j.number: v for j, v in zip(jobs, numeric or values, strict=True)}
        for job in scored:
            x = by_job[job.number] if numeric is not None else position[by_job[job.number]]
            star = best is not None and job.number == best.number
            ax.plot(
                [x],
                [job.metric],
                marker="*" if star else "o",
                markersize=14 if star else 7,
                color="tab:red" if star else "tab:blue",
            )
        if numeric is not None and _spans_decades(numeric):
            ax.set_xscale("log")
        ax.set_xlabel(printable(key))
        ax.set_ylabel(plan.metric)
        ax.grid(alpha=0.3)
    unscored = len(jobs) - len(scored)
    title = f"{plan.metric} ({plan.direction}) per job; * best"
    fig.suptitle(title + (f"; {unscored} job(s) without it not shown" if unscored else ""))
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    write_atomic(path, buffer.getvalue())


def _as_numbers(values: Sequence[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def _spans_decades(numbers: Sequence[float]) -> bool:
    positive = [n for n in numbers if n > 0]
    return len(positive) == len(numbers) and max(positive) / min(positive) >= 100
