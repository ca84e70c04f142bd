"""tfrecipe's floors: a module imports only from its own floor or the ones below, and no two
modules import each other, directly or round a longer loop. Read from the source with `ast`
(every import counts: module level, inside a function, under TYPE_CHECKING); nothing is imported.

A new module gets a floor in LAYERS; a test failing here names the import that points up or the
modules of the loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tfrecipe"

# Bottom first. An entry is a module, or a package standing for its modules not listed on their own.
LAYERS: list[tuple[str, ...]] = [
    # what every floor uses: errors, the private APIs, command-line grants, secrets, the reader
    (
        "tfrecipe.errors",
        "tfrecipe.files",
        "tfrecipe.reading",
        "tfrecipe.compat",
        "tfrecipe.graph",
        "tfrecipe.config.command_line",
        "tfrecipe.config.trust",
        "tfrecipe.config.secrets",
        "tfrecipe.printed",
        "tfrecipe.config.targets",
        "tfrecipe.config.grants",
        "tfrecipe.config.__init__",
    ),
    # the run dir: its files, how a run ends, the dtype policy; what each export format (a file
    # of the run dir) can carry; where XLA keeps compiled programs (outside run dirs); a weights
    # file written beside training; which form a warm start's source is
    (
        "tfrecipe.rundir",
        "tfrecipe.weights_file",
        "tfrecipe.outcome",
        "tfrecipe.init_source",
        "tfrecipe.precision",
        "tfrecipe.config.export_limits",
        "tfrecipe.config.compile_cache",
    ),
    # reading a config: Hydra's composition, the allow-listed instantiation, their checks
    (
        "tfrecipe.config.compose",
        "tfrecipe.config.instantiate",
        "tfrecipe.config.doors",
        "tfrecipe.config.sink_sites",
        "tfrecipe.config.hydra_node",
        "tfrecipe.config.hydra_keys",
        "tfrecipe.config.checks",
        "tfrecipe.config.argument_types",
        "tfrecipe.config.changes",
    ),
    # what is learned and from what: the tasks, the datasets; what a trained model takes and
    # what its outputs mean (the signature, which asks the tasks)
    ("tfrecipe.tasks", "tfrecipe.data", "tfrecipe.data.table_layout", "tfrecipe.signature"),
    # the typed config, which asks the tasks and the data pipeline for their names: its sections,
    # the text of a problem, the rules across sections, and validate, which runs them all
    (
        "tfrecipe.config.training_sections",
        "tfrecipe.config.run_sections",
        "tfrecipe.config.plan",
        "tfrecipe.config.messages",
        "tfrecipe.config.step_checks",
        "tfrecipe.config.cross_checks",
        "tfrecipe.config.schema",
    ),
    # the building blocks a run is made of
    (
        "tfrecipe.optim",
        "tfrecipe.models",
        "tfrecipe.loops",
        "tfrecipe.distribute",
        "tfrecipe.fault",
        "tfrecipe.callbacks",
        "tfrecipe.tracking",
        "tfrecipe.perf",
        "tfrecipe.runs",
    ),
    # a run, assembled
    ("tfrecipe.training", "tfrecipe.train"),
    # the ways in: the command line (its dispatch, the training command with its pre-check, Hydra
    # job and sweep bookkeeping, the subcommands), the package's public names
    (
        "tfrecipe.cli.main",
        "tfrecipe.cli.hydra_errors",
        "tfrecipe.cli.train_command",
        "tfrecipe.cli.precheck",
        "tfrecipe.cli.job",
        "tfrecipe.cli.sweep_jobs",
        "tfrecipe.cli",
        "tfrecipe.__init__",
        "tfrecipe.__main__",
    ),
]


def _modules() -> dict[str, Path]:
    """Module name -> file; a package's own file is named NAME.__init__."""
    return {
        ".".join(("tfrecipe", *path.relative_to(PACKAGE).with_suffix("").parts)): path
        for path in PACKAGE.rglob("*.py")
    }


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module an imported name lives in (`from tfrecipe import optim`: tfrecipe.optim)."""
    while name:
        for candidate in (name, f"{name}.__init__"):
            if candidate in modules:
                return candidate
        name = name.rpartition(".")[0]
    return None


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name == "tfrecipe" or name.startswith("tfrecipe."):
                    target = _resolve(name, modules)
                    if target is not None and target != module:
                        found.add(target)
        graph[module] = found
    return graph


def _floor(module: str) -> int | None:
    """The index in LAYERS of the longest entry naming `module` or a package holding it."""
    best: tuple[int, int] | None = None
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            package = entry.removesuffix(".__init__")
            exact = module == entry
            inside = not entry.endswith(".__init__") and module.startswith(f"{package}.")
            if (exact or inside) and (best is None or len(entry) > best[1]):
                best = (index, len(entry))
    return None if best is None else best[0]


def test_every_module_has_a_floor():
    unplaced = sorted(module for module in _modules() if _floor(module) is None)
    assert not unplaced, f"give these modules a floor in LAYERS: {unplaced}"


def test_imports_point_only_down():
    upward = [
        f"{module} (floor {_floor(module)}) imports {target} (floor {_floor(target)})"
        for module, targets in _imports(_modules()).items()
        for target in sorted(targets)
        if None not in (_floor(module), _floor(target)) and _floor(target) > _floor(module)
    ]
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = _imports(_modules())
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_graph_holds_every_kind_of_import():
    """The checks above can fail: the graph holds module-level, `from tfrecipe import X` and
    function-level imports, and the floors order the modules."""
    graph = _imports(_modules())
    assert "tfrecipe.rundir" in graph["tfrecipe.outcome"]  # from tfrecipe import rundir
    assert "tfrecipe.train" in graph["tfrecipe.cli.job"]  # inside _train()
    assert _floor("tfrecipe.cli.job") > _floor("tfrecipe.train") > _floor("tfrecipe.errors")
    assert _floor("tfrecipe.data.tabular") == _floor("tfrecipe.data.__init__")
