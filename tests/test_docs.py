"""The README stays a page a newcomer reads in ten minutes, every relative link in it and in
docs/ leads somewhere that exists (file and heading), every `python -m tfrecipe` command they show
passes `tfrecipe validate`, and the README's Python example runs as written."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO, TINY

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
MAX_README_LINES = 250

# [text](target): not an image's or a code span's brackets; the target up to `)` or a space.
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub makes from a page's headings: lower case, punctuation but `-` and `_`
    dropped, spaces turned into `-`; a repeated heading gets `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _relative_links(page: Path) -> list[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", page.read_text()))
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move the topic to a page "
        "under docs/ and link it"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading(page):
    broken = []
    for target in _relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(REPO)}")
        elif anchor and (file.suffix != ".md" or anchor not in _anchors(file)):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_links_one_page_per_topic():
    linked = {t.partition("#")[0] for t in _relative_links(README)}
    topics = [
        "strategies",
        "data",
        "tasks_and_models",
        "transfer_learning",
        "using_a_model",
        "fault_tolerance",
        "sweeps",
        "configuration",
        "benchmarks",
        "layout",
    ]
    assert {f"docs/{topic}.md" for topic in topics} <= linked


def test_anchor_rules_match_github():
    page = README.parent / "docs" / "data.md"
    assert "csv-and-parquet-tables-datasetcsv-datasetparquet" in _anchors(page)


# Commands a page shows that need what only the reader has; each page says so beside it.
NOT_VALIDATED = {
    "mypkg.": "your own package (the page shows its code)",
    "recipe=mine.yaml": "the copy `tfrecipe cp` makes on the line before",
}


def _commands(page: Path) -> list[list[str]]:
    """The arguments of every `python -m tfrecipe ...` in a page's bash blocks and indented
    (4-space) code, continuation lines (`\\`) joined."""
    shown, fence = [], None
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = None if fence else line[3:].strip() or "text"
        elif fence == "bash" or (fence is None and line.startswith("    ")):
            shown.append(line)
        else:
            shown.append("")
    commands = []
    for line in "\n".join(shown).replace("\\\n", " ").splitlines():
        start = line.find("python -m tfrecipe ")
        if start >= 0:
            commands.append(shlex.split(line[start:], comments=True)[3:])
    return commands


def _first_job(args: list[str]) -> list[str]:
    """A sweep's first job: `key=a,b` -> `key=a` (commas inside [...] or quotes stay); a key a
    sweep function samples (`interval(...)`, `tag(log, ...)`, `choice(...)`, `range(...)`)
    keeps its config value, as the pre-check composes it."""
    if "-m" not in args and "--multirun" not in args:
        return args
    sampled = re.compile(r"^[^=]+=(interval|tag|choice|range)\(")
    return [
        re.sub(r"^([^=\[\]'\"]+=)([^,\[\]'\"]+),[^\[\]'\"]*$", r"\1\2", a)
        for a in args
        if not sampled.match(a)
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_command_a_page_shows_validates(page, capsys, tmp_path):
    """What a newcomer copies must compose and pass every check a run makes before it starts
    (run dirs and launchers, `hydra.*`, are left to the run; a `model.init_from` is the run a
    command before it makes)."""
    from helpers.configs import with_earlier_runs

    from tfrecipe.cli.commands import validate
    from tfrecipe.errors import ConfigError

    failed = []
    for args in _commands(page):
        if any(key in a for a in args for key in NOT_VALIDATED):
            continue
        try:
            job = with_earlier_runs(_first_job(args), tmp_path)
            validate([a for a in job if not a.startswith("hydra.")])
        except (ConfigError, Exception) as error:  # Hydra's own composition errors too
            failed.append(f"python -m tfrecipe {shlex.join(args)}: {str(error).splitlines()[0]}")
    assert not failed, "\n".join(failed)


@pytest.mark.heavy
def test_readme_python_example_trains(tmp_path, monkeypatch):
    """The README's notebook example, run as written but tiny (its overrides + TINY)."""
    text = README.read_text()
    snippet = text.split("<!-- python-api-snippet -->")[1].split("```python")[1].split("```")[0]
    line = re.search(r"^overrides = (\[.*\])$", snippet, re.M)
    assert line, "the README's Python example sets `overrides = [...]` on one line"
    tiny = f"overrides = {line.group(1)} + {TINY!r}"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(snippet.replace(line.group(0), tiny), namespace)
    assert namespace["summary"]["status"] == "completed"
    run_dir = tmp_path / namespace["run_dir"]
    assert run_dir.parent == tmp_path / "outputs" / "notebook"
    assert (run_dir / "summary.json").is_file()
    # the cell run again into the same dir: refused, naming the argument the caller typed
    from tfrecipe.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        namespace["train"](namespace["compose"](namespace["overrides"]), run_dir=run_dir)
    assert str(refused.value) == (
        f"run_dir={run_dir}: already holds a completed run (summary.json); choose another run_dir"
    )


# Before a shell block whose commands the tests do not run as shown: why, and where they run.
_SHELL_MARK = re.compile(
    r"<!-- shell: (needs (?:a network|a GPU|a SLURM cluster)|runs in (tests/\S+\.py))[^>]*-->"
)
_ENV = re.compile(r"[A-Z_][A-Z0-9_]*=")
# Subcommands that answer without TensorFlow: cheap enough to run as the page shows them.
_RUN_HERE = ("ls", "cat", "cp", "validate", "--version")


def _shell_blocks(page: Path) -> list[tuple[int, str | None, list[str]]]:
    """(line, mark, commands) of each bash block: its `<!-- shell: ... -->` mark on the line
    before it, if any, and its command lines (comments cut, continuation lines joined)."""
    lines, blocks = page.read_text().splitlines(), []
    for start, line in enumerate(lines):
        if line != "```bash":
            continue
        end = lines.index("```", start + 1)
        body = "\n".join(lines[start + 1 : end]).replace("\\\n", " ")
        commands = [
            c for c in (shlex.join(shlex.split(b, comments=True)) for b in body.splitlines()) if c
        ]
        before = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        blocks.append(
            (start + 1, before if _SHELL_MARK.fullmatch(before.strip()) else None, commands)
        )
    return blocks


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_shell_command_runs_in_a_test_or_says_what_it_needs(page):
    """A `python -m tfrecipe` line validates (above); a TensorFlow-free subcommand runs below;
    any other block is marked: what it needs that the tests lack, or the test that runs it."""
    unmarked = []
    for line, mark, commands in _shell_blocks(page):
        if mark is not None:
            where = _SHELL_MARK.fullmatch(mark.strip()).group(2)
            assert where is None or (REPO / where).is_file(), f"{page.name}:{line}: no {where}"
            continue
        for command in commands:
            words = list(itertools.dropwhile(_ENV.match, shlex.split(command)))  # VAR=... first
            runs_here = words[:1] == ["tfrecipe"] and words[1:2] and words[1] in _RUN_HERE
            if words[:3] != ["python", "-m", "tfrecipe"] and not runs_here:
                unmarked.append(f"{page.name}:{line}: {command}")
    assert not unmarked, (
        "mark the block before its fence with <!-- shell: needs a network|a GPU|a SLURM cluster "
        "--> or <!-- shell: runs in tests/FILE.py -->: " + "; ".join(unmarked)
    )


@pytest.mark.heavy
def test_the_tensorflow_free_subcommands_run_as_the_pages_show_them(tmp_path):
    """`tfrecipe ls`, `cat`, `cp`, `validate`, `--version` from unmarked blocks, in page order in
    one directory (a `cp` makes the file the next `validate` reads)."""
    import subprocess
    import sys

    shown = [
        shlex.split(command)[1:]
        for page in PAGES
        for _, mark, commands in _shell_blocks(page)
        if mark is None
        for command in commands
        if command.startswith("tfrecipe ") and shlex.split(command)[1] in _RUN_HERE
    ]
    assert {args[0] for args in shown} >= {"ls", "cat", "cp", "validate"}
    for args in shown:
        result = subprocess.run(
            [sys.executable, "-m", "tfrecipe", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"tfrecipe {shlex.join(args)}: {result.stderr[-2000:]}"


def test_the_recipe_table_and_the_recipes_headers_agree():
    """Each metric docs/sweeps.md gives for a recipe is the one its header carries (two places
    drifted apart before: a header kept an older machine's figures)."""
    table = (REPO / "docs" / "sweeps.md").read_text().split("## Recipes", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \| [^|]* \| ([^|]*) \|$", table, re.M)
    assert len(rows) >= 8
    drifted = []
    for recipe, measured in rows:
        header = "".join(
            line
            for line in (REPO / "recipes" / f"{recipe}.yaml").read_text().splitlines()
            if line.startswith("#")
        )
        figures = re.findall(r"\b0\.\d{3,4}\b", measured.split("(")[0])
        drifted += [f"{recipe}: {f}" for f in figures if f not in header.replace("\n", " ")]
    assert not drifted, f"docs/sweeps.md and the recipes' headers differ: {drifted}"
