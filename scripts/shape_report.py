"""The code-shape figures of issue #46's Targets table, measured on the formatted code.

The package is copied to a temporary folder, every `# fmt: skip` marker is stripped, and the
project's own `ruff format` runs on the copy; the figures are read from that copy with `ast`
(nothing is imported). The marker count is read from the tree as it is.

    .venv/bin/python scripts/shape_report.py            # a table
    .venv/bin/python scripts/shape_report.py --json     # the same figures as JSON
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"\s*# fmt: skip\b")
# The names a run dir holds (tfrecipe/rundir.py's LAYOUT): a file that spells one of them as a
# string of its own names a run-dir file.
RUN_DIR_NAMES = {
    "config.yaml",
    "summary.json",
    "signature.json",
    "history.csv",
    "data_stats.json",
    "data_fingerprint.json",
    "curves.png",
    "model.keras",
    "best.weights.h5",
    "backup",
    "exports",
    "members",
    ".tfrecipe-files",
}
ROUND_NAMED_TESTS = ("test_newcomer", "test_reliability", "test_rough_edges")


def formatted_copy(package: Path, into: Path) -> Path:
    """`package` copied under `into`, markers stripped, then `ruff format`ted."""
    copy = into / package.name
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path in copy.rglob("*.py"):
        text = path.read_text()
        stripped = "\n".join(MARKER.sub("", line) for line in text.split("\n"))
        if stripped != text:
            path.write_text(stripped)
    ruff = Path(sys.executable).with_name("ruff")
    subprocess.run(
        [
            str(ruff if ruff.exists() else "ruff"),
            "format",
            "-q",
            "--config",
            str(ROOT / "pyproject.toml"),
            str(copy),
        ],
        check=True,
    )
    return copy


def _functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _parameters(function) -> list[str]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [name for name in names if name not in ("self", "cls")]


def _field_names(tree: ast.AST) -> set[ast.AST]:
    """Strings used as a mapping's keys (summary.json's "members", "exports"), not as names of
    files: dict keys, subscripts and `.get(...)`'s first argument."""
    found: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found.update(k for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            found.add(node.slice)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and node.args:
            found.add(node.args[0])
    return found


def _path_parts(tree: ast.AST) -> set[ast.AST]:
    """Strings used as parts of a path: an operand of `/`, an argument of `Path(...)`,
    `os.path.join(...)` or `.joinpath(...)`."""
    found: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found.update((node.left, node.right))
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name in ("Path", "join", "joinpath", "PurePath"):
                found.update(node.args)
    return found


def _names_a_run_dir_file(node: ast.AST, keys: set[ast.AST], parts: set[ast.AST]) -> bool:
    """A file name with a suffix (`summary.json`) names a run-dir file wherever it is not a
    mapping's key; a bare word (`exports`, `members`, `backup`: also summary.json's field names
    and plain words) only where it is part of a path."""
    if not isinstance(node, ast.Constant) or node.value not in RUN_DIR_NAMES or node in keys:
        return False
    return "." in node.value or node in parts


def measure(package: Path, original: Path, tests: Path) -> dict:
    markers = {p: p.read_text().count("# fmt: skip") for p in original.rglob("*.py")}
    in_training = sum(
        n for p, n in markers.items() if p.name == "train.py" or "training" in p.parts
    )
    lengths, over_8, most_in_training, big_calls = [], 0, 0, 0
    allowed = run_dir = 0
    naming_files, strategy_tests = set(), 0
    file_lines, taker = {}, 0
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        relative = path.relative_to(package.parent)
        file_lines[str(relative)] = len(text.splitlines())
        tree = ast.parse(text)
        train_side = (
            path.name == "train.py" and path.parent == package
        ) or "training" in path.parts
        for function in _functions(tree):
            lengths.append(function.end_lineno - function.lineno + 1)
            params = _parameters(function)
            over_8 += len(params) > 8
            if train_side:
                most_in_training = max(most_in_training, len(params))
            allowed += sum(name in ("allowed_targets", "allowed") for name in params)
            run_dir += params.count("run_dir")
            annotations = [
                ast.unparse(a.annotation)
                for a in (*function.args.args, *function.args.kwonlyargs)
                if a.annotation is not None
            ]
            taker += "config" not in path.parts and any(
                a.endswith("RunConfig") for a in annotations
            )
        keys, parts = _field_names(tree), _path_parts(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and len(node.args) + len(node.keywords) >= 10:
                big_calls += 1
            if _names_a_run_dir_file(node, keys, parts):
                naming_files.add(str(relative))
        if path.name == "cross_checks.py":
            strategy_tests = len(re.findall(r"\b(?:strategy|loop)\.name\b", text))
    return {
        "fmt_skip_package": sum(markers.values()),
        "fmt_skip_train_and_training": in_training,
        "train_py_lines": file_lines.get(f"{package.name}/train.py"),
        "functions_over_60": sum(n > 60 for n in lengths),
        "functions_over_40": sum(n > 40 for n in lengths),
        "files_over_500": {k: v for k, v in file_lines.items() if v > 500},
        "most_params_train_and_training": most_in_training,
        "functions_over_8_params": over_8,
        "calls_with_10_args": big_calls,
        "params_allowed_targets_or_allowed": allowed,
        "params_run_dir": run_dir,
        "files_naming_run_dir_files": len(naming_files),
        "files_naming_run_dir_files_list": sorted(naming_files),
        "strategy_or_loop_name_tests_in_cross_checks": strategy_tests,
        "round_named_test_files": sum(
            1 for name in ROUND_NAMED_TESTS if list(tests.rglob(f"{name}*.py"))
        ),
        "run_config_takers_outside_config": taker,
        "median_function_lines": statistics.median(lengths),
        "files": len(file_lines),
        "lines": sum(file_lines.values()),
    }


def offenders(package: Path) -> list[str]:
    """Functions over 40 lines or with more than 6 parameters, and calls of 10+ arguments."""
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent)
        tree = ast.parse(path.read_text())
        for function in _functions(tree):
            lines = function.end_lineno - function.lineno + 1
            params = len(_parameters(function))
            if lines > 40 or params > 6:
                found.append(
                    f"{relative}:{function.lineno} {function.name}: {lines} lines, {params} params"
                )
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and len(node.args) + len(node.keywords) >= 10:
                found.append(
                    f"{relative}:{node.lineno} call {ast.unparse(node.func)}: {len(node.args) + len(node.keywords)} args"
                )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--list", action="store_true", help="also list the long functions and the wide ones"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        copy = formatted_copy(ROOT / "tfrecipe", Path(scratch))
        figures = measure(copy, ROOT / "tfrecipe", ROOT / "tests")
        if options.list:
            figures["offenders"] = offenders(copy)
    if options.json:
        print(json.dumps(figures, indent=2))
        return
    for name, value in figures.items():
        if isinstance(value, list) and name == "offenders":
            print("\n".join(value))
        else:
            print(f"{name:46} {value}")


if __name__ == "__main__":
    main()
