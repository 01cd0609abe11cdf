"""What the ``attnfuzz`` command modules (`service.cli`, `service.cli_builds`,
`service.cli_export`) share: the ``--db`` option and its default, migrating the database before
use, and turning an `AttnFuzzError` into the exit codes listed in `service.cli`."""

from __future__ import annotations

import os
import time
from typing import Annotated, NoReturn, Optional

import typer
from rich.console import Console

from oracle.errors import AttnFuzzError, CaseValidationError

console = Console(stderr=True)
out = Console()

DbOption = Annotated[
    Optional[str],
    typer.Option("--db", help="SQLAlchemy URL (default: $ATTNFUZZ_DATABASE_URL or sqlite:///attnfuzz.db)."),
]


def db_url(db: str | None) -> str:
    from service.db import default_database_url

    return db or default_database_url()


def exit_code(exc: AttnFuzzError) -> int:
    """The exit code of ``exc`` (the table in `service.cli`)."""
    from fuzzer.backends.base import BackendError
    from fuzzer.corpus import CorpusError
    from fuzzer.results import SinkFatalError
    from fuzzer.spool import SpoolError
    from fuzzer.strategies import StrategyArgumentError
    from fuzzer.worker import WorkerError

    if isinstance(exc, (CaseValidationError, StrategyArgumentError, CorpusError)):
        return 2
    if isinstance(exc, SinkFatalError):
        return 6
    if isinstance(exc, SpoolError):
        return 7
    if isinstance(exc, BackendError):
        return 3
    if isinstance(exc, WorkerError):
        return 4
    from service.errors import FieldValidationError, NotFoundError, ServiceError

    if isinstance(exc, (FieldValidationError, NotFoundError)):  # a named row or a value given is wrong
        return 2
    if isinstance(exc, ServiceError):
        return 5
    return 1


def fail(exc: AttnFuzzError, code: int | None = None) -> NoReturn:
    """Print ``exc`` and exit with ``code`` (default: `exit_code`)."""
    console.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(exit_code(exc) if code is None else code)


def migrate(url: str, wait_s: float = 0.0) -> None:
    """Migrate ``url`` to the newest revision; while the server cannot be reached (connection
    refused, starting up), retry with backoff for up to ``wait_s`` seconds.

    Raises:
        ServiceError: the migration failed (the message names the database and the cause).
    """
    from sqlalchemy.exc import OperationalError

    from service.errors import ServiceError
    from service.migrations import upgrade

    deadline = time.monotonic() + wait_s
    delay = 0.5
    while True:
        try:
            upgrade(url)
            return
        except OperationalError as exc:
            unreachable = not url.startswith("sqlite") or "locked" in str(exc)
            if unreachable and time.monotonic() + delay < deadline:
                console.print(f"[yellow]database {url!r} unreachable ({str(exc.orig).strip()[:200]}); retrying[/]")
                time.sleep(delay)  # backoff before reconnecting
                delay = min(delay * 2, 10.0)
                continue
            _raise_refused(url, exc)
            raise ServiceError(f"database {url!r}: cannot migrate: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # SQLAlchemy / Alembic errors: name the database, keep the cause
            _raise_refused(url, exc)
            raise ServiceError(f"database {url!r}: cannot migrate: {type(exc).__name__}: {exc}") from exc


def _raise_refused(url: str, exc: Exception) -> None:
    """For a SQLite file: raise `StoreRefusedError` when its directory is read-only or its disk is
    full (SQLite itself only says "unable to open database file")."""
    import shutil

    from sqlalchemy.engine import make_url

    from service.store import StoreRefusedError

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return
    directory = os.path.dirname(os.path.abspath(parsed.database))
    reason = None
    if os.path.isdir(directory) and not os.access(directory, os.W_OK):
        reason = f"read-only database: {directory} is not writable"
    elif os.path.isdir(directory) and shutil.disk_usage(directory).free == 0:
        reason = f"disk full: no space left in {directory}"
    if reason is not None:
        raise StoreRefusedError(f"database {url!r} refuses writes ({reason}): {type(exc).__name__}: {exc}") from exc
