"""docs/tracking.md's way to browse MLflow runs (issue 49, item 7): tfrecipe's venv has
mlflow-skinny, whose `mlflow ui` has no web pages ("Unable to display MLflow UI"), so the docs
run the full `mlflow` from a venv of its own, pointed at the store a run writes. Installing it
needs a network (the block is marked); what can be checked here is checked: the pages are
missing here, and the command the docs give runs the other venv's mlflow on the run's store."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

from conftest import REPO

from tfrecipe.tracking.mlflow_store import DEFAULT_STORE

PAGE = REPO / "docs" / "tracking.md"


def _ui_block() -> list[list[str]]:
    text = PAGE.read_text()
    block = text.split("tests/test_tracking_ui.py checks the commands' shape -->\n```bash\n")[1]
    lines = block.split("```")[0].splitlines()
    return [shlex.split(part) for line in lines for part in line.split("&&") if part.strip()]


def test_this_venvs_mlflow_has_no_ui_pages_so_the_docs_do_not_run_it_here():
    spec = importlib.util.find_spec("mlflow")
    assert spec is not None and spec.origin is not None
    pages = Path(spec.origin).parent / "server" / "js" / "build" / "index.html"
    shown = re.findall(r"^\s*(?:\$ )?mlflow ui\b.*$", PAGE.read_text(), re.M)
    if not pages.exists():  # mlflow-skinny: `mlflow ui` serves "Unable to display MLflow UI"
        assert shown == [], f"docs/tracking.md runs this venv's mlflow ui: {shown}"


def test_the_docs_ui_runs_a_full_mlflow_of_its_own_venv_on_the_runs_store():
    make, install, serve = _ui_block()
    assert make[:3] == ["python3", "-m", "venv"]
    venv = make[3]
    assert install[:2] == [f"{venv}/bin/pip", "install"]
    (package,) = install[2:]
    assert re.fullmatch(r"mlflow[<>=,.\d]*", package), package  # the full mlflow, not -skinny
    assert serve[:2] == [f"{venv}/bin/mlflow", "ui"]
    store = serve[serve.index("--backend-store-uri") + 1]
    assert store.startswith("sqlite:///") and store.endswith(f"/{DEFAULT_STORE}")
