"""Provenance reads a checkout's commit from git's files: nothing the folder's git configuration
names (a clean filter, an fsmonitor hook) runs, in the folder or where its `.git` file points."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tfrecipe.perf import provenance

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git makes the fixture")


def _git(folder, *args):
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(
        ["git", "-C", str(folder), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def armed(tmp_path):
    """A checkout whose configuration runs a program from every hook `git status` reaches, with
    a touched (unchanged) file that status would re-hash through the clean filter."""
    repo, marker = tmp_path / "repo", tmp_path / "ran"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "a@b.c")
    _git(repo, "config", "user.name", "a")
    (repo / "data.txt").write_text("one\n")
    _git(repo, "add", "data.txt")
    _git(repo, "commit", "-q", "-m", "one")
    (repo / ".gitattributes").write_text("* filter=probe\n")
    _git(repo, "config", "filter.probe.clean", f"touch {marker}; cat")
    _git(repo, "config", "core.fsmonitor", f"touch {marker}; true #")
    os.utime(repo / "data.txt", ns=(1, 1))  # same bytes, another time: re-hashed
    return repo, marker


def test_the_commit_is_read_without_running_what_the_checkout_names(armed):
    repo, marker = armed
    found = provenance.git(repo)
    assert found == {"sha": _git(repo, "rev-parse", "HEAD"), "dirty": False}
    assert not marker.exists(), "a program named by the checkout's configuration ran"
    # The payload is live: git itself runs it for the same question.
    subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True)
    assert marker.exists()


def test_a_dot_git_file_and_a_changed_file_are_followed_by_reading(armed, tmp_path):
    repo, marker = armed
    elsewhere = tmp_path / "project"
    elsewhere.mkdir()
    (elsewhere / ".git").write_text(f"gitdir: {repo / '.git'}\n")
    shutil.copy(repo / "data.txt", elsewhere / "data.txt")
    _git(repo, "pack-refs", "--all")  # the branch now lives in packed-refs only
    sha = _git(repo, "rev-parse", "HEAD")
    assert provenance.git(elsewhere)["sha"] == sha
    (elsewhere / "data.txt").write_text("two\n")
    assert provenance.git(elsewhere) == {"sha": sha, "dirty": True}
    assert not marker.exists()


def test_no_checkout_or_an_unreadable_head_is_no_commit(tmp_path):
    assert provenance.git(tmp_path) is None
    (tmp_path / ".git").mkdir()
    os.mkfifo(tmp_path / ".git" / "HEAD")  # would hang a plain read
    assert provenance.git(tmp_path) is None
