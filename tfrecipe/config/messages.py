"""The text of a config problem: a pydantic validation error becomes one line per slot, naming
the key (in the config's words, without a union's tag or member), the value received, what is
allowed (every member of a union, in one line) and, for an unknown key, the key it was probably
meant to be.
"""

from __future__ import annotations

import dataclasses

from pydantic import ValidationError

from tfrecipe.errors import Problem


def _section(container: dict, location: tuple) -> list[str]:
    """The keys of the config node at a validation error's location."""
    _, node = _walk(location, container)
    return list(node) if isinstance(node, dict) else []


def did_you_mean(key: str, siblings) -> str:
    """`did you mean loop.epochs?` for an unknown `key` (dotted) like one of `siblings` (the keys
    of its section), or "" when none is close."""
    import difflib

    section, _, name = key.rpartition(".")
    close = difflib.get_close_matches(name, [str(s) for s in siblings if s != name], n=1)
    return f"did you mean {section + '.' if section else ''}{close[0]}?" if close else ""


def missing(key: str) -> Problem:
    """The one line of a required value left unset (`???` in the YAML)."""
    return Problem(key, hint=f"required value is missing (set {key}=...)")


def describe(error: ValidationError, container: dict) -> list[Problem]:
    """pydantic's `error` on `container` (the composed config) as one `Problem` per slot: the
    key in the config's words, the value received and what is allowed. A value no member of a
    union takes (`Literal["auto"] | PositiveInt`) is one problem naming what each would take."""
    problems: list[Problem] = []
    members: dict[tuple[str, str], int] = {}  # a value's slot: its problem's index
    for item in error.errors():
        key = _key(item["loc"], container)
        kind = item["type"]
        received = item.get("input")
        if kind == "extra_forbidden":
            section = _section(container, item["loc"][:-1])
            hint = "; ".join(filter(None, ["unknown key", did_you_mean(key, section)]))
            problems.append(Problem(key, received, hint))
        elif kind == "missing":
            problems.append(missing(key))
        elif kind == "union_tag_invalid":
            allowed = item["ctx"]["expected_tags"]
            problems.append(
                Problem(f"{key}.name", item["ctx"]["tag"], f"unknown option; allowed: {allowed}")
            )
        else:
            message = item["msg"] if kind in _CASE_KEPT else item["msg"].lower()
            slot = (key, repr(received))
            if slot in members:  # another member of the same union
                problems[members[slot]] = _either(problems[members[slot]], message)
            else:
                members[slot] = len(problems)
                problems.append(Problem(key, received, message))
    return problems


def _key(location: tuple, container: dict) -> str:
    """A validation error's location as the config's dotted key."""
    parts, _ = _walk(location, container)
    return ".".join(parts)


def _walk(location: tuple, container: dict) -> tuple[list[str], object]:
    """The config's keys along a validation error's location, and the node they lead to
    (`_ABSENT` past a key the config does not have: missing, or not to be). Skipped: the tag
    pydantic adds after a discriminated union's section (its `name`, e.g. "mirrored": every
    union of sections is told apart by `name`) and the member it tried of a plain union (e.g.
    "constrained-int", after the value it was given). The location holds the config's own
    names (`_target_` by its alias)."""
    parts: list[str] = []
    node = container
    for part in location:
        if isinstance(node, dict):
            if part not in node and part == node.get("name"):
                continue  # a discriminated union's tag, not a key of the config
        elif isinstance(part, str) and node is not _ABSENT:
            continue  # a union member's name, after the value it was tried on
        parts.append(str(part))
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = _ABSENT
    return parts, node


_ABSENT = object()


def _either(problem: Problem, message: str) -> Problem:
    """`problem` also naming what another member of its union allows: "input should be 'auto'
    or a valid integer"."""
    prefix = "input should be "
    if problem.hint.startswith(prefix) and message.startswith(prefix):
        message = message[len(prefix) :]
    return dataclasses.replace(problem, hint=f"{problem.hint} or {message}")


# Messages that name an environment variable or a URI scheme: their case is kept.
_CASE_KEPT = frozenset({"mlflow_uri", "mlflow_file_store", "mlflow_memory_store", "compile_cache"})
