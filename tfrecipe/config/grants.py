"""Which packages `allowed_targets` may grant: the user's own, named on the command line.

`allowed_targets` trusts all the public code of the packages it lists, so an entry is refused
when this invocation's command line does not give it (`trust.Trust`: one a recipe, a run dir's
config.yaml or a sweep's params set), and when it names the standard library, a framework
tfrecipe runs on, a package tfrecipe installs or a loader that turns data into code. The check
reads only the dotted path; nothing is imported. `instantiate` uses what remains.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from collections.abc import Iterable

from tfrecipe.config.trust import Trust
from tfrecipe.errors import Problem

# What tfrecipe runs on: allowed by kind above, never as a whole through `allowed_targets`.
FRAMEWORKS = frozenset(
    {"tfrecipe", "tensorflow", "keras", "tf_keras", "hydra", "hydra_plugins", "omegaconf"}
)


def is_dotted_path(target: object) -> bool:
    return isinstance(target, str) and all(p.isidentifier() for p in target.split("."))


def allowed_prefix_problem(prefix: object, *, trust: Trust) -> Problem | None:
    """Why `allowed_targets` may not list `prefix` (None: it may).

    The list trusts all the public code of the packages it names, so it is for the user's own
    packages, and the user's own decision: an entry the command line does not give (one a
    recipe, a run dir's config.yaml or a sweep's params set) is refused, and so are the standard
    library (`posix`, `runpy`, `ctypes`, ...), the frameworks tfrecipe runs on, the packages it
    depends on (`yaml`, `numpy`, `joblib`, ...) and other loaders that turn data into code.

    Args:
      prefix: one entry of `allowed_targets`.
      trust: what this invocation's command line grants (`Trust.NOTHING` grants nothing).
    """
    why = _foreign_package(prefix)
    if why is None and not trust.grants_prefix(prefix):
        why = (
            "is granted by a config file (a recipe, a run dir's config.yaml or sweep params), "
            "not on your command line; a shared config cannot trust code for you: if that "
            f"package is yours, pass allowed_targets=[{prefix}] yourself"
        )
    if why is None:
        return None
    # The entry, not the whole list, is what was received; the key stays the one users set.
    return Problem("allowed_targets", hint=f"{prefix!r} {why}")


def _foreign_package(prefix: object) -> str | None:
    """Why `prefix` cannot be a package of the user's own (None: it can be)."""
    if not is_dotted_path(prefix):
        return "is not a dotted import path (e.g. mypkg or mypkg.models)"
    top = prefix.split(".")[0]
    if any(part.startswith("_") for part in prefix.split(".")):
        return "is private (a leading underscore); name your package's public modules"
    if top in sys.stdlib_module_names | set(sys.builtin_module_names):
        return "is part of Python's standard library; list only your own packages"
    if top in FRAMEWORKS:
        return (
            "is a framework tfrecipe runs on; its public models, callbacks, losses, metrics and "
            "optimizers are allowed by kind already; list only your own packages"
        )
    if top in CODE_LOADERS or (top in _dependency_modules() and _installed(top)):
        return (
            "is a third-party package tfrecipe installs or one that turns data into code "
            "(yaml.unsafe_load, joblib.load, numpy.load(allow_pickle=True), ...); list only "
            "your own packages"
        )
    return None


# Packages that turn data into code (pickle in disguise, YAML tags, templates that compile to
# Python: Mako and Jinja2 run code when a template is constructed), install or import code
# (pip, setuptools, importlib's backports) or run it as their job (pytest, IPython): refused in
# `allowed_targets` whether or not tfrecipe installs them.
CODE_LOADERS = frozenset(
    {
        "yaml",
        "ruamel",
        "dill",
        "cloudpickle",
        "joblib",
        "jsonpickle",
        "numpy",
        "pandas",
        "torch",
        "pickle5",
        "mako",
        "jinja2",
        "genshi",
        "chameleon",
        "cheetah",
        "Cheetah",
        "tornado",
        "django",
        "pip",
        "setuptools",
        "pkg_resources",
        "_distutils_hack",
        "importlib_metadata",
        "importlib_resources",
        "pytest",
        "_pytest",
        "pluggy",
        "IPython",
        "sqlalchemy",
        "alembic",
        "optuna",
        "submitit",
        "onnx",
        "tf2onnx",
        "onnxruntime",
        "mlflow",
        "wandb",
        "fire",
        "invoke",
        "fabric",
        "paramiko",
        "sh",
        "plumbum",
        "pexpect",
    }
)


@functools.cache
def _dependency_modules() -> frozenset[str]:
    """The top-level modules of every distribution tfrecipe installs, directly or not, its
    extras included (`pip install 'tfrecipe[sweepers]'` brings Mako through optuna and alembic):
    read from the installed metadata; CODE_LOADERS covers a checkout without metadata."""
    from importlib import metadata

    from packaging.requirements import Requirement

    names, pending = set(), [("tfrecipe", True)]
    while pending:
        name, with_extras = pending.pop()
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        name = _normalized(distribution.metadata["Name"])
        if name in names:
            continue
        names.add(name)
        for line in distribution.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            extras = distribution.metadata.get_all("Provides-Extra") or [] if with_extras else []
            if marker is None or any(marker.evaluate({"extra": e}) for e in ["", *extras]):
                pending.append((requirement.name, False))
    modules = metadata.packages_distributions()
    return frozenset(
        module
        for module, distributions in modules.items()
        if any(_normalized(d) in names for d in distributions) and module != "tfrecipe"
    )


def _installed(top: str) -> bool:
    """Whether module `top` would be imported from an installation (site-packages), not from
    the user's own folders: some distributions also ship a top-level `tests` or `docs`, which
    must not take the name from the user's package of the same name. Finds, imports nothing."""
    import importlib.util
    import sysconfig

    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return True
    if spec is None:
        return True
    places = [p for p in [*(spec.submodule_search_locations or ()), spec.origin] if p]
    installs = [i for i in {sysconfig.get_path(k) for k in ("purelib", "platlib")} if i]
    # A namespace package may span both: a folder of the user's makes the name theirs.
    return all(any(p.startswith(i) for i in installs) for p in places)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def usable_prefixes(allowed: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the `allowed_targets` entries that may be used, those refused)."""
    allowed = list(allowed)
    refused = [p for p in allowed if _foreign_package(p)]
    return [p for p in allowed if p not in refused], refused


@dataclasses.dataclass(frozen=True)
class Grants:
    """What a config's `allowed_targets` grants, decided once: the import prefixes of the
    user's own packages that `instantiate` may import under, and the `Trust` that granted them.

    Attributes:
      prefixes: the entries that may be used (granted, none naming a foreign package).
      trust: what this invocation's command line grants.
    """

    prefixes: tuple[str, ...] = ()
    trust: Trust = Trust.NOTHING

    @classmethod
    def of(cls, allowed_targets: Iterable[str], *, trust: Trust = Trust.NOTHING) -> Grants:
        """The grants of a validated config's `allowed_targets` (each entry was granted when it
        validated), less any that cannot name a package of the user's own."""
        usable, _ = usable_prefixes(allowed_targets)
        return cls(tuple(usable), trust)

    @classmethod
    def checked(cls, entries: Iterable[object], *, trust: Trust) -> Grants:
        """The entries of a config's `allowed_targets` that `trust` grants (the others are
        `allowed_prefix_problem`s)."""
        usable = (e for e in entries if allowed_prefix_problem(e, trust=trust) is None)
        return cls(tuple(usable), trust)


NO_GRANTS = Grants()  # nothing beyond tfrecipe's allow-list
