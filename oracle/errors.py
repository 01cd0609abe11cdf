"""The root of every exception attnfuzz raises on purpose.

`oracle` imports nothing of ours, so the root lives here and the other packages subclass it.
Each class declares the exit code the CLI ends with when it stops a command (`exit_code`: the
class attribute, inherited; their meanings are `service.cli.common.EXIT_CODES`).
"""

from __future__ import annotations

from typing import ClassVar


class AttnFuzzError(Exception):
    """Root of all attnfuzz errors. Catch this to catch only errors raised on purpose.

    Attributes:
        exit_code: the ``attnfuzz`` exit code of an error of this class (1: any other attnfuzz
            error; a subclass sets its own, e.g. 2 for bad input; see
            `service.cli.common.EXIT_CODES`). A class under two roots takes the first one's that
            sets it (Python's method resolution order).
    """

    exit_code: ClassVar[int] = 1


class CaseValidationError(AttnFuzzError, ValueError):
    """A case description (or its JSON) violates a constraint.

    Attributes:
        field: the name of the offending field, e.g. ``"num_heads_kv"``.
        allowed: a human-readable description of the allowed values.
    """

    exit_code = 2

    def __init__(self, field: str, message: str, allowed: str | None = None):
        self.field = field
        self.allowed = allowed
        text = f"{field}: {message}"
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)
