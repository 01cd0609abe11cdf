"""Database passwords are never printed, logged or stored in plain text (issue 38): every URL
attnfuzz shows goes through `fuzzer.text.masked_url`. The code is read (``ast``) for URLs that
reach an f-string, a log call, a print or a ``"database"`` JSON field past it; the commands are
run with a password in ``tests/service/test_cli_credentials.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fuzzer.text import MASK, masked_text, masked_url

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("attnfuzz", "oracle", "fuzzer", "service", "alembic")
URL_NAMES = frozenset({"url", "database_url", "db", "db_url", "dsn"})
"""Names that hold a database URL in our code (the ``--db`` value, what `db_url` returns)."""
URL_CALLS = frozenset({"db_url", "default_database_url", "canonical_database_url"})
"""Functions that return a database URL (password included)."""
MASKS = frozenset({"masked_url", "masked_text"})
OUTPUT_CALLS = frozenset({
    "debug", "info", "warning", "error", "exception", "critical", "log",  # logging
    "print", "echo", "secho", "print_json", "write", "write_text", "set_meta",  # terminals, JSON, files, the spool
})
PASSING = frozenset({"str", "repr", "format"})
"""Calls that pass a URL through as text (looked into; any other call is judged where it is defined)."""


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _unmasked(node: ast.AST) -> list[ast.AST]:
    """The URL-valued parts of the expression ``node`` not wrapped in a mask."""
    if isinstance(node, ast.Call):
        name = _name(node.func)
        if name in MASKS:
            return []
        if name in URL_CALLS:
            return [node]
        if name not in PASSING:
            return []
    if isinstance(node, ast.Name) and node.id in URL_NAMES:
        return [node]
    if isinstance(node, ast.Attribute) and node.attr == "database_url":
        return [node]
    return [part for child in ast.iter_child_nodes(node) for part in _unmasked(child)]


def unmasked_url_outputs(source: str) -> list[tuple[int, str]]:
    """``(line, code)`` of each place in ``source`` where a database URL is formatted into text
    (f-string, ``%``), passed to an output call (`OUTPUT_CALLS`) or put in a ``"database"`` field
    without `masked_url`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FormattedValue):
            parts = [node.value]
        elif isinstance(node, ast.Call) and _name(node.func) in OUTPUT_CALLS:
            parts = [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, ast.Dict):
            parts = [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value in ("database", "database_url")]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant):
            parts = [node.right]
        else:
            continue
        found |= {(bad.lineno, bad.col_offset, ast.unparse(bad)) for part in parts for bad in _unmasked(part)}
    return [(line, code) for line, _, code in sorted(found)]


def test_no_code_path_formats_prints_logs_or_stores_a_database_url_without_masking_it() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}:{line}: {code}" for line, code in unmasked_url_outputs(path.read_text())]
    assert not found, "URLs shown without fuzzer.text.masked_url:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ('out.print(f"stored in {url}")', "url"),
        ('log.warning("database %r unreachable", url)', "url"),
        ('print_json({"database": url})', "url"),
        ('raise ServiceError("no database at %s" % db_url(db))', "db_url(db)"),
        ('typer.echo(str(settings.database_url))', "settings.database_url"),
    ],
)
def test_the_scan_finds_a_url_shown_without_the_mask(source: str, bad: str) -> None:
    assert [code for _, code in unmasked_url_outputs(source)] == [bad]
    masked = source.replace(bad, f"masked_url({bad})")
    assert unmasked_url_outputs(masked) == [], masked


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://user:secret@127.0.0.1:5432/test", "postgresql+psycopg://user:***@127.0.0.1:5432/test"),
        ("postgres://user:s%40cr%2Fet@db.example:5432/x", "postgres://user:***@db.example:5432/x"),
        ("postgresql+psycopg://user@host/db?password=secret&sslmode=require", "postgresql+psycopg://user@host/db?password=***&sslmode=require"),
        ("sqlite:///relative/attnfuzz.db", "sqlite:///relative/attnfuzz.db"),
        ("postgresql+psycopg://user@host/db", "postgresql+psycopg://user@host/db"),
        ("attnfuzz.db", "attnfuzz.db"),
    ],
)
def test_masked_url_hides_the_password_as_sqlalchemy_renders_it_and_keeps_the_rest(url: str, shown: str) -> None:
    assert masked_url(url) == shown
    assert "secret" not in masked_url(url) and "cr%2Fet" not in masked_url(url)


def test_masked_text_hides_the_password_of_every_url_in_a_message() -> None:
    message = ("cannot reach postgresql+psycopg://a:secret@h1/db, nor postgres://b:hunter2@h2:5433/x "
               "(options postgresql://c@h3/db?password=other)")
    shown = masked_text(message)
    for password in ("secret", "hunter2", "other"):
        assert password not in shown, shown
    assert shown.count(MASK) == 3 and "postgres://b:***@h2:5433/x" in shown
