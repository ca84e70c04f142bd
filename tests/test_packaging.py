"""The wheel, installed into a fresh virtual environment, finds its configs without a checkout.

The wheel is built from this checkout and installed with `--no-deps` into a new venv; the
dependencies (TensorFlow and friends) come from the current environment through a `.pth` line,
so nothing is downloaded again. Every command runs from an unrelated directory, with no
PYTHONPATH, and the test checks that the installed copy, not the checkout, is what runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


def _run(*args: str | Path, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the new venv's bin dir, a working directory outside the checkout)."""
    root = tmp_path_factory.mktemp("packaging")
    dist = root / "dist"
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, REPO, cwd=root, timeout=600)
    (wheel,) = dist.glob("tfrecipe-*.whl")

    venv = root / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=root)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", wheel, cwd=root)
    # The dependencies: this environment's site-packages, after the venv's own (a plain path
    # line: its .pth files, among them the editable checkout's, are not processed).
    new_site = _run(
        python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=root
    )
    (Path(new_site.stdout.strip()) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return venv / "bin", elsewhere


def test_wheel_carries_the_configs_and_recipes(installed):
    bin_dir, _ = installed
    (wheel,) = (bin_dir.parent.parent / "dist").glob("tfrecipe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in sorted((REPO / "conf").rglob("*.yaml")):
        assert f"tfrecipe/conf/{path.relative_to(REPO / 'conf')}" in names
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        assert f"tfrecipe/recipes/{path.name}" in names


def test_the_installed_copy_runs_not_the_checkout(installed):
    bin_dir, elsewhere = installed
    code = "import tfrecipe, tfrecipe.config.compose as c; print(tfrecipe.__file__); print(c.config_dir())"
    package_file, config_dir = _run(bin_dir / "python", "-c", code, cwd=elsewhere).stdout.split()
    venv = str(bin_dir.parent)
    assert package_file.startswith(venv), package_file
    assert config_dir.startswith(venv) and config_dir.endswith("tfrecipe/conf"), config_dir


def test_console_script_prints_the_composed_config(installed):
    bin_dir, elsewhere = installed
    out = _run(bin_dir / "tfrecipe", "--cfg", "job", "model=mlp", cwd=elsewhere).stdout
    assert "_target_: tfrecipe.models.mlp" in out
    assert "per_replica_batch_size: 64" in out and "strategy:" in out
    assert list(elsewhere.iterdir()) == [], "printing the config writes nothing"


def test_a_recipe_composes_from_the_installed_wheel(installed):
    bin_dir, elsewhere = installed
    recipe = "digits_cnn_mirrored"
    assert (REPO / "recipes" / f"{recipe}.yaml").exists()
    out = _run(bin_dir / "tfrecipe", f"recipe={recipe}", "--cfg", "job", cwd=elsewhere).stdout
    assert "name: mirrored" in out and "logical_cpus: 2" in out


def test_group_discovery_from_the_installed_wheel(installed):
    bin_dir, elsewhere = installed
    help_text = _run(bin_dir / "tfrecipe", "--help", cwd=elsewhere).stdout
    listing = _run(bin_dir / "tfrecipe", "ls", cwd=elsewhere).stdout
    for group in sorted(p.name for p in (REPO / "conf").iterdir() if p.is_dir()):
        options = sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))
        assert f"{group}: {', '.join(options)}" in help_text
        assert f"{group}:" in listing and all(option in listing for option in options)


def test_python_dash_m_is_the_same_program(installed):
    bin_dir, elsewhere = installed
    script = _run(bin_dir / "tfrecipe", "--cfg", "job", cwd=elsewhere).stdout
    module = _run(bin_dir / "python", "-m", "tfrecipe", "--cfg", "job", cwd=elsewhere).stdout
    assert script == module


def test_the_wheel_carries_the_optuna_sweeper_plugin(installed):
    bin_dir, elsewhere = installed
    (wheel,) = (bin_dir.parent.parent / "dist").glob("tfrecipe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "hydra_plugins/tfrecipe_optuna_sweeper/optuna_sweeper.py" in names
    assert "hydra_plugins/__init__.py" not in names  # Hydra's namespace package stays one
    args = ("--cfg", "hydra", "hydra/sweeper=optuna", "hydra/sweeper/pruner=median")
    out = _run(bin_dir / "tfrecipe", *args, cwd=elsewhere).stdout
    assert "tfrecipe_optuna_sweeper.optuna_sweeper.OptunaSweeper" in out
    assert "name: median" in out
