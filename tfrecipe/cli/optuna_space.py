"""An Optuna sweep's search space, read from Hydra's override syntax as the stock optuna sweeper
reads it: `interval(a,b)` (a float or int range), `tag(log, interval(a,b))` (on a log scale),
`choice(a,b)` and `a,b` (categorical), `range(a,b[,step])` (the values Hydra's basic sweeper
would run: `b` excluded); and `hydra.sweeper.search_space`'s older dictionaries. Anything else
is a fixed value every trial gets. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tfrecipe.errors import ConfigError, Problem


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """What each trial samples (`distributions`, by key) and what it gets fixed (`fixed`)."""

    distributions: dict[str, Any]
    fixed: dict[str, str]

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """A trial's job overrides: its sampled values, then the fixed ones."""
        sampled = [f"{key}={_encode(value)}" for key, value in params.items()]
        return [*sampled, *(f"{key}={value}" for key, value in self.fixed.items())]

    def grid(self) -> dict[str, list[Any]]:
        """Every value of each key, for optuna's GridSampler (categorical distributions only)."""
        from optuna.distributions import CategoricalDistribution, IntDistribution

        grid = {}
        for key, distribution in self.distributions.items():
            if isinstance(distribution, CategoricalDistribution):
                grid[key] = list(distribution.choices)
            elif isinstance(distribution, IntDistribution) and not distribution.log:
                step = distribution.step
                grid[key] = list(range(distribution.low, distribution.high + 1, step))
            else:
                raise ConfigError(
                    Problem(
                        key,
                        hint="hydra/sweeper/sampler=grid takes only lists, choice(...) "
                        "and range(...) of ints: it cannot enumerate an interval",
                    )
                )
        return grid


def search_space(lines: Sequence[str], legacy: Mapping[str, Any] | None = None) -> SearchSpace:
    """The space of `lines` (`hydra.sweeper.params` as `key=value`, then the command line's
    overrides, which win) and of `legacy` (`hydra.sweeper.search_space`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    distributions = {str(k): _from_dict(str(k), v) for k, v in (legacy or {}).items()}
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(lines)):
        key = override.get_key_element()
        if override.is_sweep_override():
            distributions[key] = _from_override(override)
            fixed.pop(key, None)
        else:
            fixed[key] = override.get_value_element_as_str()
            distributions.pop(key, None)
    return SearchSpace(distributions, fixed)


def interval_problem(override) -> Problem | None:
    """What Optuna would refuse in an `interval(...)` (or accept wrongly: a tag it ignores),
    found without Optuna: for the pre-check and `validate`, before any study exists."""
    value = override.value()
    unknown = sorted(set(value.tags) - {"log"})
    if unknown:
        expected = "expected tag(log, interval(a,b)) for a log scale, the only tag optuna takes"
        return Problem(*_typed(override), f"unknown tag {', '.join(unknown)}; {expected}")
    if value.start > value.end:
        return Problem(*_typed(override), "expected low <= high in interval(low, high)")
    if "log" in value.tags and value.start <= 0:
        return Problem(*_typed(override), "a log scale needs low > 0")
    return None


def _typed(override) -> tuple[str, str]:
    """(key, value) as the command line gave them."""
    return override.get_key_element(), override.input_line.partition("=")[2]


def _from_override(override) -> Any:
    from hydra.core.override_parser.types import Transformer
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value = override.value()
    if override.is_interval_sweep():
        if problem := interval_problem(override):
            raise ConfigError(problem)
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    if override.is_range_sweep() and not value.shuffle:
        values = list(override.sweep_iterator())
        if not values:
            raise ConfigError(Problem(*_typed(override), "expected a non-empty range"))
        if all(isinstance(v, int) for v in (value.start, value.stop, value.step)):
            return IntDistribution(values[0], values[-1], step=int(value.step))
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(value.step))
    choices = list(override.sweep_iterator(transformer=Transformer.encode))
    return CategoricalDistribution(choices)


def _from_dict(key: str, spec: Any) -> Any:
    """A `search_space` entry: {type: int|float|categorical, low, high, log, step, choices}."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    spec = dict(spec) if isinstance(spec, Mapping) else {}
    kind = str(spec.get("type", ""))
    try:
        if kind == "categorical":
            return CategoricalDistribution(list(spec["choices"]))
        low, high, log, step = spec["low"], spec["high"], bool(spec.get("log")), spec.get("step")
        if kind == "int":
            return IntDistribution(int(low), int(high), log=log, step=int(step or 1))
        if kind == "float":
            return FloatDistribution(float(low), float(high), log=log, step=step)
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(
            Problem(f"hydra.sweeper.search_space.{key}", spec, f"not a distribution: {error}")
        ) from None
    raise ConfigError(
        Problem(
            f"hydra.sweeper.search_space.{key}.type", kind, "expected int, float or categorical"
        )
    )


def _encode(value: Any) -> str:
    """A sampled value as an override's value (a categorical choice is already encoded)."""
    if isinstance(value, float):
        return repr(value)
    return str(value)
