"""The code's shape, held where a review found it drifting (issue 32): no big rooms, no long
functions, the whole config in few hands, the task table asked rather than re-encoded.

A failure names the file or function to split, or the comparison to move into `tfrecipe/tasks/`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tfrecipe"
TASK_NAMES = frozenset({"classification", "binary", "multilabel", "regression"})

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60
LONG_FUNCTION_LINES = 40
MAX_LONG_FUNCTIONS = 20
TRAIN_MAX_LINES = 300
TRAIN_MAX_IMPORTS = 15
# Outside config/, only these take the whole config: the entry, the plan, the sidecar evaluator.
WHOLE_CONFIG_TAKERS = 3

pytestmark = pytest.mark.fast


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text())) for path in sorted(PACKAGE.rglob("*.py"))]


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _where(path: Path, node: ast.AST | None = None) -> str:
    relative = path.relative_to(PACKAGE.parent)
    return f"{relative}:{node.lineno} {node.name}" if node is not None else str(relative)


def _outside(path: Path, *folders: str) -> bool:
    return path.relative_to(PACKAGE).parts[0] not in folders


def test_no_file_is_a_big_room():
    big = {
        _where(path): n
        for path, _ in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not big, f"split these files (over {MAX_FILE_LINES} lines): {big}"


def test_functions_stay_short():
    lengths = {
        _where(path, f): f.end_lineno - f.lineno + 1
        for path, tree in _modules()
        for f in _functions(tree)
    }
    too_long = {where: n for where, n in lengths.items() if n > MAX_FUNCTION_LINES}
    long = sorted((n, where) for where, n in lengths.items() if n > LONG_FUNCTION_LINES)
    assert not too_long, f"split these functions (over {MAX_FUNCTION_LINES} lines): {too_long}"
    assert len(long) <= MAX_LONG_FUNCTIONS, (
        f"{len(long)} functions over {LONG_FUNCTION_LINES} lines (at most {MAX_LONG_FUNCTIONS}): {long}"
    )


def test_train_reads_as_a_list_of_steps():
    path = PACKAGE / "train.py"
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfrecipe"):
            if node.module == "tfrecipe":  # `from tfrecipe import rundir, tasks`: each a module
                imported.update(f"tfrecipe.{alias.name}" for alias in node.names)
            else:
                imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names if a.name.startswith("tfrecipe"))
    lines = len(path.read_text().splitlines())
    assert lines <= TRAIN_MAX_LINES, f"train.py has {lines} lines (at most {TRAIN_MAX_LINES})"
    assert len(imported) <= TRAIN_MAX_IMPORTS, (
        f"train.py imports {len(imported)} tfrecipe modules (at most {TRAIN_MAX_IMPORTS}): "
        f"{sorted(imported)}"
    )


def _takes_whole_config(function: ast.FunctionDef) -> bool:
    arguments = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    return any(
        a.annotation is not None and ast.unparse(a.annotation).split(".")[-1] == "RunConfig"
        for a in arguments
    )


def test_few_functions_take_the_whole_config():
    takers = [
        _where(path, f)
        for path, tree in _modules()
        if _outside(path, "config")
        for f in _functions(tree)
        if _takes_whole_config(f)
    ]
    assert len(takers) <= WHOLE_CONFIG_TAKERS, (
        f"stages take their own config section and the plan, not RunConfig: {takers}"
    )


def _task_names_in(node: ast.AST) -> set[str]:
    values = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {v.value for v in values if isinstance(v, ast.Constant) and v.value in TASK_NAMES}


def test_only_the_task_table_knows_the_tasks():
    """A comparison with a task's name, or a table keyed by them, outside tasks/ and config/."""
    found = []
    for path, tree in _modules():
        if not _outside(path, "tasks", "config"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                named = set().union(*(_task_names_in(side) for side in sides))
                if named and "task" in ast.unparse(node):
                    found.append(f"{_where(path)}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if len(keys & TASK_NAMES) >= 2:
                    found.append(f"{_where(path)}:{node.lineno} a table keyed by task names")
    assert not found, f"ask tfrecipe.tasks instead: {found}"


# --- measured on the formatted code (issue 46): the formatter stays on -----------------------
MAX_FMT_SKIPS = 10  # each only for a table whose columns line up
STAGE_MAX_PARAMETERS = 6  # train.py and training/: a stage takes its sections and the context
RUFF = Path(sys.executable).with_name("ruff")


def test_the_formatter_stays_on():
    """`ruff format --check` passes on the package, the tests and the scripts, and the markers
    that switch it off stay few (none in train.py and training/)."""
    if not RUFF.exists():
        pytest.skip(f"ruff is not installed beside {sys.executable} (the dev extra)")
    root = PACKAGE.parent
    checked = subprocess.run(
        [str(RUFF), "format", "--check", "tfrecipe", "tests", "scripts"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, f"run `ruff format`:\n{checked.stdout}{checked.stderr}"
    markers = {
        _where(path): n for path, _ in _modules() if (n := path.read_text().count("# fmt: skip"))
    }
    assert sum(markers.values()) <= MAX_FMT_SKIPS, f"formatter switched off: {markers}"
    in_training = [w for w in markers if w == "tfrecipe/train.py" or "/training/" in w]
    assert not in_training, f"no `# fmt: skip` in train.py and training/: {in_training}"


def test_stages_take_few_parameters():
    """A stage of train.py and training/ takes its own sections, the RunContext and what was
    built before: a longer list is a small frozen dataclass."""
    wide = {
        _where(path, f): n
        for path, tree in _modules()
        if path.name == "train.py" or "training" in path.relative_to(PACKAGE).parts
        for f in _functions(tree)
        if (n := len(_parameters(f))) > STAGE_MAX_PARAMETERS
    }
    assert not wide, f"more than {STAGE_MAX_PARAMETERS} parameters: {wide}"


def _parameters(function: ast.FunctionDef) -> list[str]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [name for name in names if name not in ("self", "cls")]
