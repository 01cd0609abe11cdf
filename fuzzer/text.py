"""Text that any database of ours can store: `storable_text`.

A backend's exception message, a plugin's backend or variant name, a package name or a path
decoded with ``os.fsdecode`` may hold characters no database can take: NUL (PostgreSQL refuses it
in ``text``, ``varchar`` and ``jsonb``: ``DataError``) and lone surrogates (``"\\udcff"`` from
``os.fsdecode(b"\\xff")``: not Unicode, so encoding to UTF-8 fails on SQLite and PostgreSQL
alike: ``UnicodeEncodeError``); and a name longer than its ``String(n)`` column fails on
PostgreSQL (``StringDataRightTruncation``). `storable_text` escapes the first two and cuts the
third with a visible marker, so no value a kernel or plugin produces can fail a write.

The mapping is deterministic: the same input always gives the same stored text (bucket keys
stay stable across workers and restarts).
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


__all__ = [
    "CUT_MARKER", "MAX_DETAIL", "MAX_NAME", "MAX_PACKAGE", "MAX_SIGNATURE", "MAX_VERSIONS", "has_unstorable", "is_storable",
    "storable_text",
]
