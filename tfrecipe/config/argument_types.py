"""Every `_target_`'s configured arguments checked against the types its signature declares,
read from source (`tfrecipe.config.targets`), so `validate` refuses `model.hidden_units=512`
(a `Sequence[int]`) in milliseconds instead of the builder failing after TensorFlow loaded.

An annotation this module cannot read (a class, a forward reference it cannot find, no
annotation at all, as in Keras' own classes) accepts any value: the builder still checks it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from omegaconf import MISSING

from tfrecipe.config.targets import Unresolvable, annotations_of
from tfrecipe.errors import Problem

_SEQUENCES = {"Sequence", "list", "List", "tuple", "Tuple", "Iterable", "Collection"}
_MAPPINGS = {"Mapping", "dict", "Dict", "MutableMapping"}
_SCALARS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "None": lambda v: v is None,
    "Any": lambda v: True,
    "object": lambda v: True,
}


def argument_type_problems(targets: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[Problem]:
    """A problem for each argument of each `(slot key, target, node)` whose value its target's
    signature does not accept, naming the key, the value and the declared type."""
    problems = []
    for key, target, node in targets:
        try:
            module, annotations = annotations_of(target)
        except Unresolvable:
            continue  # `validate` names the target it cannot find
        for name, value in node.items():
            annotation = annotations.get(name)
            if value == MISSING:  # reported as missing
                continue
            if annotation is not None and not _accepts(annotation, value, module, 0):
                problems.append(
                    _problem(f"{key}.{name}" if key else name, value, annotation, target)
                )
    return problems


def _problem(key: str, value: Any, annotation: ast.expr, target: str) -> Problem:
    declared = ast.unparse(annotation)
    hint = f"{target} takes {key.rpartition('.')[2]}: {declared}"
    if _is_sequence(annotation) and not isinstance(value, list | dict):
        hint += f"; a list, e.g. {key}=[{_plain(value)}]"
    return Problem(key, value, hint)


def _plain(value: Any) -> str:
    """`value` as an override writes it; with a control character, escaped (one plain line)."""
    text = {None: "null", True: "true", False: "false"}.get(value, str(value))  # type: ignore[call-overload]
    return text if text.isprintable() else repr(text)


def _is_sequence(annotation: ast.expr) -> bool:
    if isinstance(annotation, ast.BinOp):
        return _is_sequence(annotation.left) or _is_sequence(annotation.right)
    return isinstance(annotation, ast.Subscript) and _name(annotation.value) in _SEQUENCES


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # typing.Sequence, collections.abc.Mapping
        return node.attr
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    return None


def _accepts(annotation: ast.expr, value: Any, module: ast.Module | None, depth: int) -> bool:
    """Whether `value` (a YAML value: None, bool, int, float, str, list, dict) fits
    `annotation`; True where the annotation cannot be read."""
    if depth > 8:
        return True
    depth += 1
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:  # a string annotation: "int"
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return True
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _accepts(annotation.left, value, module, depth) or _accepts(
            annotation.right, value, module, depth
        )
    if isinstance(annotation, ast.Subscript):
        return _accepts_generic(annotation, value, module, depth)
    name = _name(annotation)
    if name in _SCALARS:
        return _SCALARS[name](value)
    if name in _SEQUENCES:
        return isinstance(value, list)
    if name in _MAPPINGS:
        return isinstance(value, dict)
    alias = _alias(module, name) if name else None
    return _accepts(alias, value, module, depth) if alias is not None else True


def _accepts_generic(
    annotation: ast.Subscript, value: Any, module: ast.Module | None, depth: int
) -> bool:
    """`Sequence[int]`, `tuple[int, ...]`, `Mapping[str, X]`, `Literal[...]`, `Optional[X]`,
    `Union[...]`, `Annotated[X, ...]`."""
    base, args = _name(annotation.value), annotation.slice
    items = list(args.elts) if isinstance(args, ast.Tuple) else [args]
    if base == "Literal":
        return any(isinstance(i, ast.Constant) and i.value == value for i in items)
    if base in ("Union", "Optional"):
        none = [ast.Constant(None)] if base == "Optional" else []
        return any(_accepts(i, value, module, depth) for i in [*items, *none])
    if base == "Annotated":
        return _accepts(items[0], value, module, depth)
    if base in _SEQUENCES:
        if not isinstance(value, list):
            return False
        fixed = base in ("tuple", "Tuple") and not (
            len(items) == 2 and isinstance(items[1], ast.Constant) and items[1].value is ...
        )
        if fixed:
            return len(items) == len(value) and all(
                _accepts(i, v, module, depth) for i, v in zip(items, value, strict=True)
            )
        return all(_accepts(items[0], v, module, depth) for v in value)
    if base in _MAPPINGS:
        return isinstance(value, dict) and all(
            _accepts(items[-1], v, module, depth) for v in value.values()
        )
    return True  # a generic this module does not know


def _alias(module: ast.Module | None, name: str) -> ast.expr | None:
    """The value of a module-level type alias `Name = Literal[...]` (None: not an alias)."""
    for node in module.body if module is not None else ():
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node.value
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            return node.value
    return None
