"""Text that any database of ours can store (`storable_text`), and database URLs fit to print,
log or store (`masked_url`, `masked_text`).

A backend's exception message, a plugin's backend or variant name, a package name or a path
decoded with ``os.fsdecode`` may hold characters no database can take: NUL (PostgreSQL refuses it
in ``text``, ``varchar`` and ``jsonb``: ``DataError``) and lone surrogates (``"\\udcff"`` from
``os.fsdecode(b"\\xff")``: not Unicode, so encoding to UTF-8 fails on SQLite and PostgreSQL
alike: ``UnicodeEncodeError``); and a name longer than its ``String(n)`` column fails on
PostgreSQL (``StringDataRightTruncation``). `storable_text` escapes the first two and cuts the
third with a visible marker, so no value a kernel or plugin produces can fail a write.

The mapping is deterministic: the same input always gives the same stored text (bucket keys
stay stable across workers and restarts).

A database URL may carry a password (``postgresql+psycopg://user:secret@host/db``): every URL
attnfuzz prints, logs, answers in JSON or writes down (the fuzz summary's hints, ``serve``'s start
line, error messages, a spool slot's metadata, a worker's metrics) goes through `masked_url`, which
shows it as ``user:***@``; connecting uses the URL as given. ``tests/test_credentials.py`` reads
the code for URLs printed past it.
"""

from __future__ import annotations

import re
from typing import Any

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
CUT_MARKER = "...[cut {n} chars]"
"""Appended to a value cut to its column's length; ``{n}`` is how many characters were dropped."""

MAX_NAME = 64  # backend, variant: String(64) columns
MAX_PACKAGE = 128  # package names and versions: String(128) columns
MAX_VERSIONS = 4096  # a result's backend_version line (every package the backend names, then the
# runtime libraries its child loaded: `runtime:cudnn==...`); an unbounded String column. At 128 the
# runtime part, which says which cuDNN ran the result, was cut off (H200, 2026-12-01)
MAX_SIGNATURE = 512
MAX_DETAIL = 64 * 1024


MASK = "***"
"""What a password is shown as (SQLAlchemy's ``render_as_string(hide_password=True)``)."""
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][\w+.-]*:/{0,3}[^:/?#@\s]*:)[^@\s]*@")  # scheme:/user: too (a typo)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^&\s]*", re.IGNORECASE)


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    return "\\x00" if char == "\x00" else f"\\u{ord(char):04x}"


def storable_text(value: Any, max_chars: int | None = None) -> str:
    """``value`` as text every database of ours stores as is.

    Args:
        value: a string (anything else is converted with ``str``).
        max_chars: the column's length in characters; longer text is cut to exactly
            ``max_chars`` characters ending in `CUT_MARKER`. None: no limit.

    Returns:
        ``value`` with each NUL written ``\\x00`` and each lone surrogate ``\\udcXX`` (as
        backslash escapes), cut with the marker when too long; unchanged when already storable.

    Raises:
        ValueError: ``max_chars`` is too small to hold the marker (a programming error).
    """
    text = value if isinstance(value, str) else str(value)
    if _UNSTORABLE.search(text):
        text = _UNSTORABLE.sub(_escape, text)
    if max_chars is not None and len(text) > max_chars:
        # the marker's own length depends on n; n counts the characters of text not kept
        for keep in range(max_chars, -1, -1):
            marker = CUT_MARKER.format(n=len(text) - keep)
            if keep + len(marker) <= max_chars:
                return text[:keep] + marker
        raise ValueError(f"max_chars={max_chars} cannot hold the cut marker")
    return text


def has_unstorable(text: str) -> bool:
    """True when ``text`` holds a character `storable_text` escapes (NUL, a lone surrogate)."""
    return _UNSTORABLE.search(text) is not None


def is_storable(value: str, max_chars: int | None = None) -> bool:
    """True when `storable_text` would return ``value`` unchanged (nothing to escape, not too
    long; tested without building the text: every string of every result's metrics is tested)."""
    if isinstance(value, str) and _UNSTORABLE.search(value) is None and (max_chars is None or len(value) <= max_chars):
        return True
    return storable_text(value, max_chars) == value  # (raises as it does for a too small max_chars)


def masked_url(url: str) -> str:
    """``url`` fit to print, log or store: its password, if it has one, shown as `MASK`, as
    ``sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)`` renders it, and a
    ``password=`` query parameter masked too; a URL without a password, and a value that is no URL
    (a SQLite file path), unchanged. The one way attnfuzz shows a database URL.

    ``masked_url("postgresql+psycopg://user:secret@127.0.0.1:5432/test")`` is
    ``"postgresql+psycopg://user:***@127.0.0.1:5432/test"``.

    Args:
        url: a SQLAlchemy URL (or anything the ``--db`` option was given).

    Returns:
        The URL without its credentials; a value SQLAlchemy cannot read goes through
        `masked_text`.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):  # not a URL SQLAlchemy reads: mask what looks like one
        return masked_text(str(url))
    if parsed.password is None:
        return _QUERY_PASSWORD.sub(lambda m: m.group("head") + MASK, url)
    return _QUERY_PASSWORD.sub(lambda m: m.group("head") + MASK, parsed.render_as_string(hide_password=True))


def masked_text(text: str) -> str:
    """``text`` (an exception's message, a log line) with the password of every URL in it shown
    as `MASK` (``scheme://user:secret@`` becomes ``scheme://user:***@``, a mistyped
    ``scheme:/user:secret@`` too, and ``?password=secret`` ``?password=***``): for text that may quote a database URL attnfuzz did not build itself."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK + "@", text)
    return _QUERY_PASSWORD.sub(lambda m: m.group("head") + MASK, text)


def did_you_mean(value: str, known: Any) -> str:
    """`` (did you mean 'name'?)``: the name of ``known`` (an iterable of names) closest to a
    mistyped ``value`` (``difflib``'s match), or ``""`` when none is close: what an unknown name's
    message adds before its allowed values (``fuzz --backend``, ``export --backend``)."""
    import difflib

    close = difflib.get_close_matches(value, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


__all__ = [
    "CUT_MARKER", "MASK", "MAX_DETAIL", "MAX_NAME", "MAX_PACKAGE", "MAX_SIGNATURE", "MAX_VERSIONS", "did_you_mean",
    "has_unstorable", "is_storable",
    "masked_text", "masked_url", "storable_text",
]
