"""Errors raised on purpose by `service` (all under `oracle.errors.AttnFuzzError`)."""

from __future__ import annotations

from oracle.errors import AttnFuzzError


class ServiceError(AttnFuzzError):
    """Root of the storage and web-service errors."""

    exit_code = 5


class NotFoundError(ServiceError, LookupError):
    """A row that the caller named does not exist.

    Attributes:
        kind: what was looked up, e.g. ``"bucket"``.
        key: the id that was not found.
        hint: where to look instead (appended to the message after "; "), or "".
    """

    exit_code = 2

    def __init__(self, kind: str, key: object, hint: str = ""):
        self.kind = kind
        self.key = key
        self.hint = hint
        super().__init__(f"{kind} {key!r} not found" + (f"; {hint}" if hint else ""))


class FieldValidationError(ServiceError, ValueError):
    """A value given to the store or the repository is invalid.

    Attributes:
        field: the offending field, e.g. ``"duplicate_of_id"``.
        message: what is wrong with it.
    """

    exit_code = 2

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")
