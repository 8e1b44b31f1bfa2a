#!/usr/bin/env python3
"""Check the subjects of the commits made since the subject rule: ``Area: imperative summary``, at most 72
characters; reasons and figures go in the body.

Run by ``make lint``. Only commits after ``BASE`` are checked (the history before it keeps its long subjects), and
merge commits are skipped (their subjects are written by git). In a shallow clone, where ``BASE`` is not present,
the commits that are present and were committed after ``BASE`` was are checked instead; outside a git checkout
the check says so and passes.

    python deploy/check_commit_subjects.py [--repo DIR] [--base REV] [--rev HEAD]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

# The last commit on main before the rule (2026-12-07T00:57:38Z, "Providers: the cascaded pipeline's ports").
BASE = "f0ca9f56af96fcef8d6d37f2173bd34d5eda7beb"
BASE_COMMIT_TIME = 1796605058
MAX_SUBJECT = 72
# Commits that landed on main, inside merged branches, before the check first ran on a merge: history is not
# rewritten for them (their branches were already merged), so they are named here and let through.
GRANDFATHERED = frozenset(
    {
        "43bb3ca73d",  # "Docs: lab entry for the pipeline provider's latency, overlap, CPU, barge-in"
        "7684a67e78",  # "Pipeline: bound the OpenAI transcription backlog; keep-alive only live contexts"
        "2a60260c55",  # "Pipeline local: the STT's registry name is whisper, as the pipeline docs say"
        "c6c9dadf7a",  # "Docs: ADR for agent handoffs (replay, retire tool calls, reuse the switch)"
        "ac63067a6f",  # "Tests: the pjsua helper reports media_active on every active update again"
    }
)
# An area (a word or a path, such as "Docs", "SIP", "gateway/worker", "CI") then ": " and a summary; git's own
# revert subjects are let through.
SUBJECT = re.compile(r"^(?:[A-Za-z0-9][\w./+,-]*(?: [\w./+,-]+){0,3}): \S|^Revert \"")


@dataclass(frozen=True, kw_only=True)
class Offence:
    sha: str
    subject: str
    reason: str


def problems_of(subject: str) -> list[str]:
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"{len(subject)} characters (at most {MAX_SUBJECT}; move the detail to the body)")
    if not SUBJECT.match(subject):
        found.append("not 'Area: imperative summary'")
    return found


def _git(repo: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=False)


def commits_to_check(repo: str, base: str, rev: str, base_time: int) -> tuple[list[tuple[str, str]], str | None]:
    """(sha, subject) of the non-merge commits after ``base`` reachable from ``rev``, and a note when the range
    had to be narrowed (no git checkout, or ``base`` absent from a shallow clone)."""
    try:
        inside = _git(repo, "rev-parse", "--git-dir").returncode == 0
    except FileNotFoundError:
        return [], "git is not installed: commit subjects not checked"
    if not inside:
        return [], "not a git checkout: commit subjects not checked"
    have_base = _git(repo, "cat-file", "-e", f"{base}^{{commit}}").returncode == 0
    span = f"{base}..{rev}" if have_base else rev
    log = _git(repo, "log", "--no-merges", "--format=%H%x00%ct%x00%s", span)
    if log.returncode != 0:
        raise SystemExit(f"git log failed: {log.stderr.strip()}")
    commits = []
    for line in log.stdout.splitlines():
        sha, committed, subject = line.split("\x00", 2)
        if have_base or int(committed) > base_time:
            commits.append((sha, subject))
    note = None if have_base else f"{base[:12]} is not in this clone (shallow?): checking its commits made later"
    return commits, note


def check(repo: str, base: str = BASE, rev: str = "HEAD", base_time: int = BASE_COMMIT_TIME) -> list[Offence]:
    commits, note = commits_to_check(repo, base, rev, base_time)
    if note:
        print(f"commit subjects: {note}")
    return [
        Offence(sha=sha, subject=subject, reason="; ".join(found))
        for sha, subject in commits
        if sha[:10] not in GRANDFATHERED and (found := problems_of(subject))
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=".", help="the checkout to check (default: here)")
    parser.add_argument("--base", default=BASE, help="check the commits after this one (default: the rule's base)")
    parser.add_argument("--base-time", type=int, default=BASE_COMMIT_TIME, help=argparse.SUPPRESS)
    parser.add_argument("--rev", default="HEAD", help="up to this commit (default: HEAD)")
    args = parser.parse_args(argv)
    offences = check(args.repo, args.base, args.rev, args.base_time)
    for offence in offences:
        print(f"{offence.sha[:10]} {offence.subject!r}: {offence.reason}", file=sys.stderr)
    if offences:
        print(
            f"{len(offences)} commit subject(s) break the rule: 'Area: imperative summary', at most {MAX_SUBJECT} "
            "characters, reasons and figures in the body (git commit --amend, or git rebase -i to reword)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
