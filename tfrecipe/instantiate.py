"""The one place a config turns into objects: `_target_`s are checked against an allow-list.

A config may only name callables under tfrecipe's own package, keras, tensorflow, or a prefix the
user adds in `allowed_targets`. Anything else (``os.system``, ``subprocess.run``, ...) is refused
before it is imported.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from tfrecipe.errors import ConfigError

BUILTIN_PREFIXES = ("tfrecipe", "keras", "tensorflow")
# Never instantiable, whatever the user allows: they run programs or code.
FORBIDDEN_PREFIXES = ("os", "subprocess", "builtins", "shutil", "sys", "importlib", "pty", "eval")


def _matches(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


def check_target(target: object, *, key: str, allowed: Iterable[str] = ()) -> None:
    """Raises `ConfigError` unless `target` is a dotted path under an allowed prefix."""
    if not isinstance(target, str) or not all(part.isidentifier() for part in target.split(".")):
        raise ConfigError(f"{key}._target_: expected a dotted import path, received {target!r}")
    if any(_matches(target, p) for p in FORBIDDEN_PREFIXES):
        raise ConfigError(
            f"{key}._target_: {target!r} is never allowed (modules that run programs or code: "
            f"{', '.join(FORBIDDEN_PREFIXES)}); name a model, dataset or callback builder"
        )
    prefixes = (*BUILTIN_PREFIXES, *allowed)
    if not any(_matches(target, p) for p in prefixes):
        raise ConfigError(
            f"{key}._target_: {target!r} is not an allowed target; allowed prefixes: "
            f"{', '.join(prefixes)} (add your package to allowed_targets=[...])"
        )


def resolve_target(target: str, *, key: str, allowed: Iterable[str] = ()) -> Any:
    check_target(target, key=key, allowed=allowed)
    module_name, _, attr = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"{key}._target_: cannot import {target!r} ({error})") from None


def instantiate(
    node: Mapping[str, Any], *, key: str, allowed: Iterable[str] = (), **runtime_kwargs: Any
) -> Any:
    """Calls `node["_target_"]` with the node's other entries plus `runtime_kwargs`.

    Args:
      node: a config node with `_target_` and keyword arguments (plain values, no nesting).
      key: where the node sits in the config, for error messages (e.g. "model").
      allowed: extra import prefixes from the config's `allowed_targets`.
      **runtime_kwargs: arguments known only at run time (input shape, number of classes).

    Raises:
      ConfigError: the target is not allowed or does not exist, does not accept the configured
        arguments, or rejects their values (a `ValueError` from the builder).
    """
    kwargs = {k: v for k, v in node.items() if k != "_target_"}
    target = node.get("_target_")
    fn = resolve_target(target, key=key, allowed=allowed)
    try:
        inspect.signature(fn).bind(**kwargs, **runtime_kwargs)
    except TypeError as error:
        raise ConfigError(f"{key}: {target} does not accept these arguments ({error})") from None
    except ValueError:  # builtins without a signature: let the call itself check
        pass
    try:
        return fn(**kwargs, **runtime_kwargs)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None
