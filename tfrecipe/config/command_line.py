"""What the user typed: the settings a config file (a recipe, a run dir's config.yaml, a sweep's
`hydra.sweeper.params`) cannot give itself.

Some settings decide what code runs: `allowed_targets` trusts a package's code, a SLURM
launcher's `setup` lines run in a shell. Someone else's recipe must not be able to decide that
for you, so these count only when the command line gives them (`allowed_targets=[mypkg]`); the
checks in `instantiate` and `hydra_node` compare the composed config with this record.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """The values the command line gave, by key (`+`/`++` dropped; each value of a sweep apart).

    Attributes:
      values: dotted key (e.g. "allowed_targets", "hydra.launcher.setup") -> the values given.
    """

    values: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)

    @classmethod
    def parse(cls, overrides: Sequence[str]) -> CommandLine:
        """The record of `overrides` (Hydra's override grammar, as typed)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.core.override_parser.types import ValueType

        from tfrecipe.config.secrets import typed_value

        parser, parsed = OverridesParser.create(), []
        for line in overrides:
            # One Hydra cannot parse grants nothing (`evaluate` takes OmegaConf's dotlist, which
            # accepts more); where Hydra reads the line, it reports it itself.
            with contextlib.suppress(Exception):
                parsed += parser.parse_overrides([line])
        values: dict[str, list[Any]] = {}
        for override in parsed:
            # glob(...) picks config group options, which grant nothing (and need Hydra's loader).
            if override.is_delete() or override.value_type == ValueType.GLOB_CHOICE_SWEEP:
                continue
            if not override.is_sweep_override():
                given = [typed_value(override.value())]  # a typed secret: its value
            elif override.is_discrete_sweep():
                given = list(override.sweep_iterator())
            else:  # interval(...): numbers
                continue
            values.setdefault(override.key_or_group, []).extend(given)
        return cls({key: tuple(given) for key, given in values.items()})

    def granted_prefixes(self) -> set[str]:
        """Every `allowed_targets` entry the command line gave (in any of its lists)."""
        return {entry for entry in _strings(self.values.get("allowed_targets", ())) if entry}

    def gave(self, key: str, value: Any) -> bool:
        """Whether the command line set `key`, or a node holding it, to `value`."""
        parts = key.split(".")
        for depth in range(len(parts), 0, -1):
            for given in self.values.get(".".join(parts[:depth]), ()):
                if _descend(given, parts[depth:]) == value:
                    return True
        return False


def _strings(values: Any) -> Iterator[str]:
    if isinstance(values, str):
        yield values
    elif isinstance(values, list | tuple):
        for value in values:
            yield from _strings(value)


_ABSENT = object()


def _descend(node: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node
