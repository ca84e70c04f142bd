"""Console display of the resolved config, as a tree."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from rich import get_console
from rich.syntax import Syntax
from rich.tree import Tree

from tfrecipe.rundir import public_config

_ORDER = ("strategy", "model", "dataset", "precision", "batching", "optimizer", "loop")


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
