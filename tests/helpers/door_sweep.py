"""The door sweep's machinery (tests/trust/test_door_sweep.py): every config to try, composed from what
is shipped and installed, every leaf of it, and a payload driven through each.

Nothing here lists keys: the leaves come from the composed configs, the groups from conf/, the
recipes from recipes/ and Hydra's groups (launchers, sweepers and their nested groups) from
Hydra's ConfigStore once its plugins are discovered.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

SECRET_NAME = "TFRECIPE_PROBE_TOKEN"
SECRET = "probeSECRETvalue9f3k"
# Payload name -> text ({marker}: a file a command would create; {outside}: a folder outside
# every run and sweep dir).
PAYLOADS = {
    "shell": "x\ntouch {marker} #",
    "secret": "${oc.env:" + SECRET_NAME + "}",
    "parent": "../../probe-outside",
    "absolute": "{outside}/probe",
    "escape": "\x1b]0;probe\x07\x1b[2Jx",
}


@dataclasses.dataclass(frozen=True)
class Composed:
    overrides: tuple[str, ...]
    cfg: DictConfig


def _groups() -> dict[str, list[str]]:
    """Every config group and its options: conf/'s folders, recipes/, and Hydra's groups as its
    ConfigStore holds them (launchers, sweepers and their nested groups: whatever is installed)."""
    from hydra.core.config_store import ConfigStore

    from tfrecipe.config.compose import config_dir, recipes_dir

    groups = {
        folder.name: sorted(p.stem for p in folder.glob("*.yaml"))
        for folder in sorted(config_dir().iterdir())
        if folder.is_dir()
    }
    groups["recipe"] = sorted(p.stem for p in recipes_dir().glob("*.yaml"))

    def walk(node: dict, path: str) -> None:
        options = sorted(n.removesuffix(".yaml") for n in node if n.endswith(".yaml"))
        if options:
            groups[path] = options
        for name, child in node.items():
            if isinstance(child, dict):
                walk(child, f"{path}/{name}")

    walk(ConfigStore.instance().repo.get("hydra", {}), "hydra")
    groups.pop("hydra", None)  # Hydra's own node (hydra/config), not a group to choose from
    return groups


def _compose(hydra_compose, overrides: list[str]) -> DictConfig | None:
    try:
        return hydra_compose("config", overrides=overrides, return_hydra_config=True)
    except Exception:  # an option that needs another (a nested group's parent): tried with it
        return None


@functools.cache
def compositions() -> tuple[Composed, ...]:
    """The default config, then one config per option of every group (a nested Hydra group's
    option with each option of its parent group), then one per recipe."""
    from hydra import compose, initialize_config_dir

    from tfrecipe.config.compose import config_dir, register_recipes

    register_recipes()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        plans = [[]]
        compose("config")  # discovers Hydra's plugins: their groups enter the ConfigStore
        groups = _groups()
        for group, options in groups.items():
            parent = group.rsplit("/", 1)[0]
            if group.count("/") > 1:  # hydra/sweeper/sampler: under each sweeper
                plans += [
                    [f"{parent}={p}", f"{group}={o}"] for p in groups[parent] for o in options
                ]
            else:
                plans += [[f"{group}={option}"] for option in options]
        found = [(plan, _compose(compose, plan)) for plan in plans]
    return tuple(Composed(tuple(plan), cfg) for plan, cfg in found if cfg is not None)


def leaves(node: Any, path: str = "") -> Iterator[str]:
    """The dotted key of every value a config file can set under `node`: a scalar, a list of
    scalars (one value), an empty mapping (a key added inside it: `.probe`)."""
    if isinstance(node, dict):
        if not node and path:
            yield f"{path}.probe"
        for key, value in node.items():
            yield from leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list) and any(isinstance(v, dict) for v in node):
        for index, value in enumerate(node):
            yield from leaves(value, f"{path}.{index}")
    else:
        yield path


def put(container: dict, key: str, value: Any) -> dict:
    """`container` with `value` at the dotted `key` (a list of scalars: `[value]`): a new
    container sharing all but the nodes on the way to `key`."""
    head, _, rest = key.partition(".")
    if isinstance(container, list):
        copied, at = list(container), int(head)
    else:
        copied, at = dict(container), head
    if rest:
        inner = copied[at] if isinstance(copied, list) else copied.get(at, {})
        copied[at] = put(inner, rest, value)
    else:
        old = copied[at] if isinstance(copied, list) else copied.get(at)
        copied[at] = [value] if isinstance(old, list) else value
    return copied


def hydra_with(cfg: DictConfig, values: dict[str, Any]) -> DictConfig:
    """Hydra's node of `cfg` with each `hydra.KEY` of `values` set as a config file would set it
    (a list of scalars: `[value]`), in a config of its own (Hydra's values refer to Hydra's only),
    untyped: what Hydra's dataclasses would refuse reaches tfrecipe's checks too."""
    container = OmegaConf.to_container(cfg.hydra, resolve=False)
    for key, value in values.items():
        container = put(container, key.removeprefix("hydra."), value)
    return OmegaConf.create({"hydra": container}).hydra
