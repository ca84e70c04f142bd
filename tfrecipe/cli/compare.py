"""`tfrecipe compare DIR... [--sort METRIC] [--out DIR]`: compare finished runs without an account.

Reads every run directory under the given directories (a multirun dir or run dirs), prints one
row per run (the overrides that differ between runs, status, final metrics, examples/sec, wall
time, step time, input wait and MFU, and where runs ran on other hardware or versions, how)
sorted by a metric, and writes `compare.csv` plus `compare.png` (learning curves overlaid).
A sweep dir's sweep.json (tfrecipe.cli.sweep_report) gives the default sort, the best job (marked
* in the table) and the command that reruns it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from tfrecipe import files, printed, reading
from tfrecipe.cli.sweep_report import COPIES, direction_of, read_report
from tfrecipe.errors import ConfigError
from tfrecipe.files import write_atomic
from tfrecipe.perf.provenance import differences
from tfrecipe.rundir import SUMMARY, summary_value
from tfrecipe.runs import RunDir

# The metrics of runs that logged none (e.g. failed before an epoch): the default task's.
_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")
_THROUGHPUT = ("examples_per_sec", "wall_time_s")
_BASELINE = "baseline_"
# summary.json's perf block, where runs have one: column -> (key, the field of a dict value)
_PERF = {
    "step_ms": ("step_time_ms", "median"),
    "input_wait": ("input_wait_fraction", None),
    "mfu": ("mfu", None),
    "steps_share": ("wall_split", "steps"),  # of the wall time
}


def _higher_is_better(name: str) -> bool:
    """Bigger is better for throughput and the metrics tfrecipe.tasks says so of (also under
    val_/test_); everything else sorts ascending (the rule a sweep's best job is chosen by)."""
    return direction_of(name) == "max"


def columns(runs: list[Run]) -> list[str]:
    """The numbers the table shows, each a name `--sort` accepts: the metrics the runs logged
    (the task's: accuracy, auc, mae, ...) as loss, metrics, val_loss, val_ metrics, then the
    test split's (but its loss), then throughput."""
    logged = dict.fromkeys(m for run in runs for m in run.summary.get("metrics") or {})
    tested = dict.fromkeys(m for run in runs for m in run.summary.get("test") or {})
    names = list(logged) or list(_METRICS)
    train = [m for m in names if not m.startswith("val_") and m != "loss"]
    val = [m for m in names if m.startswith("val_") and m != "val_loss"]
    test = [f"test_{m}" for m in (tested or {"accuracy": None}) if m != "loss"]
    return [
        "loss",
        *train,
        "val_loss",
        *val,
        *test,
        *_baseline_columns(runs),
        *_best_columns(runs),
        *_THROUGHPUT,
        *(_PERF if any(run.summary.get("perf") for run in runs) else ()),
    ]


def _baseline_columns(runs: list[Run]) -> list[str]:
    """Each baseline's test number (summary.json's `baselines`: `baseline=auto`, `tfrecipe
    baseline`) beside the model's, as `baseline_NAME_METRIC` (e.g. baseline_ridge_r2)."""
    return list(
        dict.fromkeys(
            f"{_BASELINE}{name}_{run.summary['baselines']['metric']}"
            for run in runs
            if isinstance(run.summary.get("baselines"), dict)
            for name in run.summary["baselines"].get("models") or {}
        )
    )


def _best_columns(runs: list[Run]) -> list[str]:
    """The best epoch (summary.json's `best`), its monitored value and the epoch early stopping
    stopped at, where a run has them."""
    monitors = dict.fromkeys(
        f"best_{run.summary['best']['monitor']}" for run in runs if run.summary.get("best")
    )
    if not monitors:
        return []
    stopped = any(run.summary.get("stopped_epoch") for run in runs)
    return ["best_epoch", *monitors, *(["stopped_epoch"] if stopped else [])]


@dataclass
class Run:
    path: Path
    summary: dict[str, Any]
    overrides: dict[str, str]

    def value(self, metric: str) -> float | None:
        best = self.summary.get("best") or {}
        if metric == "best_epoch":
            return best.get("epoch")
        if metric.startswith("best_"):  # the best epoch's value of a metric
            return (best.get("metrics") or {}).get(metric.removeprefix("best_"))
        if metric.startswith(_BASELINE):
            return self._baseline_value(metric.removeprefix(_BASELINE))
        if metric in _PERF:
            key, field = _PERF[metric]
            value = (self.summary.get("perf") or {}).get(key)
            value = value.get(field) if isinstance(value, dict) else value
            return float(value) if isinstance(value, int | float) else None
        return summary_value(self.summary, metric)

    def _baseline_value(self, name_metric: str) -> float | None:
        baselines = self.summary.get("baselines") or {}
        for name, scores in (baselines.get("models") or {}).items():
            metric = name_metric.removeprefix(f"{name}_")
            if metric != name_metric and isinstance(scores.get(metric), int | float):
                return float(scores[metric])
        return None


def find_runs(directories: list[Path]) -> list[Run]:
    runs = []
    for directory in directories:
        if not directory.is_dir():
            raise ConfigError(f"compare: {printed.printable(directory)} is not a directory")
        found = sorted(
            (p for p in directory.rglob(SUMMARY) if not _copied(p.relative_to(directory))),
            key=_natural_key,
        )
        for summary_path in _outermost(found):
            run_dir = summary_path.parent.resolve()  # rows name runs relative to a common parent
            summary = RunDir.at(run_dir).summary()
            if summary is None:
                continue
            overrides_file = run_dir / ".hydra" / "overrides.yaml"
            overrides = _overrides(overrides_file)
            pairs = dict(str(o).split("=", 1) for o in overrides if "=" in str(o))
            runs.append(Run(run_dir, summary, pairs))
    if not runs:
        raise ConfigError(
            f"compare: no runs (summary.json) under {', '.join(map(str, directories))}"
        )
    return runs


def _outermost(summaries: list[Path]) -> list[Path]:
    """The summaries of runs that are no part of another run found beside them: an ensemble's
    members (RUN_DIR/members/I) are its run's, as its summary.json counts them."""
    runs = {path.parent for path in summaries}
    return [p for p in summaries if not any(d in runs for d in p.parent.parents)]


def _copied(relative: Path) -> bool:
    return any(part in COPIES for part in relative.parts[:-1])


def _natural_key(path: Path) -> list[tuple[int, Any]]:
    """Job dirs in number order (2 before 10), names after numbers (never an int beside a str)."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.parts]


def differing_keys(runs: list[Run]) -> list[str]:
    keys = sorted({k for run in runs for k in run.overrides})
    return [k for k in keys if len({run.overrides.get(k) for run in runs}) > 1]


def sortable(runs: list[Run]) -> list[str]:
    """The names `--sort` accepts: the table's numbers and every metric some run has."""
    names = dict.fromkeys(columns(runs))
    for run in runs:
        names |= dict.fromkeys(run.summary.get("metrics") or {})
        names |= dict.fromkeys(f"test_{name}" for name in run.summary.get("test") or {})
    return list(names)


def _sorted(runs: list[Run], metric: str) -> list[Run]:
    if metric not in sortable(runs):
        raise ConfigError(
            f"compare --sort={metric}: not a column of these runs; sortable: "
            f"{', '.join(sortable(runs))}"
        )
    sign = -1 if _higher_is_better(metric) else 1

    def key(run: Run) -> tuple[bool, float]:
        value = run.value(metric)
        missing = value is None or not math.isfinite(value)
        return missing, 0.0 if missing else sign * value

    return sorted(runs, key=key)


def ran_elsewhere(runs: list[Run]) -> dict[Path, str]:
    """Per run, how its provenance differs from the one most runs share (`hw:cpu.model`,
    `versions:tensorflow`, "?" without provenance); empty when all ran alike."""
    signatures = [
        json.dumps(_comparable(run.summary.get("provenance")), sort_keys=True) for run in runs
    ]
    common = json.loads(Counter(signatures).most_common(1)[0][0])
    marks = {run.path: differences(run.summary.get("provenance"), common) for run in runs}
    return marks if any(marks.values()) else {}


def _comparable(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """What decides whether speeds compare: hardware and versions (not the git commit)."""
    if not found:
        return None
    return {key: found.get(key) for key in ("versions", "cpu", "gpus", "hosts", "replicas")}


def table(
    runs: list[Run], keys: list[str], *, best: frozenset[Path] = frozenset()
) -> tuple[list[str], list[list[str]]]:
    """The header and a row per run; a sweep's best job (`best`: run dirs) is marked *."""
    shown = columns(runs)
    elsewhere = ran_elsewhere(runs)
    header = ["run", *keys, "status", *shown, *(["ran on"] if elsewhere else [])]
    rows = []
    common = _common_parent([run.path for run in runs])
    for run in runs:
        values = [run.value(m) for m in shown]
        name = str(run.path.relative_to(common)) if common else str(run.path)
        rows.append(
            [
                f"{name} *" if run.path in best else name,
                *(run.overrides.get(k, "") for k in keys),
                run.summary.get("status", "?"),
                *("" if v is None else f"{v:.4g}" for v in values),
                *([elsewhere[run.path] or "same"] if elsewhere else []),
            ]
        )
    return header, rows


def _best_dirs(sweeps: list[tuple[Path, dict[str, Any]]]) -> frozenset[Path]:
    """The best jobs' run dirs each sweep.json names, found in the directory it was read from:
    a sweep dir copied or moved from where it ran (fetched from a cluster) names the old paths.
    A received file: a name that is no path marks nothing."""
    found = []
    for directory, report in sweeps:
        best, ran_in = report.get("best"), report.get("sweep_dir")
        name = best.get("run_dir") if isinstance(best, dict) else None
        if not isinstance(name, str):
            continue
        if isinstance(ran_in, str) and Path(name).is_relative_to(ran_in):
            name = directory / Path(name).relative_to(ran_in)
        found.append(Path(name).resolve())
    return frozenset(found)


def sweep_winner(report: dict[str, Any]) -> str:
    """`best: ...` and `rerun: ...` from a sweep.json (or why there is no winner). The file is
    received data: every value is shown with its control characters escaped, and the rerun line
    is rebuilt from the best job's words (`rerun_line`), never printed as the file has it."""
    best, metric = report.get("best"), report.get("metric")
    where = report.get("sweep_dir")
    if not isinstance(best, dict) or not best:
        return printed.printable(f"sweep {where}: no completed job has {metric}; no best job")
    value = best.get(str(metric))
    shown = f"{value:.4g}" if isinstance(value, int | float) else value
    head = printed.printable(
        f"sweep {where}: best job {best.get('job')} ({metric}={shown}, "
        f"{report.get('direction')}; * in the table)"
    )
    return f"{head}\n{rerun_line(best)}"


_TFRECIPE = ["python", "-m", "tfrecipe"]


def rerun_line(best: dict[str, Any]) -> str:
    """`rerun: ...` rebuilt from a sweep.json's best job: its command's words (`argv`), else
    its overrides, each quoted for a shell and redacted (`printed.command_line`); none where the
    words are not a tfrecipe command."""
    words = best.get("argv")
    if words is None and isinstance(best.get("overrides"), dict):
        words = [*_TFRECIPE, *(f"{k}={v}" for k, v in best["overrides"].items())]
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        return "rerun: (sweep.json names no command words for the best job)"
    if words[:3] != _TFRECIPE:
        return "rerun: (sweep.json's command for the best job is not a tfrecipe command; not shown)"
    return f"rerun: {printed.command_line(words, [])}"


def _common_parent(paths: list[Path]) -> Path | None:
    resolved = [p.resolve() for p in paths]
    common = Path(*resolved[0].parts)
    while not all(p.is_relative_to(common) for p in resolved):
        common = common.parent
    return common if len(paths) > 1 else common.parent


def plot(runs: list[Run], keys: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = curves_figure(runs, keys)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")  # nothing cut at an edge
    plt.close(fig)
    write_atomic(path, buffer.getvalue())


def curves_figure(runs: list[Run], keys: list[str]):
    """Validation curves: val_loss, then each task's first metric (val_accuracy, val_auc,
    val_mae, ...) in a panel of its own, so runs of different tasks never share a scale (nor
    val_loss: a panel for each first metric where runs differ in it). A run keeps one colour in
    every panel; one legend below the panels names the runs (a legend inside a panel covers its
    curves, and `loc="best"` warns when placing it takes long)."""
    import matplotlib.pyplot as plt

    firsts = [_first_val_metric(run) for run in runs]  # a task's kind, by its first metric
    kinds = list(dict.fromkeys(firsts))
    losses = [("val_loss", kind if len(kinds) > 1 else None) for kind in kinds]
    panels = [*dict.fromkeys(losses), *((metric, None) for metric in filter(None, kinds))]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    palette = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    handles = {}
    for index, (run, first) in enumerate(zip(runs, firsts, strict=True)):
        label = " ".join(f"{k}={run.overrides.get(k, '')}" for k in keys) or run.path.name
        label = printed.printable(label)  # a received file's text, shown as text
        rows = _history(run)
        for ax, (metric, kind) in zip(axes[0], panels, strict=True):
            if kind is not None and kind != first:
                continue  # another task's val_loss: another scale
            name = metric if rows and metric in rows[0] else metric.removeprefix("val_")
            points = [(int(r["epoch"]), float(r[name])) for r in rows if r.get(name)]
            if points:
                x, y = zip(*points, strict=True)
                (line,) = ax.plot(x, y, marker="o", color=palette(index % palette.N))
                handles.setdefault(label, line)
    for ax, (metric, kind) in zip(axes[0], panels, strict=True):
        ax.set_title(metric if kind is None else f"{metric} (runs logging {kind})")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    if not handles:
        fig.tight_layout()
        return fig
    _legend_below(fig, list(handles.values()), list(handles))
    return fig


def _overrides(path: Path) -> list:
    """A run's `.hydra/overrides.yaml` (none: []); another's run dir is data, read as such."""
    if not os.path.lexists(path):
        return []
    try:
        overrides = OmegaConf.to_container(reading.read_yaml(path, what="Hydra's overrides.yaml"))
    except reading.UnreadableFile as error:
        raise ConfigError(f"compare: {error}") from None
    return overrides if isinstance(overrides, list) else []


def _legend_below(fig, handles: list, labels: list[str]) -> None:
    """One legend below the panels, measured until it fits the figure's width: fewer columns,
    then labels wrapped shorter (a label longer than the figure would be cut at both edges);
    the figure grows by the legend's height."""
    width = fig.get_figwidth() * fig.dpi
    renderer = fig.canvas.get_renderer()
    columns, wrap = len(labels), max(map(len, labels))
    while True:
        shown = [textwrap.fill(label, wrap) for label in labels]
        legend = fig.legend(handles, shown, loc="lower center", ncols=columns, fontsize="small")
        box = legend.get_window_extent(renderer)
        if box.width <= 0.98 * width or (columns == 1 and wrap <= 20):
            break
        legend.remove()
        if columns > 1:
            columns -= 1
        else:
            wrap = max(20, int(wrap * 0.98 * width / box.width) - 1)
    panels = fig.get_figheight()
    fig.set_figheight(panels + box.height / fig.dpi)
    fig.tight_layout(rect=(0, (box.height / fig.dpi + 0.1) / fig.get_figheight(), 1, 1))


def _history(run: Run) -> list[dict[str, str]]:
    history = RunDir.at(run.path).file("history")
    if not os.path.lexists(history):
        return []
    try:
        text = reading.read_text(history, limit=reading.MAX_JSON_BYTES, what="a history.csv")
    except reading.UnreadableFile as error:
        raise ConfigError(f"compare: {error}") from None
    return list(csv.DictReader(io.StringIO(text, newline="")))


def _first_val_metric(run: Run) -> str | None:
    """The run's task's first validation metric (val_accuracy, val_auc, val_mae, ...)."""
    logged = run.summary.get("metrics") or {}
    return next((m for m in logged if m.startswith("val_") and m != "val_loss"), None)


def main(args: list[str]) -> None:
    options = _parser().parse_args(args)
    runs = find_runs(options.dirs)
    out = _made(options.out or options.dirs[0])
    keys = differing_keys(runs)
    read = ((directory, _read_report(directory)) for directory in options.dirs)
    sweeps = [(directory, report) for directory, report in read if report is not None]
    options.sort = options.sort or (sweeps[0][1]["metric"] if sweeps else "val_loss")
    header, rows = table(_sorted(runs, options.sort), keys, best=_best_dirs(sweeps))
    _print_table(f"{len(rows)} runs, sorted by {options.sort}", header, rows, keys)
    for _, report in sweeps:  # the winner as the sweep named it, and how to train it again
        print(sweep_winner(report))
    if "ran on" in header:
        print(
            "ran on: runs marked hw:/versions: ran on other hardware or package versions than "
            "most (summary.json's provenance); their speeds do not compare"
        )
    _write_outputs(out, header, rows, runs, keys)


def _made(out: Path) -> Path:
    """`--out` (or the first DIR), made before anything is printed: a name that cannot be a
    directory (a file there or on the way) is one line."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"compare --out={printed.printable(out)}: cannot be a directory "
            f"({error.strerror}); name a directory (made if missing)"
        ) from None
    return out


def _read_report(directory: Path) -> dict[str, Any] | None:
    try:
        return read_report(directory)
    except reading.UnreadableFile as error:
        raise ConfigError(f"compare: {error}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfrecipe compare", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, help="multirun or run directories")
    parser.add_argument(
        "--sort",
        help="metric to sort by (default: a sweep's metric from sweep.json, else val_loss)",
    )
    parser.add_argument("--out", type=Path, help="where compare.csv/png go (default: first DIR)")
    return parser


def _print_table(title: str, header: list[str], rows: list[list[str]], keys: list[str]) -> None:
    """The table on the console: the run and its config keys left-aligned, numbers right."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    view = Table(title=title)
    for name in header:
        view.add_column(name, justify="left" if name == "run" or name in keys else "right")
    for row in rows:
        # `[district,kind]` is a value, not rich markup; a cell from a file shows no control codes
        view.add_row(*(escape(printed.printable(cell)) for cell in row))
    Console(width=max(120, 14 * len(header))).print(view)


def _write_outputs(
    out: Path, header: list[str], rows: list[list[str]], runs: list[Run], keys: list[str]
) -> None:
    """compare.csv (the table) and compare.png (the learning curves) in `out` (`_made`)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    # The one writer's rules in that dir: compare.csv/png are replaced only when a compare wrote
    # them (its manifest says so), never a file of the user's or of a run by those names.
    files.Manifest.of(out).own()
    try:
        write_atomic(out / "compare.csv", buffer.getvalue())
        plot(runs, keys, out / "compare.png")
    finally:
        files.Manifest.of(out).release()
    print(f"wrote {out / 'compare.csv'} and {out / 'compare.png'}")
