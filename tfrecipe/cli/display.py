"""What a run shows on the console: the resolved config as a tree, final metrics (the table
that ends a sweep: tfrecipe.cli.sweep_report)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf
from rich import get_console
from rich.syntax import Syntax
from rich.tree import Tree

from tfrecipe.rundir import public_config

_ORDER = ("strategy", "model", "dataset", "precision", "batching", "optimizer", "loop")


def shows_config(
    setting: bool | str, *, sweeping: bool, verbose: int | str, terminal: bool
) -> bool:
    """`print_config`: true, false, or auto: a single run on a terminal that shows progress (the
    tree is ~110 lines: in every job of a sweep, or in a log, it buries what matters)."""
    if setting != "auto":
        return bool(setting)
    return terminal and not sweeping and verbose != 0


def print_changes(cfg: DictConfig, run_dir: object) -> None:
    """What a watched run shows before it trains: the group options and keys that differ from
    the default config, then the run's plan (the whole config: RUN_DIR/config.yaml, `--cfg
    job`)."""
    lines = [f"config: what differs from the defaults (all of it: {run_dir}/config.yaml)"]
    lines += [f"  {change}" for change in config_changes(cfg)] or ["  nothing"]
    plan = _plan_lines(cfg)
    lines += ["plan:", *(f"  {line}" for line in plan)] if plan else []
    print("\n".join(lines), flush=True)


def config_changes(cfg: DictConfig) -> list[str]:
    """`group=option` for each option other than the default's, then `key=value` for each key
    that differs from the config those options compose (a recipe's own values stay in it)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from tfrecipe.config.changes import flat

    def composed(overrides: list[str]) -> DictConfig:
        return GlobalHydra.instance().hydra.compose_config(
            "config", overrides, run_mode=RunMode.RUN, with_log_configuration=False
        )

    chosen = dict(HydraConfig.get().runtime.choices)
    default = dict(composed([]).hydra.runtime.choices)
    options = [
        f"{g}={o}" for g, o in chosen.items() if not g.startswith("hydra") and o != default.get(g)
    ]
    base_cfg = composed(options)
    base = flat(
        public_config(OmegaConf.masked_copy(base_cfg, [k for k in base_cfg if k != "hydra"]))
    )
    now = flat(public_config(cfg))
    keys = [f"{k}={_shown(v)}" for k, v in now.items() if k not in base or base[k] != v]
    keys += [f"~{k}" for k in base if k not in now]
    return [*options, *keys]


def _shown(value: object) -> str:
    """A value as an override writes it: [32, 64], true, null, 0.001."""
    if isinstance(value, list | dict | bool) or value is None:
        return json.dumps(value)
    return str(value)


def _plan_lines(cfg: DictConfig) -> list[str]:
    """The run's plan (`tfrecipe validate` prints it); none where the config is invalid (the
    run reports that next)."""
    from tfrecipe.config.plan import RunPlan
    from tfrecipe.config.schema import validate
    from tfrecipe.config.trust import Trust
    from tfrecipe.errors import ConfigError

    try:
        return RunPlan.from_config(validate(cfg, trust=Trust.of_this_process())).lines()
    except ConfigError:
        return []


def print_config(cfg: DictConfig) -> None:
    """Prints each top-level section of the resolved config as a branch of a tree."""
    resolved = public_config(cfg)
    tree = Tree("config", guide_style="dim")
    keys = [k for k in _ORDER if k in resolved] + [k for k in resolved if k not in _ORDER]
    for key in keys:
        value = resolved[key]
        branch = tree.add(f"[bold]{key}[/bold]")
        text = OmegaConf.to_yaml(value) if isinstance(value, dict | list) else str(value)
        branch.add(Syntax(text.rstrip(), "yaml", theme="ansi_dark", background_color="default"))
    get_console().print(tree)


def number(value: object) -> str:
    """A metric on the console: 4 significant digits (0.9889, 2970, 0.04313)."""
    return f"{value:.4g}" if isinstance(value, int | float) else str(value)


def metrics_line(metrics: Mapping[str, object] | None) -> str:
    """`accuracy=0.9889 loss=0.04313`, or "-" when there are none."""
    return " ".join(f"{name}={number(value)}" for name, value in (metrics or {}).items()) or "-"
