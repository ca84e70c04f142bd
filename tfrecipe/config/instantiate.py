"""The one place a config turns into objects: every `_target_` is checked by the KIND its slot takes.

A config names callables in a few slots, and each slot says what it accepts (`SLOT_KINDS`): the
`model` slot a model builder, `dataset` a dataset builder, `callbacks.extra.NAME` a Keras callback
class, `task.loss` a Keras loss class, `task.metrics.N` a Keras metric class. A target is allowed
when it is one of tfrecipe's own builders of that kind, a public member of the Keras module that
kind lives in (`keras.callbacks`, `keras.applications`, ...), or under a prefix the user grants
in `allowed_targets`. Everything else is refused by default: other modules of keras and
tensorflow (`tensorflow.io.write_file`, `keras.utils.get_file`), private modules (`keras.src`,
`tensorflow.python`, a leading underscore).

`allowed_targets` trusts code, so only the user grants it, on the command line
(`trust.Trust`): an entry a recipe, a run dir's config.yaml or a sweep's params set
is refused, and so are entries naming the standard library, the frameworks, the packages
tfrecipe depends on and loaders that turn data into code (`yaml`, `joblib`, ...). The check
reads only the dotted path, so it runs before anything is imported or called; `instantiate`
then checks the imported object's kind before the call and the built object's type after it.

`checks.config_problems` is the one check of a composed config; Hydra's own node is checked by
`hydra_node.hydra_problems` (its targets by the same kinds).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from tfrecipe.config.grants import NO_GRANTS, Grants, is_dotted_path
from tfrecipe.config.targets import marked_targets
from tfrecipe.errors import ConfigError, Problem


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a config slot accepts.

    Attributes:
      name: what the slot takes, in the user's words (for error messages).
      package: tfrecipe's package whose functions marked `@config_target` are of this kind
        (`builders`).
      modules: public modules whose members are of this kind.
      members: when given, the only names of `modules` allowed (deny by default).
      excluded: names of `modules` that are not of this kind (deserializers, ...).
      classes_only: members must be named like classes (`ResNet50`, not `decode_predictions`).
      base: the class a target must subclass, checked once it is imported.
      returns: the type the built object must have, checked after the call.
      user_prefixes: whether `allowed_targets` prefixes may serve this slot.
    """

    name: str
    package: str | None = None
    modules: tuple[str, ...] = ()
    members: frozenset[str] | None = None
    excluded: frozenset[str] = frozenset()
    classes_only: bool = False
    base: str | None = None
    returns: str | None = None
    user_prefixes: bool = True

    @property
    def builders(self) -> tuple[str, ...]:
        """tfrecipe's own targets of this kind (exact dotted paths), found by their mark."""
        return marked_targets(self.package) if self.package else ()


_SERIALIZERS = frozenset({"get", "serialize", "deserialize"})

MODEL = Kind(
    "a model builder returning a keras.Model",
    package="tfrecipe.models",
    modules=("keras.applications",),
    classes_only=True,  # the constructors (ResNet50, ...), not preprocess_input/decode_predictions
    returns="keras.Model",
)
DATASET = Kind(
    "a dataset builder returning tfrecipe.Splits",
    package="tfrecipe.data",
    returns="tfrecipe.data.splits.Splits",
)
CALLBACK = Kind(
    "a keras.callbacks.Callback subclass",
    modules=("keras.callbacks",),
    # Callbacks that write, delete or send files (BackupAndRestore deletes its directory,
    # CSVLogger truncates its file, RemoteMonitor posts to a URL) are left out: tfrecipe's own
    # callbacks.* and logger=* keep those inside the run dir.
    members=frozenset(
        {
            "EarlyStopping",
            "LearningRateScheduler",
            "ProgbarLogger",
            "ReduceLROnPlateau",
            "SwapEMAWeights",
            "TerminateOnNaN",
        }
    ),
    base="keras.callbacks.Callback",
)
# Classes only: the custom loop needs a loss's per-example form (reduction none), and a metric
# object keeps state; functions (keras.losses.huber) give neither.
LOSS = Kind(
    "a keras.losses.Loss subclass",
    modules=("keras.losses",),
    excluded=_SERIALIZERS,
    classes_only=True,
    base="keras.losses.Loss",
)
METRIC = Kind(
    "a keras.metrics.Metric subclass",
    modules=("keras.metrics",),
    excluded=_SERIALIZERS,
    classes_only=True,
    base="keras.metrics.Metric",
)
OPTIMIZER = Kind(
    "a keras.optimizers.Optimizer subclass",
    modules=("keras.optimizers",),
    excluded=_SERIALIZERS,
    classes_only=True,
    base="keras.optimizers.Optimizer",
)
HYDRA_PLUGIN = Kind(
    "a Hydra launcher or sweeper plugin",
    # Hydra instantiates only classes registered from these modules (hydra.core.plugins).
    modules=("hydra._internal.core_plugins", "hydra_plugins"),
    user_prefixes=False,
)
OPTUNA_SAMPLER = Kind("an optuna sampler", modules=("optuna.samplers",), classes_only=True)

# Config slot (a dotted key; NAME: any one name) -> the kind it accepts.
SLOT_KINDS = {
    "model": MODEL,
    "dataset": DATASET,
    "callbacks.extra.NAME": CALLBACK,
    "task.loss": LOSS,
    "task.metrics.N": METRIC,
    "hydra.launcher": HYDRA_PLUGIN,
    "hydra.sweeper": HYDRA_PLUGIN,
    "hydra.sweeper.sampler": OPTUNA_SAMPLER,
}

# Internals reached through a public-looking name; refused whatever `allowed_targets` says.
PRIVATE_MODULES = ("keras.src", "tensorflow.python", "tensorflow.core", "tensorflow.compiler")


def _matches(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


def under_prefix(target: str, prefixes: Iterable[str]) -> bool:
    """Whether `target` is one of `prefixes` or inside one of them."""
    return any(_matches(target, str(prefix)) for prefix in prefixes)


def slot_kind(key: str) -> Kind | None:
    """The kind the config slot at `key` accepts; None where a config may name no target."""
    key = re.sub(r"^callbacks\.extra\.[^.]+$", "callbacks.extra.NAME", key)
    return SLOT_KINDS.get(re.sub(r"^task\.metrics\.\d+$", "task.metrics.N", key))


def _builtin_member(target: str, kind: Kind) -> bool:
    name = target.rpartition(".")[2]
    if target in kind.builders:
        return True
    if not any(target.startswith(module + ".") for module in kind.modules):
        return False
    if kind.members is not None and (name not in kind.members or target.count(".") != 2):
        return False
    return name not in kind.excluded and (not kind.classes_only or name[:1].isupper())


def _private(target: str, kind: Kind) -> bool:
    if kind is HYDRA_PLUGIN:  # Hydra's core plugins sit in hydra._internal; Hydra vets them
        return False
    parts = target.split(".")
    return any(p.startswith("_") for p in parts) or any(
        _matches(target, m) for m in PRIVATE_MODULES
    )


def _allowed_here(kind: Kind, grants: Grants) -> str:
    where = [*kind.builders, *(f"{m}.*" for m in kind.modules)]
    if kind.members is not None:
        where = [f"{m}.{{{','.join(sorted(kind.members))}}}" for m in kind.modules]
    if kind.user_prefixes:
        where.append(f"your own under allowed_targets={list(grants.prefixes)}")
    return ", ".join(where)


# Targets of tfrecipe's flat layout (before its modules were grouped into packages) and where they
# live now, so a saved config that names one gets the new path instead of "not allowed".
_MOVED = {
    "tfrecipe.data.digits": "tfrecipe.data.bundled.digits",
    "tfrecipe.data.synthetic": "tfrecipe.data.bundled.synthetic",
    "tfrecipe.datasets.": "tfrecipe.data.",
}


def moved_target(target: str) -> str | None:
    """Where an old `_target_` of tfrecipe's lives now (None: it did not move)."""
    for old, new in _MOVED.items():
        if target == old or (old.endswith(".") and target.startswith(old)):
            return new + target[len(old) :] if old.endswith(".") else new
    return None


def target_problem(target: object, *, key: str, grants: Grants = NO_GRANTS) -> Problem | None:
    """Why slot `key` may not name `target` (None: it may). Imports nothing.

    Args:
      target: the slot's `_target_` value.
      key: the slot (e.g. "model", "callbacks.extra.lr").
      grants: what the config's `allowed_targets` grants (`grants.Grants`: refused entries are
        left out; see `grants.allowed_prefix_problem`).
    """
    kind = slot_kind(key)
    if kind is None:
        slots = ", ".join(s for s in SLOT_KINDS if not s.startswith("hydra"))
        return _problem(key, target, f"a config names targets only in {slots}; remove it")
    if not is_dotted_path(target):
        return _problem(key, target, "expected a dotted import path")
    moved = moved_target(target)
    if moved:
        return _problem(key, target, f"tfrecipe moved it to {moved!r}; update your config")
    if _private(target, kind):
        return _problem(
            key,
            target,
            f"private modules ({', '.join(PRIVATE_MODULES)}, a leading underscore) are never "
            f"allowed; expected {kind.name}",
        )
    user = kind.user_prefixes and any(_matches(target, p) for p in grants.prefixes)
    if not (user or _builtin_member(target, kind)):
        return _problem(
            key, target, f"expected {kind.name}; allowed here: {_allowed_here(kind, grants)}"
        )
    return None


def _problem(key: str, target: object, hint: str) -> Problem:
    """A problem with slot `key`'s `_target_`."""
    return Problem(f"{key}._target_", target, hint)


def check_target(target: object, *, key: str, grants: Grants = NO_GRANTS) -> None:
    """Raises `ConfigError` unless `target` is of the kind slot `key` takes (`target_problem`)."""
    problem = target_problem(target, key=key, grants=grants)
    if problem is not None:
        raise ConfigError(problem)


def _import(path: str, *, key: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ConfigError(
            Problem(f"{key}._target_", hint=f"cannot import {path!r} ({error})")
        ) from None


def resolve_target(target: str, *, key: str, grants: Grants = NO_GRANTS) -> Any:
    """The object `target` names, imported only once the path passed `check_target`, and
    checked to be of the slot's kind before anything calls it."""
    check_target(target, key=key, grants=grants)
    fn = _import(target, key=key)
    kind = slot_kind(key)
    if kind.base is not None:
        base = _import(kind.base, key=key)
        if not (inspect.isclass(fn) and issubclass(fn, base)):
            raise ConfigError(_problem(key, target, f"expected {kind.name}, found {fn!r}"))
    elif not (inspect.isclass(fn) or inspect.isfunction(fn)):
        raise ConfigError(
            _problem(key, target, f"expected {kind.name} (a function or class), found {fn!r}")
        )
    return fn


def _check_result(result: Any, *, key: str, target: str) -> Any:
    kind = slot_kind(key)
    if kind.returns is not None and not isinstance(result, _import(kind.returns, key=key)):
        raise ConfigError(
            _problem(key, target, f"returned a {type(result).__name__}, expected {kind.name}")
        )
    return result


def instantiate(
    node: Mapping[str, Any], *, key: str, grants: Grants = NO_GRANTS, **runtime_kwargs: Any
) -> Any:
    """Calls `node["_target_"]` with the node's other entries plus `runtime_kwargs`.

    Args:
      node: a config node with `_target_` and keyword arguments (plain values, no nesting).
      key: the slot the node sits in (e.g. "model"); it says which kind is accepted.
      grants: extra import prefixes from the config's `allowed_targets` (`grants.Grants`).
      **runtime_kwargs: arguments known only at run time (input shape, number of classes).

    Raises:
      ConfigError: the target is not of the slot's kind or does not exist, does not accept the
        configured arguments, rejects their values (a `ValueError` from the builder), or built
        something of the wrong type.
    """
    kwargs = {k: v for k, v in node.items() if k != "_target_"}
    target = node.get("_target_")
    fn = resolve_target(target, key=key, grants=grants)
    try:
        inspect.signature(fn).bind(**kwargs, **runtime_kwargs)
    except TypeError as error:
        raise ConfigError(
            Problem(key, hint=f"{target} does not accept these arguments ({error})")
        ) from None
    except ValueError:  # builtins without a signature: let the call itself check
        pass
    try:
        result = fn(**kwargs, **runtime_kwargs)
    except ValueError as error:
        raise ConfigError(Problem(key, hint=str(error))) from None
    return _check_result(result, key=key, target=target)


# --- every target of a composed config, Hydra's included -----------------------------------------
def iter_targets(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any, Mapping]]:
    """(slot key, `_target_` value, node) of every node with a `_target_`, anywhere in a nested
    config (plain containers or OmegaConf's): the one walk every target check uses."""
    if isinstance(node, Mapping):
        if "_target_" in node:
            yield ".".join(path), node["_target_"], node
        for key, value in node.items():
            yield from iter_targets(value, (*path, str(key)))
    elif isinstance(node, Sequence) and not isinstance(node, str):
        for index, value in enumerate(node):
            yield from iter_targets(value, (*path, str(index)))


def target_problems(
    container: Mapping[str, Any], *, grants: Grants = NO_GRANTS, refused: Iterable[Any] = ()
) -> list[Problem]:
    """Every `_target_` anywhere in a resolved config, checked against its slot's kind. A target
    under a `refused` `allowed_targets` entry is left to that entry's own problem."""
    refused = [str(r) for r in refused]
    problems = []
    for key, target, _ in iter_targets(container):
        if isinstance(target, str) and under_prefix(target, refused):
            continue
        problem = target_problem(target, key=key, grants=grants)
        problems += [problem] if problem else []
    return problems
