"""Every key is a door until a payload through it is refused or shown inert (issue 44).

The keys come from the composed configs (tests/helpers/door_sweep.py: every group option, every
recipe, every launcher and sweeper Hydra finds installed), not from a list. Through each leaf, as
a config file would set it (nothing the command line grants), go a newline with a shell line,
`${oc.env:SECRET}`, `../` and absolute paths, and terminal escapes:

- the main config's leaves through the real check of a resolved config
  (`schema.container_problems`, as `validate` runs it), one leaf at a time;
- Hydra's node, every leaf at once per payload, through `hydra_node.hydra_problems`; a leaf it
  accepts is then rendered into what Hydra and the launcher make of it (the sbatch script
  submitit writes, the folders and files Hydra names, `.hydra/hydra.yaml`).

A refusal is one line per problem, without the secret or a raw escape. An accepted payload must be
inert: no new line in the sbatch script, no secret in any name or saved config, no path outside
the run or sweep dir. Nothing runs (a marker file) and nothing is written.

The findings are the inventory: the main-config keys that take free text (the doors) must each
have their guard in tfrecipe/config/doors.py, and docs/security.md's table is this test's report
(`PYTHONPATH=tests python tests/trust/test_door_sweep.py` rewrites it).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from pathlib import Path

import pytest
from conftest import REPO
from helpers import door_sweep
from helpers.door_sweep import PAYLOADS, SECRET, SECRET_NAME
from omegaconf import OmegaConf

from tfrecipe.config import doors
from tfrecipe.config.grants import Grants
from tfrecipe.config.hydra_keys import GUARDED, RECORDS, SET_BY_HYDRA, leaves
from tfrecipe.config.hydra_node import hydra_problems
from tfrecipe.config.schema import container_problems
from tfrecipe.config.secrets import redact_config
from tfrecipe.config.trust import Trust

ESCAPE = "\x1b"
DOC = REPO / "docs" / "security.md"
TABLE_START, TABLE_END = "<!-- door sweep: begin -->", "<!-- door sweep: end -->"
# What a free-text payload is (the ones a number, flag or fixed choice never takes).
FREE_TEXT = ("shell", "parent", "absolute", "escape")


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """The marker a command would make, and a folder outside every run and sweep dir (one for
    the module: the payloads' text, and so the sweep's findings, are the same in every test)."""
    base = tmp_path_factory.mktemp("door_sweep")
    (base / "outside").mkdir()
    return base / "ran", base / "outside"


@pytest.fixture
def probe(places, tmp_path, monkeypatch):
    """The secret in the environment, an empty working folder and the payloads' text."""
    monkeypatch.setenv(SECRET_NAME, SECRET)
    marker, outside = places
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    texts = {
        n: p.replace("{marker}", str(marker)).replace("{outside}", str(outside))
        for n, p in PAYLOADS.items()
    }
    yield texts
    assert not marker.exists(), "a payload ran a command"
    assert list(work.iterdir()) == [] and list(outside.iterdir()) == [], "a check wrote files"


def _check_lines(problems) -> None:
    """Each refusal as the command line prints it (cli.main: redacted): one plain line."""
    from tfrecipe.config.secrets import redact_text

    for problem in problems:
        line = redact_text(str(problem))
        assert "\n" not in line and ESCAPE not in line, f"not one plain line: {line!r}"
        assert SECRET not in line, f"the secret in a refusal: {line}"


# --- the main config ---------------------------------------------------------------------------
def _clean_containers():
    """(overrides, resolved config without Hydra's node) of each composition the schema takes."""
    for composed in door_sweep.compositions():
        cfg = composed.cfg
        container = {
            key: OmegaConf.to_container(cfg[key], resolve=True, throw_on_missing=False)
            if OmegaConf.is_config(cfg[key])
            else cfg[key]
            for key in cfg
            if key != "hydra"
        }
        run, baseline = container_problems(container, None, trust=Trust.NOTHING)
        if run is not None:  # the schema took it: a payload's problems are its own
            yield composed.overrides, container, {str(p) for p in baseline}


@functools.cache
def _main_findings(texts: tuple[tuple[str, str], ...]) -> dict[str, set[str]]:
    """key -> the payloads it took (refused ones are absent); each refusal checked on the way."""
    from tfrecipe.config import secrets

    with pytest.MonkeyPatch.context() as patch:  # the environment's secrets read once
        patch.setattr(secrets, "secret_values", functools.cache(secrets.secret_values))
        return _sweep_main(texts)


def _sweep_main(texts: tuple[tuple[str, str], ...]) -> dict[str, set[str]]:
    accepted: dict[str, set[str]] = {}
    seen = set()
    for _, container, baseline in _clean_containers():
        for key in door_sweep.leaves(container):
            section = container.get(key.split(".")[0])
            option = (
                {k: section.get(k) for k in ("_target_", "name")}
                if isinstance(section, dict)
                else None
            )
            if (key, repr(option)) in seen:  # the same key of the same option: checked
                continue
            seen.add((key, repr(option)))
            accepted.setdefault(key, set())
            for name, text in texts:
                value = SECRET if name == "secret" else text  # as ${oc.env:...} resolves
                probed = door_sweep.put(container, key, value)
                _, problems = container_problems(probed, None, trust=Trust.NOTHING)
                new = [p for p in problems if str(p) not in baseline]
                _check_lines(new)
                if not new:
                    saved = json.dumps(redact_config(probed))
                    assert SECRET not in saved, f"{key}: the secret reaches config.yaml"
                    accepted[key].add(name)
    return accepted


def test_every_main_config_leaf_refuses_each_payload_or_keeps_it_inert(probe):
    findings = _main_findings(tuple(probe.items()))
    assert len(findings) > 200, "the sweep found the config's leaves"
    assert "allowed_targets" in findings and "model._target_" in findings
    # Code: a target, an allow-list entry or a shell line is never taken from a file.
    for key, taken in findings.items():
        if key.endswith("_target_") or key.startswith("allowed_targets"):
            assert not taken, f"{key} took {sorted(taken)} from a config file"


def main_doors(findings: dict[str, set[str]]) -> dict[str, list[str]]:
    """The main-config keys that take free text: key -> the payloads they took."""
    return {k: sorted(v) for k, v in sorted(findings.items()) if set(FREE_TEXT) & v}


def test_every_key_that_takes_free_text_has_its_guard_in_the_inventory(probe):
    found = main_doors(_main_findings(tuple(probe.items())))
    unguarded = [k for k in found if doors.find(k) is None and k not in doors.NOT_DOORS]
    assert not unguarded, (
        "these keys take free text from a config file: give each its guard in "
        f"tfrecipe/config/doors.py (CONFIG_DOORS, or NOT_DOORS with why it is inert): {unguarded}"
    )


# --- Hydra's node ------------------------------------------------------------------------------
def _hydra_nodes():
    """Each distinct Hydra node of the compositions (launcher, sweeper, their nested options)."""
    seen = set()
    for composed in door_sweep.compositions():
        written = OmegaConf.to_container(composed.cfg.hydra, resolve=False)
        for key in SET_BY_HYDRA:  # the job's name for these overrides: not a config's
            written["job"].pop(key.rsplit(".", 1)[1], None)
        shape = repr({k: v for k, v in written.items() if k not in RECORDS})
        if shape not in seen:
            seen.add(shape)
            yield composed


def _hydra_keys(cfg) -> list[str]:
    written = OmegaConf.to_container(cfg.hydra, resolve=False)
    keys = door_sweep.leaves({k: v for k, v in written.items() if k not in RECORDS})
    return [f"hydra.{key}" for key in keys if f"hydra.{key}" not in SET_BY_HYDRA]


def _named(key: str, problem_keys: set[str]) -> bool:
    return any(key == p or key.startswith(f"{p}.") or p.startswith(f"{key}.") for p in problem_keys)


@functools.cache
def _hydra_findings(texts: tuple[tuple[str, str], ...]) -> dict[str, set[str]]:
    """hydra key -> the payloads it took; the accepted ones, all at once, shown inert in Hydra's
    sinks (on a failure, key by key, to name the one)."""
    accepted: dict[str, set[str]] = {}
    for composed in _hydra_nodes():
        keys = _hydra_keys(composed.cfg)
        for name, text in texts:
            node = door_sweep.hydra_with(composed.cfg, dict.fromkeys(keys, text))
            problems = hydra_problems(node, grants=Grants())
            _check_lines(problems)
            refused = {p.key for p in problems}
            taken = [k for k in keys if not _named(k, refused) and not _is_guarded(k)]
            try:
                _assert_inert(composed.cfg, taken, text)
            except AssertionError:
                for key in taken:
                    _assert_inert(composed.cfg, [key], text)
                raise
            for key in keys:
                accepted.setdefault(key, set()).update([name] if key in taken else [])
    return accepted


def _matches(key: str, globs) -> bool:
    return any(fnmatch.fnmatchcase(key, glob) for glob in globs)


def _is_guarded(key: str) -> bool:
    """A key whose own check runs outside `hydra_problems` (a sweep's params: cli.sweeps)."""
    return key.startswith(("hydra.sweeper.params", "hydra.sweeper.search_space"))


def _assert_inert(cfg, keys: list[str], text: str) -> None:
    """`text` at each of `keys`: no secret or escape in a name or value Hydra uses, no folder or
    file outside the run or sweep dir, no new line in the sbatch script."""
    job = {"hydra.runtime.output_dir": "${hydra.run.dir}", "hydra.job.num": 0, "hydra.job.id": "0"}
    node = door_sweep.hydra_with(cfg, {**job, **dict.fromkeys(keys, text)})  # as the job sees it
    for where, value in _resolved_strings(node):
        assert SECRET not in value, f"{keys}={text!r}: the secret reaches {where}"
        if where.split(".")[0] not in ("help", "hydra_help"):
            assert ESCAPE not in value and "\n" not in value, f"{keys}: raw text reaches {where}"
    run_dir, sweep_dir = Path(_select(node, "run.dir")), Path(_select(node, "sweep.dir"))
    for where, folder in _hydra_paths(node).items():
        base = sweep_dir if where.startswith(("sweep.", "launcher.", "sweeper.")) else run_dir
        assert _inside(folder, base), f"{keys}={text!r}: {where} writes to {folder}"
    if str(_select(node, "launcher._target_")).endswith("SlurmLauncher"):
        assert _commands(_sbatch(node)) == _commands(_sbatch(cfg.hydra)), f"{keys}: sbatch line"


def _select(node, key: str):
    try:
        return OmegaConf.select(node, key, throw_on_missing=True)
    except Exception:  # set only in the job
        return None


def _resolved_strings(node):
    written = OmegaConf.to_container(node, resolve=False)
    for key, _ in leaves({k: v for k, v in written.items() if k not in RECORDS}, ""):
        value = _select(node, key.lstrip("."))
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                yield key.lstrip("."), item


def _hydra_paths(node) -> dict[str, Path]:
    """Where Hydra and its plugins write, as this node says: each job's dir, the output subdir,
    log files, submitit's folder, a storage file."""
    paths = {
        "sweep.subdir": Path(str(_select(node, "sweep.dir"))) / str(_select(node, "sweep.subdir"))
    }
    if _select(node, "output_subdir") is not None:
        paths["output_subdir"] = Path(str(_select(node, "run.dir"))) / str(
            _select(node, "output_subdir")
        )
    for part in ("job_logging", "hydra_logging"):
        for name, handler in (_select(node, f"{part}.handlers") or {}).items():
            if "filename" in handler:
                paths[f"{part}.{name}"] = Path(
                    str(_select(node, f"{part}.handlers.{name}.filename"))
                )
    folder = _select(node, "launcher.submitit_folder")
    if folder is not None:
        paths["launcher.submitit_folder"] = Path(str(folder))
    storage = _select(node, "sweeper.storage")
    if isinstance(storage, str) and (match := re.match(r"^\w+:///?(.+)$", storage)):
        paths["sweeper.storage"] = Path(match[1])
    return paths


def _inside(path: Path, folder: Path) -> bool:
    import os

    path, folder = (Path(os.path.normpath(p.absolute())) for p in (path, folder))
    return path == folder or path.is_relative_to(folder)


def _sbatch(node) -> str:
    """The sbatch script submitit writes for this launcher node (no SLURM needed)."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    params = OmegaConf.to_container(node.launcher, resolve=True)
    params.pop("_target_")
    init = {
        "folder": params.pop("submitit_folder"),
        "slurm_max_num_timeout": params.pop("max_num_timeout"),
    }
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    affinity = submitit.SlurmExecutor.affinity
    submitit.SlurmExecutor.affinity = classmethod(lambda cls: 1)  # no srun here
    try:
        executor = submitit.AutoExecutor(cluster="slurm", **init)
    finally:
        submitit.SlurmExecutor.affinity = affinity
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    return executor._executor._make_submission_file_text("python -m tfrecipe", "uid")


def _commands(script: str) -> list[str]:
    """The program each command line of a script runs (its paths may differ: not the lines)."""
    lines = [line for line in script.splitlines() if line.strip() and not line.startswith("#")]
    return [line.split()[0] for line in lines]


def test_every_hydra_leaf_refuses_each_payload_or_keeps_it_inert(probe):
    findings = _hydra_findings(tuple(probe.items()))
    launchers = {str(c.cfg.hydra.launcher._target_) for c in _hydra_nodes()}
    assert any(t.endswith("SlurmLauncher") for t in launchers), launchers
    assert "hydra.launcher.comment" in findings and "hydra.job.name" in findings
    for key in ("hydra.launcher", "hydra.job", "hydra.sweeper"):
        free = {
            k: v
            for k, v in findings.items()
            if k.startswith(f"{key}.") and set(FREE_TEXT) & v and not _matches(k, GUARDED)
        }
        assert not free, f"free text taken from a config file under {key}: {free}"


def test_the_sbatch_render_sees_a_shell_line(probe):
    """The sink check is not blind: a comment with a newline adds a command to the script."""
    composed = next(
        c for c in _hydra_nodes() if str(c.cfg.hydra.launcher._target_).endswith("SlurmLauncher")
    )
    node = door_sweep.hydra_with(composed.cfg, {"hydra.launcher.comment": probe["shell"]})
    assert _commands(_sbatch(node)) != _commands(_sbatch(composed.cfg.hydra))


# --- the report: docs/security.md's table is what this sweep found -----------------------------
def report(main: dict[str, set[str]], hydra: dict[str, set[str]]) -> str:
    """The doors the sweep found, as docs/security.md shows them."""
    lines = [
        TABLE_START,
        "| key (a config file sets it) | took | reaches | guard |",
        "|---|---|---|---|",
    ]
    for key, taken in main_doors(main).items():
        door = doors.find(key)
        sink, guard = (door.sink, door.guard) if door else ("none", doors.NOT_DOORS[key])
        lines.append(f"| `{key}` | {', '.join(taken)} | {sink} | {guard} |")
    for key, taken in sorted(hydra.items()):
        if set(FREE_TEXT) & taken and not _matches(key, GUARDED):
            lines.append(
                f"| `{key}` | {', '.join(sorted(taken))} | hydra | inert: no script line, "
                "name, secret or path outside the run dir in what Hydra makes of it |"
            )
    refused = sorted(k for k, v in hydra.items() if not v and not _matches(k, GUARDED))
    guarded = sorted(k for k in hydra if _matches(k, GUARDED))
    lines += [
        "",
        f"Refused from a config file, every payload ({len(refused)} Hydra keys): "
        + ", ".join(f"`{k}`" for k in refused)
        + ".",
        "",
        "Checked by their own rule (`hydra_keys.GUARDED`): "
        + ", ".join(f"`{k}`" for k in guarded)
        + ".",
        TABLE_END,
    ]
    return "\n".join(lines)


def _findings(texts):
    return _main_findings(texts), _hydra_findings(texts)


def test_the_security_doc_lists_the_doors_this_sweep_found(probe):
    text = DOC.read_text()
    assert TABLE_START in text and TABLE_END in text, "docs/security.md has the sweep's table"
    shown = text[text.index(TABLE_START) : text.index(TABLE_END) + len(TABLE_END)]
    expected = report(*_findings(tuple(probe.items())))
    assert shown == expected, (
        "stale: run `PYTHONPATH=tests python tests/trust/test_door_sweep.py` to rewrite the table"
    )


if __name__ == "__main__":  # rewrites docs/security.md's table from the sweep's findings
    import os
    import tempfile

    os.environ[SECRET_NAME] = SECRET
    base = Path(tempfile.mkdtemp())
    texts = tuple(
        (n, p.replace("{marker}", str(base / "ran")).replace("{outside}", str(base / "outside")))
        for n, p in PAYLOADS.items()
    )
    os.chdir(base)
    table = report(*_findings(texts))
    doc = DOC.read_text()
    start, end = doc.index(TABLE_START), doc.index(TABLE_END) + len(TABLE_END)
    DOC.write_text(doc[:start] + table + doc[end:])
