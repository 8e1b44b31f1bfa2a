"""deploy/check_commit_subjects.py, which `make lint` runs: subjects after the rule's base are checked, merges
and the history before the base are not, and a shallow clone without the base still checks what it has."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "check_commit_subjects.py"
ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_commit_subjects", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


checker = load()


def git(repo: Path, *args: str, when: int | None = None) -> str:
    env = {**os.environ, **ENV}
    if when is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"@{when} +0000"
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit(repo: Path, subject: str, when: int) -> str:
    git(repo, "commit", "-q", "--allow-empty", "-m", subject, "-m", "Why, and the figures.", when=when)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    return path


def test_subjects_are_area_colon_summary_and_short() -> None:
    assert checker.problems_of("Docs: split performance.md into dated lab entries") == []
    assert checker.problems_of("gateway/worker: build each part with its ports") == []
    assert checker.problems_of('Revert "Docs: something"') == []
    assert checker.problems_of("SIP: " + "x" * 67) == []  # 72 exactly
    assert checker.problems_of("SIP: " + "x" * 68) == ["73 characters (at most 72; move the detail to the body)"]
    assert checker.problems_of("fixed the thing") == ["not 'Area: imperative summary'"]
    assert len(checker.problems_of("a sentence that goes on and on: " + "y" * 60)) == 2


def test_only_commits_after_the_base_are_checked_and_merges_are_skipped(repo: Path) -> None:
    commit(repo, "the old way: a subject that carries every reason and figure, " + "z" * 80, when=1_000)
    base = commit(repo, "Providers: the last commit before the rule", when=2_000)
    commit(repo, "Docs: a subject that keeps the rule", when=3_000)
    git(repo, "checkout", "-q", "-b", "side")
    commit(repo, "Worker: a side branch that keeps it too", when=4_000)
    git(repo, "checkout", "-q", "main")
    commit(repo, "Media: one on main meanwhile", when=5_000)
    git(repo, "merge", "-q", "--no-ff", "side", "-m", "Merge branch 'side' into main, " + "w" * 80, when=6_000)
    assert checker.check(str(repo), base=base, base_time=2_000) == []

    long = "media: tick reads RTP at the deadline because the profile showed " + "q" * 30
    bad = commit(repo, long, when=7_000)
    offences = checker.check(str(repo), base=base, base_time=2_000)
    assert [(o.sha, o.reason) for o in offences] == [(bad, "95 characters (at most 72; move the detail to the body)")]
    assert len(long) == 95
    assert checker.main(["--repo", str(repo), "--base", base]) == 1


def test_a_shallow_clone_without_the_base_checks_the_commits_made_after_it(repo: Path, tmp_path: Path) -> None:
    commit(repo, "before the rule, long: " + "z" * 80, when=1_000)
    base = commit(repo, "Providers: the base", when=2_000)
    commit(repo, "Docs: first after the rule", when=3_000)
    bad = commit(repo, "no area here", when=4_000)
    commit(repo, "Docs: last", when=5_000)
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "2", f"file://{repo}", str(clone)],
        env={**os.environ, **ENV},
        check=True,
        capture_output=True,
    )
    assert subprocess.run(["git", "-C", str(clone), "cat-file", "-e", base], capture_output=True).returncode != 0
    offences = checker.check(str(clone), base=base, base_time=2_000)
    assert [o.sha for o in offences] == [bad]


def test_the_shallow_fallback_skips_commits_older_than_the_base(repo: Path, tmp_path: Path) -> None:
    commit(repo, "before the rule, long: " + "z" * 80, when=1_000)
    commit(repo, "Docs: after", when=3_000)
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "2", f"file://{repo}", str(clone)],
        env={**os.environ, **ENV},
        check=True,
        capture_output=True,
    )
    assert checker.check(str(clone), base="0" * 40, base_time=2_000) == []


def test_outside_a_checkout_it_says_so_and_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert checker.main(["--repo", str(tmp_path)]) == 0
    assert "not a git checkout" in capsys.readouterr().out


def test_this_repository_passes_as_make_lint_runs_it() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=SCRIPT.parents[1], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
