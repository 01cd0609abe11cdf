"""Stored text written into Markdown (the issue report, `service.export.issue_report`) and onto
terminals (``buckets list``, ``buckets show``, ``report``, ``cases show``) is escaped (issue 38, red
team: a plugin's exception class name injected headings, @mentions and links into the issue report
and raw terminal escapes into ``buckets list``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.cli.main import app
from service.db import migrations
from service.db.engine import make_engine
from service.db.models import Bucket
from service.db.store import SqlStore

CASE = AttentionCase(seqlen_q=5, seqlen_k=5, num_heads=1, head_dim=8, causal=True, dtype="float32")
HOSTILE = ("Boom\n# Owned @maintainer [click](https://evil.example) <img src=x onerror=alert(1)> #123 "
           "www.evil.example **bold** `tick` \x1b[2J\x1b]0;title\x07 [bold red]styled[/] \u202eesrever")
"""What a plugin's exception class (``type(name, (Exception,), {})``) and message can be."""
REPORT_HEADINGS = {"## Build", "## Case", "## What is wrong", "## Same case, other backends and variants", "## Builds",
                   "## Repro"}


@pytest.fixture
def hostile_db(tmp_path: Path) -> tuple[str, int]:
    """A bucket of a plugin whose names, signature, detail and note carry `HOSTILE`."""
    url = f"sqlite:///{tmp_path / 'hostile.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    store.record_case(CASE.to_json(), "fuzz")
    store.record_result(CaseResult(CASE.case_id, "plug@in\x1b[31m", "v[bold]", "error", signature=f"error:{HOSTILE}",
                                   detail=HOSTILE), build_id, None)
    store.record_result(CaseResult(CASE.case_id, "torch-cpu-math", "is_causal", "pass"), build_id, None)
    with Session(engine) as session:
        bucket = session.scalars(select(Bucket)).one()
        bucket.minimise_note = HOSTILE
        bucket.notes = HOSTILE
        session.commit()
        bucket_id = bucket.id
    engine.dispose()
    return url, bucket_id


def _markdown_text(markdown: str) -> tuple[list[str], str]:
    """(the heading lines, the text outside fences, indented code and code spans)."""
    headings, prose, fenced = [], [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            continue
        if line.lstrip().startswith("#"):
            headings.append(line)
        prose.append(re.sub(r"`[^`\n]*`", "", line))
    return headings, "\n".join(prose)


def test_the_issue_report_writes_stored_text_as_text_not_markdown(hostile_db) -> None:
    from service.export.issue_report import bucket_issue

    url, bucket_id = hostile_db
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            report = bucket_issue(session, bucket_id)
    finally:
        engine.dispose()
    headings, prose = _markdown_text(report.markdown)
    assert headings[0].startswith("# ") and set(headings[1:]) == REPORT_HEADINGS, headings
    assert "\n" not in report.title and "@maintainer" not in _markdown_text(report.title)[1]
    for injected in ("@maintainer", "](", "<img", "#123", "www.evil", "**bold**", "# Owned"):
        assert injected not in prose, (injected, prose)
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in report.markdown, repr(raw)
    assert "Boom # Owned @maintainer" in report.markdown  # still readable, in code spans


def test_the_issue_report_keeps_plain_names_as_they_are() -> None:
    from service.export.issue_report import _cell

    for name in ("fa4", "out:all_zero, out:mismatch", "te_style (causal=True, window_size=(-1, 0))", "4.0.0b36"):
        assert _cell(name) == name
    assert _cell("a|b`c") == "`a/b'c`"
    assert _cell("see https://x.example") == "`see https://x.example`"


@pytest.mark.parametrize(
    "args",
    [("buckets", "list"), ("buckets", "show", "BUCKET"), ("report",), ("cases", "show", CASE.case_id)],
    ids=["buckets-list", "buckets-show", "report", "cases-show"],
)
def test_terminal_commands_print_no_raw_escape_or_markup_of_stored_text(hostile_db, args: tuple) -> None:
    url, bucket_id = hostile_db
    args = tuple(str(bucket_id) if a == "BUCKET" else a for a in args)
    result = CliRunner().invoke(app, [*args, "--db", url], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in result.output, (raw, result.output)
    said = "".join(result.output.split())  # the table may wrap a long cell
    assert "plug@in\\x1b[31m" in said and "v[bold]" in said, result.output  # shown, escaped, not applied
    if args[0] == "buckets":
        assert "[boldred]styled[/]" in said, result.output  # markup printed as text


def test_the_consoles_write_no_control_character_they_did_not_make(capsys: pytest.CaptureFixture) -> None:
    from rich.table import Table

    from service.cli.common import console, out, terminal_text

    table = Table("name")
    table.add_row("x\x1b[2Jy")
    with out.capture() as captured:
        out.print(table)
        out.print("an error: \x1b]0;retitled\x1b\\ and \u202ereversed")
    text = captured.get()
    assert "\x1b" not in text and "\u202e" not in text and "\ufffd" in text, repr(text)
    assert terminal_text("a\x1b[1m[b]\nc") == "a\\x1b[1m\\[b]\\nc"
    console.print("stderr \x1b[31mred")
    assert "\x1b" not in capsys.readouterr().err


def test_the_issue_report_table_names_a_tensor_explained_as_a_limit_as_the_status_line_does(tmp_path: Path) -> None:
    """A result whose out the second opinion explained (``out:limit``) while dq stays a defect: the
    figures table says ``out:limit`` with the oracle's ``out:mismatch`` beside it, as the status
    line above it does (it said ``out:mismatch`` alone)."""
    from service.export.issue_report import bucket_issue

    url = f"sqlite:///{tmp_path / 'limit.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    store.record_case(CASE.to_json(), "fuzz")
    metrics = {"out": {"signatures": ["out:mismatch"], "error_ratio": 38.7, "err_backend": 1.9, "allowed": 0.049},
               "dq": {"signatures": ["dq:mismatch"], "error_ratio": 4.42, "err_backend": 1.6, "allowed": 0.35}}
    update = store.record_result(CaseResult(CASE.case_id, "torch-cpu-math", "is_causal", "fail", signature="dq:mismatch",
                                            signatures=("dq:mismatch", "out:limit"), metrics=metrics), build_id, None)
    try:
        with Session(engine) as session:
            text = bucket_issue(session, update.bucket_id).markdown
    finally:
        engine.dispose()
    assert "signatures: dq:mismatch, out:limit." in text
    assert "| out | out:limit (oracle: out:mismatch) | 38.7 |" in text, text
    assert "| dq | dq:mismatch | 4.42 |" in text
