"""Subcommands that need no TensorFlow: `ls`, `cat`, `cp`, `validate` (and `compare`).

tfrecipe ls                          recipes and config groups, one line each
tfrecipe cat NAME [overrides]        the config a recipe composes to
tfrecipe cp NAME PATH                copy a recipe to edit it
tfrecipe validate [NAME|PATH] [overrides]   check everything without training
tfrecipe compare DIR... [--sort METRIC] [--out DIR]   compare finished runs
tfrecipe evaluate RUN_DIR [--model FILE] [overrides]   a run's model on its test split
tfrecipe baseline RUN_DIR [overrides]   scikit-learn's baselines on a run's split
tfrecipe lr-find [overrides]         a learning-rate sweep (lr_find.png, a suggested rate)
tfrecipe predict RUN_DIR INPUT... [--output FILE]   a run's predictions for new files
tfrecipe export RUN_DIR --format F   a finished run in more formats (onnx, litert, ...)
tfrecipe serve RUN_DIR [--name NAME] [--port P]   TF Serving's REST API for a run's model
tfrecipe card RUN_DIR                MODEL_CARD.md from a run's records
tfrecipe help [overrides]            the same as `tfrecipe --help`
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tfrecipe.config import compose as configs
from tfrecipe.config.secrets import redact_text
from tfrecipe.config.trust import Trust
from tfrecipe.errors import ConfigError, Problem
from tfrecipe.tasks import MODEL_ARGUMENTS, OLD_SIGNATURE_HINT

# Runtime arguments the factory passes to builders, besides the configured ones.
_RUNTIME_ARGUMENTS = {"model": MODEL_ARGUMENTS, "dataset": ()}


def _description(path: Path) -> str:
    """The first sentence of a YAML file's leading comment (its command lines and Hydra's
    `@package` line skipped), however many lines it spans."""
    words = []
    for line in path.read_text().splitlines():
        text = line.lstrip("# ").strip()
        if not line.startswith("#") or (not text and words):
            break  # the end of the leading comment, or of its first paragraph
        if text and not text.startswith(("python ", "tfrecipe ", "@")):
            words.append(text)
    # A sentence ends at . ! ? before a capital or a backquote ("e.g. x" goes on).
    return re.split(r"(?<=[.!?])\s+(?=[A-Z0-9`])", " ".join(words), maxsplit=1)[0]


def ls(args: list[str]) -> None:
    root = configs.config_dir()
    recipes = sorted(configs.recipes_dir().glob("*.yaml"))
    groups = sorted(p for p in root.iterdir() if p.is_dir())
    options = {group: sorted(group.glob("*.yaml")) for group in groups}
    width = max(len(p.stem) for p in [*recipes, *(o for group in options.values() for o in group)])
    defaults = OmegaConf.to_container(
        OmegaConf.load(root / f"{configs.PRIMARY_CONFIG}.yaml").defaults
    )
    chosen = {k: v for item in defaults if isinstance(item, dict) for k, v in item.items()}
    print("recipes (recipe=NAME):")
    for path in recipes:
        print(_listed(" ", path, width))
    for group in groups:
        print(f"{group.name}:")
        default = chosen.get(group.name)
        for option in options[group]:
            marker = "*" if option.stem == default or option.stem in (default or []) else " "
            print(_listed(marker, option, width))
    print("(* = default)")


def _listed(marker: str, path: Path, width: int) -> str:
    """One entry of `ls`: its name and whole first sentence, wrapped under the description."""
    import shutil
    import textwrap

    indent = " " * (width + 4)
    columns = max(60, shutil.get_terminal_size((100, 24)).columns)
    text = f" {marker}{path.stem:<{width}}  {_description(path)}"
    return textwrap.fill(text, width=columns, subsequent_indent=indent, break_on_hyphens=False)


def _recipe_overrides(name_or_path: str) -> list[str]:
    """`recipe=NAME` for a shipped recipe, or for a recipe file registered under its stem."""
    if name_or_path.endswith((".yaml", ".yml")):
        return configs.recipe_file_overrides([f"recipe={name_or_path}"])
    available = sorted(p.stem for p in configs.recipes_dir().glob("*.yaml"))
    if name_or_path not in available:
        raise ConfigError(
            f"recipe={name_or_path}: unknown recipe; available: {', '.join(available)}"
        )
    return [f"recipe={name_or_path}"]


def _split(args: list[str]) -> tuple[list[str], list[str]]:
    """(recipe overrides, other overrides) from `[NAME|PATH] [key=value ...]`."""
    if args and "=" not in args[0]:
        return _recipe_overrides(args[0]), args[1:]
    return [], args


def cat(args: list[str]) -> None:
    if not args:
        raise ConfigError("cat: expected a recipe name, received nothing; see `tfrecipe ls`")
    recipe, overrides = _split(args)
    cfg = configs.compose([*recipe, *overrides])
    # resolved: a recipe's ${oc.env:...} shows no secret of this environment
    print(redact_text(OmegaConf.to_yaml(cfg, resolve=True)), end="")


def cp(args: list[str]) -> None:
    if len(args) != 2:
        raise ConfigError(f"cp: expected NAME PATH, received {' '.join(args) or 'nothing'}")
    name, destination = args
    _recipe_overrides(name)
    target = Path(destination)
    if target.is_dir():
        target = target / f"{name}.yaml"
    if target.exists():
        raise ConfigError(f"cp: {target} already exists; choose another path (nothing copied)")
    if not target.parent.is_dir():
        raise ConfigError(
            f"cp: {target.parent} is not a directory; create it first or choose another path "
            "(nothing copied)"
        )
    text, command = _with_command((configs.recipes_dir() / f"{name}.yaml").read_text(), target)
    try:
        with open(target, "x") as copy:  # "x": a file that appeared meanwhile stays as it is
            try:
                copy.write(text)
            except OSError:
                Path(copy.name).unlink()  # no half-written copy (a full disk)
                raise
    except OSError as error:
        raise ConfigError(f"cp: cannot write {target} ({error.strerror}); nothing copied") from None
    print(
        f"copied recipe {name} to {target}; check it with `tfrecipe validate {shlex.quote(str(target))}`, run it "
        f"with `{command}`"
    )


def _with_command(text: str, target: Path) -> tuple[str, str]:
    """(the recipe text whose first line runs the copy at `target`, that command)."""
    first, _, rest = text.partition("\n")
    selection = shlex.quote(f"recipe={target}")
    if first.startswith("# python -m tfrecipe "):  # keep its flags (a sweep preset's -m)
        command = re.sub(r"recipe=\S+", lambda _: selection, first[2:])
        return f"# {command}\n{rest}", command
    command = f"python -m tfrecipe {selection}"
    return f"# {command}\n{text}", command


def help_text(overrides: list[str], *, resolve: bool = False) -> str | None:
    """`tfrecipe --help`: Hydra's help template (`hydra.help`) filled in by tfrecipe, or None where
    the template asks for Hydra's own config groups (then Hydra answers).

    Hydra lists the config groups by copying its whole config store once per group and option
    (1.3-1.9 s); the groups are the folders of conf/ and recipes/, listed here in milliseconds,
    so --help answers as fast as --cfg job.
    """
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import get_args_parser
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import flag_override

    cfg = configs.compose(overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # what `${hydra:...}` in the help resolves against
    template = cfg.hydra.help.template
    if "HYDRA_CONFIG_GROUPS" in template:
        return None
    with flag_override(cfg, ["struct", "readonly"], [False, False]):
        del cfg["hydra"]
    return string.Template(template).substitute(
        FLAGS_HELP=Hydra.format_args_help(get_args_parser()),
        APP_CONFIG_GROUPS="".join(f"{g}: {', '.join(o)}\n" for g, o in _group_options().items()),
        CONFIG=redact_text(OmegaConf.to_yaml(cfg, resolve=resolve)),  # as `cat` prints it
    )


def _group_options() -> dict[str, list[str]]:
    """Every config group (recipes too) and its options, sorted: what `group=option` accepts."""
    groups = {
        group.name: sorted(option.stem for option in group.glob("*.yaml"))
        for group in configs.config_dir().iterdir()
        if group.is_dir()
    }
    groups["recipe"] = sorted(recipe.stem for recipe in configs.recipes_dir().glob("*.yaml"))
    return dict(sorted(groups.items()))


def target_problems(cfg: DictConfig, trust: Trust) -> list[Problem]:
    """Every allowed `_target_` exists and accepts its configured arguments (read from source;
    a target the allow-list refuses is the schema's problem, and its source is not read)."""
    from tfrecipe.config.grants import Grants
    from tfrecipe.config.instantiate import iter_targets, target_problem
    from tfrecipe.config.schema import MODEL_OPTIONS  # the factory applies them, not builders
    from tfrecipe.config.targets import Unresolvable, argument_problems

    job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    grants = Grants.checked(cfg.get("allowed_targets") or [], trust=trust)
    problems = []
    for key, target, node in iter_targets(OmegaConf.to_container(job, resolve=False)):
        if target_problem(target, key=key, grants=grants) is not None:
            continue
        applied = ("_target_", *(MODEL_OPTIONS if key == "model" else ()))
        given = [*(k for k in node if k not in applied), *_RUNTIME_ARGUMENTS.get(key, ())]
        try:
            found = argument_problems(target, given)
        except Unresolvable as error:
            problems.append(Problem(f"{key}._target_", hint=f"cannot find {target!r} ({error})"))
            continue
        if key == "model" and "missing argument 'num_classes'" in found:
            found = [OLD_SIGNATURE_HINT]  # a builder written before tasks: one clear fix
        problems += [Problem(key, hint=f"{target} {p}") for p in found]
    return problems


# What `validate` checked, and what only a run finds out.
VALIDATED = (
    "checked: every key and value, and every _target_ with its arguments; not read: the data "
    "(files, labels, shapes are checked when a run loads it)"
)


def validate(args: list[str]) -> None:
    from hydra.types import RunMode

    from tfrecipe.cli.sweeps import fixed_overrides
    from tfrecipe.config.schema import validate as validate_schema

    sweeping = any(a in ("-m", "--multirun") for a in args)
    recipe, overrides = _split([a for a in args if a not in ("-m", "--multirun")])
    # With Hydra's node: what Hydra itself would instantiate is checked too. A sweep's values
    # are its jobs' (each checked below): this is what they share.
    shared = fixed_overrides(overrides) if sweeping else overrides
    cfg, problems = _composed_for_validate([*recipe, *shared])
    run = None
    trust = Trust.from_command_line(overrides)
    try:
        run = validate_schema(cfg, trust=trust, environment=True)
    except ConfigError as error:
        problems += error.problems
    reported = {p.slot for p in problems}
    problems += [p for p in target_problems(cfg, trust) if p.slot not in reported]
    if run is not None:  # what the run finds on disk first
        from tfrecipe import init_source

        problems += init_source.resume_problems(run.resume)
        if run.resume in ("auto", "never"):  # resume=PATH: init_from is unread
            problems += init_source.source_problems((run.model.model_extra or {}).get("init_from"))
    if sweeping or OmegaConf.select(cfg, "hydra.mode") == RunMode.MULTIRUN:
        problems += [p for p in _sweep_problems(recipe, overrides, trust) if p not in problems]
    if problems:
        raise ConfigError(problems)
    from tfrecipe.printed import redact_words

    print(f"valid: {' '.join(redact_words(args)) or 'the default config'}")
    print(f"  {VALIDATED}")
    from tfrecipe.config.plan import RunPlan  # no TensorFlow: what the run will decide

    print("plan:" + "".join(f"\n  {line}" for line in RunPlan.from_config(run).lines()))


def _composed_for_validate(overrides: list[str]) -> tuple[DictConfig, list[Problem]]:
    """The composed config, or, where overrides name unknown keys or options, the config the
    others compose and a problem for each of them: validate reports all at once."""
    from tfrecipe.cli.hydra_errors import describe, hydra_errors

    try:
        return configs.compose(overrides, return_hydra_config=True), []
    except hydra_errors() as error:
        if getattr(error, "composed_without", None) is None:
            raise
        every = configs.every_error(error)
        return error.composed_without, [Problem("", hint=describe(e)) for e in every]


def _sweep_problems(recipe: list[str], overrides: list[str], trust: Trust) -> list[Problem]:
    """Every job of the sweep these arguments start, checked as the run checks them."""
    from hydra._internal.utils import get_args_parser

    from tfrecipe.cli.sweeps import sweep_problems

    configs.register_recipes()
    args = get_args_parser().parse_args(["-m", *recipe, *overrides])
    return sweep_problems(args, trust, validate)[0]


def evaluate(args: list[str]) -> None:
    if not args:  # said here, before TensorFlow loads
        raise ConfigError(
            "evaluate: expected RUN_DIR (a run directory: its config.yaml and model.keras), "
            "received nothing; usage: tfrecipe evaluate RUN_DIR [--model model.keras|best|"
            "model-NNN.keras] [key=value ...]"
        )
    from tfrecipe.cli.console import quiet_start_up

    with quiet_start_up():  # TensorFlow's start-up lines off the console, as training's
        from tfrecipe.cli.evaluate import main as evaluate_main  # imports TensorFlow

        evaluate_main(args)


def baseline(args: list[str]) -> None:
    if not args:  # said here, before TensorFlow loads
        raise ConfigError(
            "baseline: expected RUN_DIR (a finished run's directory), received nothing; usage: "
            "tfrecipe baseline RUN_DIR [key=value ...] [--json]"
        )
    from tfrecipe.cli.baseline import main as baseline_main
    from tfrecipe.cli.console import discover_devices

    discover_devices()  # imports TensorFlow: the run's encoders are Keras layers
    baseline_main(args)


def predict(args: list[str]) -> None:
    from tfrecipe.cli.console import quiet_start_up
    from tfrecipe.cli.predict import main as predict_main  # TensorFlow once the input is checked

    with quiet_start_up():
        predict_main(args)


def export(args: list[str]) -> None:
    from tfrecipe.cli.console import quiet_start_up
    from tfrecipe.cli.export import main as export_main  # TensorFlow once the input is checked

    with quiet_start_up():
        export_main(args)


def serve(args: list[str]) -> None:
    from tfrecipe.cli.console import quiet_start_up
    from tfrecipe.cli.serve import main as serve_main  # TensorFlow once the run dir is checked

    with quiet_start_up():
        serve_main(args)


def card(args: list[str]) -> None:
    from tfrecipe.cli.card import main as card_main  # no TensorFlow: records only

    card_main(args)


def compare(args: list[str]) -> None:
    from tfrecipe.cli.compare import main as compare_main

    compare_main(args)


def mlflow_sync(args: list[str]) -> None:
    """`tfrecipe mlflow-sync RUN_DIR... [--tracking-uri URI]`: uploads the local MLflow record
    a run kept while its tracking server could not be reached."""
    import argparse
    import os

    parser = argparse.ArgumentParser(prog="tfrecipe mlflow-sync", description=mlflow_sync.__doc__)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run dirs with a local record")
    parser.add_argument("--tracking-uri", help="where to (default: MLFLOW_TRACKING_URI)")
    options = parser.parse_args(args)
    uri = options.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ConfigError(
            "mlflow-sync: no tracking URI; pass --tracking-uri http://HOST:PORT (or set "
            "MLFLOW_TRACKING_URI)"
        )
    from tfrecipe.tracking.mlflow_store import shown, sync_local_record

    for run_dir in options.run_dirs:
        try:
            run_id = sync_local_record(run_dir, uri)
        except ValueError as error:
            raise ConfigError(f"mlflow-sync: {error}") from None
        print(f"{run_dir}: uploaded to {shown(uri)} as run {run_id}")


def k8s(args: list[str]) -> None:
    from tfrecipe.cli.k8s import main as k8s_main  # no TensorFlow

    k8s_main(args)


COMMANDS: dict[str, Callable[[list[str]], None]] = {
    "ls": ls,
    "cat": cat,
    "cp": cp,
    "validate": validate,
    "compare": compare,
    "evaluate": evaluate,
    "baseline": baseline,
    "predict": predict,
    "export": export,
    "serve": serve,
    "card": card,
    "mlflow-sync": mlflow_sync,
    "k8s": k8s,
}
