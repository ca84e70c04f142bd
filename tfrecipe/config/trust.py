"""`Trust`: what this invocation's own command line grants, and nothing else does.

Some settings decide what code runs or where it writes: `allowed_targets` trusts a package's
code, a SLURM launcher's `setup` lines run in a shell. A recipe, a run dir's `config.yaml`, a
sweep's params and every other file tfrecipe reads are data someone else may have written, so
they grant nothing. The one `Trust` of a process is made here, once, from the overrides the user
typed (`Trust.from_command_line`), and every config check takes it as a required argument
(`schema.validate`, `checks.config_problems`, `grants.allowed_prefix_problem`,
`hydra_node.hydra_problems`, through its `grants.Grants`): a new command that forgets to pass one does not compile into a
grant, and `Trust.NOTHING` grants nothing.

A sweep's jobs run in the same process (Hydra's basic launcher) or in others (joblib's workers,
submitit's SLURM jobs) and do not see the parent's command line: the parent puts its trust into
the environment (`TRUST_ENV`, which no config may set: `hydra_node.SAFE_ENV`), and
`Trust.of_this_process` reads it back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any, ClassVar

from tfrecipe.config.command_line import CommandLine

# The parent invocation's overrides, as typed (a JSON list), for the jobs of its sweep.
TRUST_ENV = "TFRECIPE_TRUST"


@dataclasses.dataclass(frozen=True)
class Trust:
    """The grants of one invocation: what its command line typed, nothing from a file.

    Attributes:
      overrides: the override lines the user typed (`key=value`, as Hydra parses them).
      origin: where they came from, for messages ("your command line", "the sweep's command
        line", "nothing").
    """

    overrides: tuple[str, ...] = ()
    origin: str = "nothing"
    NOTHING: ClassVar[Trust]

    @classmethod
    def from_command_line(cls, overrides: Sequence[str]) -> Trust:
        """The trust of the overrides the user typed on this process's command line."""
        return cls(tuple(str(o) for o in overrides), "your command line")

    @classmethod
    def of_this_process(cls) -> Trust:
        """The trust a sweep's job inherits from the command line that started the sweep
        (`TRUST_ENV`); `NOTHING` where no tfrecipe command line put one there."""
        raw = os.environ.get(TRUST_ENV)
        if not raw:
            return cls.NOTHING
        try:
            overrides = json.loads(raw)
        except ValueError:
            return cls.NOTHING
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            return cls.NOTHING
        return cls(tuple(overrides), "the sweep's command line")

    def environ(self) -> dict[str, str]:
        """The environment entry that hands this trust to a sweep's jobs."""
        return {TRUST_ENV: json.dumps(list(self.overrides))}

    @property
    def command_line(self) -> CommandLine:
        return _parsed(self.overrides)

    def granted_prefixes(self) -> set[str]:
        """The `allowed_targets` entries this trust grants (in any list it gave)."""
        return self.command_line.granted_prefixes()

    def grants_prefix(self, prefix: object) -> bool:
        return isinstance(prefix, str) and prefix in self.granted_prefixes()

    def gave(self, key: str, value: Any) -> bool:
        """Whether the command line set `key`, or a node holding it, to `value`."""
        return self.command_line.gave(key, value)


Trust.NOTHING = Trust()

_PARSED: dict[tuple[str, ...], CommandLine] = {}


def _parsed(overrides: tuple[str, ...]) -> CommandLine:
    """CommandLine.parse, once per set of overrides (Hydra's parser is not free)."""
    if overrides not in _PARSED:
        _PARSED[overrides] = CommandLine.parse(overrides) if overrides else CommandLine()
    return _PARSED[overrides]
