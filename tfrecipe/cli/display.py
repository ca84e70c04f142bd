"""What a run shows on the console: the resolved config as a tree, final metrics (the table
that ends a sweep: tfrecipe.cli.sweep_report)."""

from __future__ import annotations

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
