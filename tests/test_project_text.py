"""The project's text speaks of the project, not of who worked on it or when (issue 35, item 4).

No working period ("the ninth session", "this session's machine"), no lead engineer, no helper agents
in any tracked file: a comment or note that needs a measurement cites the date, the commit and the
doc section or manifest instead, e.g. "(H200, 2026-12-02, 99acd79;
benchmarks/gpu/results/2026-12-02-99acd79-default/manifest.json)". Database and pytest sessions
(SQLAlchemy's ``Session``, PostgreSQL's, a session-scoped fixture) are not working periods; the few
lines where such a session matches the patterns are listed in ``ALLOWED`` with the reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()

ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
    "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth"
)
PERIOD_WORDS = rf"{ORDINALS}|this|last|earlier|previous|next|that|a later|one|same"
# POSIX extended syntax (git grep -E) and Python's re read this the same way.
PATTERN = (
    rf"({PERIOD_WORDS}) sessions?\b|sessions?'s|\bthe lea[d]\b|helper agents|two helpers"
)
# the same words split over a line break (a wrapped comment or paragraph): "... twelfth\n# session"
WRAPPED = re.compile(
    rf"\b({PERIOD_WORDS})[ \t]*\n[ \t]*(#+[ \t]*|//[ \t]*|\*[ \t]*)?sessions?\b", re.IGNORECASE
)

ALLOWED = {
    # (path, text of the hit): why it is not a working period
    ("service/db/engine.py", "a Session's"): "SQLAlchemy's Session (a database session)",
    ("tests/service/conftest.py", "The session's migrated database"): "a pytest session-scoped fixture",
}


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-c", f"safe.directory={ROOT}", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _grep(*args: str) -> list[str]:
    """``git grep`` over the tracked files, this file left out; the lines it prints (none: [])."""
    done = _git("grep", "--no-color", "-I", *args, "--", ".", f":(exclude){THIS_FILE}")
    if done.returncode == 1:  # no match
        return []
    assert done.returncode == 0, f"git grep failed ({done.returncode}): {done.stderr.strip()}"
    return done.stdout.splitlines()


def _allowed(hit: str) -> bool:
    path, _, text = hit.partition(":")
    return any(path == where and what in text for where, what in ALLOWED)


def test_no_working_periods_lead_or_helpers_in_the_project_text() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if not (ROOT / ".git").exists():
        pytest.skip(f"{ROOT} is not a git checkout (no .git)")

    hits = [hit for hit in _grep("-n", "-i", "-E", "-e", PATTERN) if not _allowed(hit)]
    for path in _grep("-l", "-i", "-E", "-e", r"sessions?\b"):
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        for match in WRAPPED.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            hits.append(f"{path}:{line}: {' '.join(match.group(0).split())} (over a line break)")

    assert not hits, (
        "the project's text speaks of working periods, a lead or helpers; cite the date, the commit "
        "and the doc section (or the run's manifest) instead:\n" + "\n".join(hits)
    )
