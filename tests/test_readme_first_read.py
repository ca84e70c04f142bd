"""The README as a newcomer reads it (issue 49, item 11): the tour is about the tour (no project
history), "grant code" is defined where it is first used, the loop row holds loop options, the
install says its size and time, and the fast tier's figures live in one place (docs/layout.md)."""

from __future__ import annotations

import re

from conftest import REPO

README = (REPO / "README.md").read_text()
LAYOUT = (REPO / "docs" / "layout.md").read_text()


def _section(title: str) -> str:
    return README.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_tour_tells_no_project_history():
    tour = _section("A three-minute tour")
    for history in (
        "Before tfrecipe",
        "AVX2-only",
        "intra_op_threads",
        "TensorFlow's default threads",
    ):
        assert history not in tour, history


def test_granting_code_is_defined_where_the_readme_first_speaks_of_it():
    first_use = re.search(r"\bgrant", README, re.IGNORECASE)
    assert first_use is not None
    definition = README.index("*Granting code* means")
    assert definition <= first_use.start() + 1, README[first_use.start() - 200 : first_use.end()]


def test_the_loop_row_holds_loop_options_only():
    (row,) = [line for line in README.splitlines() if line.startswith("| `loop` |")]
    assert "lr_find" not in row and "lr-find" not in row and "ensemble" not in row
    assert "`tfrecipe lr-find" in README and "`ensemble.seeds=3`" in README


def test_the_set_up_says_the_install_size_and_time():
    setup = _section("Set-up: two commands")
    assert re.search(r"about [\d.]+ GB", setup) and re.search(r"about [\d.]+ minutes", setup)


def test_the_fast_tier_figures_live_in_docs_layout_only():
    setup = _section("Set-up: two commands")
    assert "docs/layout.md" in setup
    assert not re.search(r"fast tier \(\d", README)  # no count of its own to drift
    assert len(re.findall(r"fast tier", LAYOUT)) >= 1
    assert re.search(
        r"\d+ tests in\s+\d+:\d\d of wall\s+time", LAYOUT.split("## The test suite")[1]
    )
