"""Checks that a `_target_` exists and accepts its arguments, without importing it.

`tfrecipe validate` must answer in a fraction of a second, and importing a model builder imports
TensorFlow (seconds). So the target is found by reading source: the module's file is located on
`sys.path`, parsed with `ast`, and `from x import name` re-exports (how keras exposes its public
API) are followed to the `def` or `class` that defines the name.
"""

from __future__ import annotations

import ast
import copy
import functools
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar


class Unresolvable(Exception):
    """The target's source could not be found or read (e.g. a compiled extension)."""


@functools.cache
def _module_ast(module: str) -> ast.Module:
    parts = module.split(".")
    for entry in sys.path:
        base = Path(entry or ".").joinpath(*parts)
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return ast.parse(path.read_text(), filename=str(path))
    raise Unresolvable(f"module {module!r} not found")


def _resolve_relative(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".")
    package = package if is_package else package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _package_dir(module: str) -> Path | None:
    """The folder of package `module` on `sys.path` (None: not a package)."""
    for entry in sys.path:
        folder = Path(entry or ".").joinpath(*module.split("."))
        if (folder / "__init__.py").is_file():
            return folder
    return None


def _is_package(module: str) -> bool:
    return _package_dir(module) is not None


def find_definition(target: str) -> ast.FunctionDef | ast.ClassDef:
    """The `def`/`class` that `target` ("pkg.module.name") names, following re-exports."""
    return _locate(target)[1]


def annotations_of(target: str) -> tuple[ast.Module, dict[str, ast.expr]]:
    """(the module that defines `target`, each annotated parameter's annotation): what
    `tfrecipe.config.argument_types` checks configured values against.

    Raises:
      Unresolvable: the target's source cannot be found.
    """
    module, definition = _locate(target)
    args = _parameters(definition)
    if args is None:
        return _module_ast(module), {}
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return _module_ast(module), {a.arg: a.annotation for a in every if a.annotation is not None}


def _locate(target: str, _depth: int = 0) -> tuple[str, ast.FunctionDef | ast.ClassDef]:
    """(the module that defines `target`, its `def`/`class`), following re-exports."""
    if _depth > 10:
        raise Unresolvable(f"too many re-exports for {target!r}")
    module, _, name = target.rpartition(".")
    if not module:
        raise Unresolvable(f"{target!r} is not a dotted path")
    try:
        tree = _module_ast(module)
    except Unresolvable:
        # "pkg.module.Class.method" or a submodule attribute: not supported for targets.
        raise Unresolvable(f"cannot find module {module!r}") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return module, node
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = _resolve_relative(module, node, _is_package(module))
                    return _locate(f"{source}.{alias.name}", _depth + 1)
    raise Unresolvable(f"{name!r} is not defined in module {module!r}")


def _parameters(definition: ast.FunctionDef | ast.ClassDef) -> ast.arguments | None:
    """The parameters a caller fills, as a new node: the tree is cached and must stay as parsed
    (dropping `self` from it in place made a second check of the class lose a parameter)."""
    if isinstance(definition, ast.FunctionDef):
        return definition.args
    for node in definition.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = copy.copy(node.args)
            # Without `self`, which the caller never passes.
            if args.posonlyargs:
                args.posonlyargs = args.posonlyargs[1:]
            else:
                args.args = args.args[1:]
            return args
    return None  # inherited __init__: not checked


def argument_problems(target: str, given: Iterable[str]) -> list[str]:
    """What is wrong with calling `target` with keyword arguments `given` (empty: nothing).

    Raises:
      Unresolvable: the target's source cannot be found.
    """
    args = _parameters(find_definition(target))
    if args is None:
        return []
    given = set(given)
    positional = [*args.posonlyargs, *args.args]
    names = {a.arg for a in [*positional, *args.kwonlyargs]}
    problems = []
    if args.kwarg is None:
        problems += [f"unexpected argument {name!r}" for name in sorted(given - names)]
    required = [a.arg for a in positional[: len(positional) - len(args.defaults)]]
    required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    problems += [f"missing argument {name!r}" for name in required if name not in given]
    return problems


# --- tfrecipe's own builders, marked where they are defined ----------------------------------------
_F = TypeVar("_F", bound=Callable)


def config_target(function: _F) -> _F:
    """Marks one of tfrecipe's functions as a target a config may name (a model or dataset
    builder). The allow-list finds the mark in the source (`marked_targets`), so a new builder is
    its module, its YAML and this line; the function itself is unchanged."""
    return function


@functools.cache
def marked_targets(package: str) -> tuple[str, ...]:
    """The functions of `package`'s modules marked `@config_target`, each by the name configs use:
    the package's own (`tfrecipe.models.mlp`) where its `__init__` re-exports it, else the
    module's (`tfrecipe.data.npz.load`). Read from source, nothing imported."""
    reexported = _reexports(package)
    found = []
    for module in _package_modules(package):
        for node in _module_ast(module).body:
            if isinstance(node, ast.FunctionDef) and any(_is_mark(d) for d in node.decorator_list):
                path = f"{module}.{node.name}"
                found.append(reexported.get(path, path))
    return tuple(sorted(found))


def _is_mark(decorator: ast.expr) -> bool:
    name = decorator.attr if isinstance(decorator, ast.Attribute) else getattr(decorator, "id", "")
    return name == config_target.__name__


def _package_modules(package: str) -> list[str]:
    folder = _package_dir(package)
    if folder is None:
        raise Unresolvable(f"package {package!r} not found")
    return [f"{package}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem[0] != "_"]


def _reexports(package: str) -> dict[str, str]:
    """{module path of a name: the package's path for it} for `from package.m import name`."""
    names = {}
    for node in _module_ast(package).body:
        if isinstance(node, ast.ImportFrom):
            source = _resolve_relative(package, node, is_package=True)
            for alias in node.names:
                names[f"{source}.{alias.name}"] = f"{package}.{alias.asname or alias.name}"
    return names
