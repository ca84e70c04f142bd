"""The error a user's mistake raises: reported as one line per problem, exit code 2."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Final


class _NotGiven:
    """`Problem.received` when no single value was received (a missing key, a whole section)."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Final = _NotGiven()


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a config, as data: where, what was found there, what to do.

    Attributes:
      key: the dotted config key ("loop.epochs", "model._target_"); "" for a problem that is
        not about one key (a message written as a whole, e.g. by a cross-check).
      received: the value found at `key` (NOT_GIVEN: none to show).
      hint: what is wrong and what is expected or allowed.
    """

    key: str
    received: object = NOT_GIVEN
    hint: str = ""

    def __str__(self) -> str:
        """The one line a user sees: `key=received: hint` (`key: hint` without a value)."""
        if not self.key:
            return self.hint
        where = self.key if self.received is NOT_GIVEN else f"{self.key}={_shown(self.received)}"
        return f"{where}: {self.hint}"

    @property
    def slot(self) -> str:
        """The config node the problem is about ("model" for "model._target_")."""
        return self.key.removesuffix("._target_")


def _shown(value: object) -> str:
    """A received value as the user writes it in an override: true, false, null, a plain word or
    dotted name bare (`loop=fit`, `model._target_=x.y`); any other string quoted, so '', ' x' or
    '1' (not the number) stay visible."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str) and _PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS:
        return value
    return repr(value)


_PLAIN = re.compile(r"[A-Za-z_][\w.:/+-]*")
_YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "nan", "inf"}


class ConfigError(Exception):
    """Invalid configuration or usage.

    Carries every problem found, so the user fixes them all in one go. A problem given as a
    string is a message written as a whole (a `Problem` with no key).
    """

    def __init__(self, problems: str | Problem | Iterable[str | Problem]):
        if isinstance(problems, str | Problem):
            problems = [problems]
        self.problems = [p if isinstance(p, Problem) else Problem("", hint=p) for p in problems]
        super().__init__("\n".join(self.messages))

    @property
    def messages(self) -> list[str]:
        """Each problem's line, as the user sees it."""
        return [str(p) for p in self.problems]

    def report(self) -> str:
        if len(self.problems) == 1:
            return f"tfrecipe: invalid configuration: {self.problems[0]}"
        lines = "\n".join(f"  - {p}" for p in self.problems)
        return f"tfrecipe: invalid configuration ({len(self.problems)} problems):\n{lines}"


class DataError(Exception):
    """A bad cell met while training (a streamed table whose statistics came from a sample):
    one line naming its file, line and column; exit code 2, summary.json says "failed"."""
