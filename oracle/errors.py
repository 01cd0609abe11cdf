"""The root of every exception attnfuzz raises on purpose.

`oracle` imports nothing of ours, so the root lives here and the other packages subclass it.
The CLI turns each subclass into an exit code (see `service/cli/main.py`).
"""

from __future__ import annotations


class AttnFuzzError(Exception):
    """Root of all attnfuzz errors. Catch this to catch only errors raised on purpose."""


class CaseValidationError(AttnFuzzError, ValueError):
    """A case description (or its JSON) violates a constraint.

    Attributes:
        field: the name of the offending field, e.g. ``"num_heads_kv"``.
        allowed: a human-readable description of the allowed values.
    """

    def __init__(self, field: str, message: str, allowed: str | None = None):
        self.field = field
        self.allowed = allowed
        text = f"{field}: {message}"
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)
