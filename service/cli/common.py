"""What the ``attnfuzz`` command modules (``service/cli/*.py``, `service.cli.matrix`) share: the
``--db`` option and its default, migrating the database (writing commands) or checking its schema
(reading commands), logging, the exit codes (`EXIT_CODES`) and turning an `AttnFuzzError` into
one (`exit_code`), table printing, resolving stored names, and importing ``module:attr`` plugins
from the current directory (`cwd_importable`).

Nothing here imports torch or Hypothesis: ``attnfuzz --help`` and ``--version`` stay fast.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

from fuzzer.text import masked_text, masked_url
from oracle.errors import AttnFuzzError, CaseValidationError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

def _width_off_terminal(stream: Any) -> int | None:
    """Rich's width for a console on ``stream``: its own choice on a terminal or with ``COLUMNS``
    set; 160 columns otherwise (rich falls back to 80, which cut the live and summary tables'
    headers and reasons to "pa…" when the output went to a file or a pipe)."""
    try:
        is_tty = stream.isatty()
    except (AttributeError, ValueError):
        is_tty = False
    return None if is_tty or os.environ.get("COLUMNS") else 160


_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
"""Characters a terminal acts on or that hide or reorder text: C0 and C1 controls (``ESC`` starts
every terminal escape sequence; the newline too, in a stored one-line value), zero-width
characters and bidirectional overrides."""
_RENDERED_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible_text(value: Any) -> str:
    """``value`` as text with every character of `_TERMINAL_CONTROL` shown as its escape
    (``\\x1b``, ``\\n``, ``\\u202e``): what `terminal_text` prints, before the markup escape
    (for widths, and for lines escaped as a whole)."""
    text = value if isinstance(value, str) else str(value)
    if _TERMINAL_CONTROL.search(text):
        text = _TERMINAL_CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)
    return text


def terminal_text(value: Any) -> str:
    """A stored value (a plugin's backend, variant or exception name, a signature, a detail, a
    note) to print: `visible_text` with rich markup escaped (``[bold]`` and ``[link=...]`` stay
    text), so it can neither style nor move, clear or retitle the terminal."""
    return escape(visible_text(value))


class SafeConsole(Console):
    """A rich `Console` that writes no control character it did not make itself: in the text of
    what is printed (not in rich's own styles and cursor moves), each C0 or C1 control but tab and
    newline, and each bidirectional override, is written as U+FFFD. The last guard for text
    printed without `terminal_text` (an exception's message, a log line)."""

    def _render_buffer(self, buffer: Any) -> str:
        return super()._render_buffer(
            Segment(_RENDERED_CONTROL.sub("\ufffd", text), style, control)
            if not control and _RENDERED_CONTROL.search(text) else Segment(text, style, control)
            for text, style, control in buffer
        )


console = SafeConsole(stderr=True, width=_width_off_terminal(sys.stderr))
out = SafeConsole(width=_width_off_terminal(sys.stdout))
log = logging.getLogger("attnfuzz.cli")

EXIT_CODES = {
    0: "success",
    1: "any other attnfuzz error",
    2: "bad input or usage: a case, corpus file or option violates a constraint, or names a stored row that does not exist",
    3: "a backend cannot be loaded (bad plugin spec or entry point)",
    4: "the worker cannot run (no usable backend on this machine)",
    5: "the database cannot be opened or migrated, stayed unreachable (with fuzz --server: the service), is "
       "corrupted, or its schema is old or was downgraded while in use (run attnfuzz db upgrade); unsaved results "
       "stay in the spool",
    6: "the database refuses writes (disk full, read-only), or with fuzz --server the service refuses the writer "
       "token (401) or its file cannot be read; unsaved results stay in the spool",
    7: "the local spool is full or unusable (nothing was dropped)",
    8: "a build environment cannot be prepared (builds, bisect)",
    9: "a replay contradicts the corpus (--check), or a bisection's endpoints do not bracket the failure",
    130: "interrupted (Ctrl-C); what was stored is printed first",
    143: "stopped by SIGTERM (a scheduler's stop), as by Ctrl-C",
}
EXIT_BUILD = 8
EXIT_MISMATCH = 9
EXIT_CODES_HELP = "Exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items()) + "."

DATABASE_URL_ENV = "ATTNFUZZ_DATABASE_URL"  # = service.db.engine.DATABASE_URL_ENV (not imported: SQLAlchemy)
LOG_LEVELS = ("debug", "info", "warning", "error")


class LogLevel(str, enum.Enum):
    """``--log-level`` choices (typer lists them; anything else is a usage error, exit 2)."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class Device(str, enum.Enum):
    """``fuzz --device`` choices."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Isolation(str, enum.Enum):
    """``fuzz --isolation`` choices: backends in child processes, or in the worker itself."""

    process = "process"
    none = "none"


class DrawMode(str, enum.Enum):
    """``fuzz --draw`` choices (`fuzzer.coverage.DRAW_MODES`): each case for one target backend's
    capabilities, or for the union of the selected backends'."""

    targeted = "targeted"
    union = "union"


class LaneMode(str, enum.Enum):
    """``fuzz --lanes`` choices (`fuzzer.worker.LANE_MODES`): a fuzz case waits for the oracle and
    at most ``--lane-grace`` seconds for its backends, slower ones finishing in the background
    (``on``), waits for every backend (``off``), or ``auto`` (on with CUDA and child processes)."""

    auto = "auto"
    on = "on"
    off = "off"


class JudgeMode(str, enum.Enum):
    """``fuzz --judge`` choices (`fuzzer.worker.JUDGE_MODES`): a fuzz case's outputs judged on a
    judge thread while the worker goes on with the next cases (``background``), on the worker's
    thread (``inline``), or ``auto`` (background when lanes are on)."""

    auto = "auto"
    background = "background"
    inline = "inline"

DbOption = Annotated[
    Optional[str],
    typer.Option(
        "--db",
        envvar=DATABASE_URL_ENV,
        show_envvar=True,
        help="SQLAlchemy URL, or a path to a SQLite file (default sqlite:///attnfuzz.db).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


LIBRARY_LOGGERS = (
    "sqlalchemy", "alembic", "uvicorn", "fastapi", "starlette", "httpx", "httpcore", "urllib3", "hypothesis",
    "multipart", "asyncio", "prometheus_client", "torch", "triton", "numba", "filelock", "PIL", "selenium",
)
"""Loggers of the libraries attnfuzz runs: held at ``warning`` unless ``--log-level debug`` (at
``info`` SQLAlchemy alone printed 600-1,500 lines a run, with no line of attnfuzz's own)."""
OWN_LOGGERS = ("attnfuzz", "fuzzer", "service", "oracle")
"""attnfuzz's own loggers (``attnfuzz.*`` and each module's ``logging.getLogger(__name__)``)."""


class _MaskingFormatter(logging.Formatter):
    """``name: message``, with any database password in it masked (`fuzzer.text.masked_text`):
    a library's log line may quote the URL it was given."""

    def format(self, record: logging.LogRecord) -> str:
        return masked_text(super().format(record))


def configure_logging(level: str = "warning") -> None:
    """Send stdlib `logging` to stderr through rich's handler: attnfuzz's own loggers
    (`OWN_LOGGERS`) at ``level``, the libraries it runs (`LIBRARY_LOGGERS`: SQLAlchemy, Alembic,
    uvicorn, httpx, Hypothesis, ... and any other) at ``warning``, or at ``debug`` too with
    ``level="debug"``; every line with its database passwords masked. ``--log-level`` (before
    the command or after it) and ``$ATTNFUZZ_LOG_LEVEL`` call it; called again, it changes the
    levels only.

    Raises:
        CaseValidationError: ``level`` is not one of `LOG_LEVELS`.
    """
    from rich.logging import RichHandler

    if level.lower() not in LOG_LEVELS:
        raise CaseValidationError("log_level", f"unknown level {level!r}", ", ".join(LOG_LEVELS))
    value = getattr(logging, level.upper())
    root = logging.getLogger()
    if not any(getattr(h, "_attnfuzz", False) for h in root.handlers):
        handler = RichHandler(console=console, show_path=False, rich_tracebacks=False, markup=False)
        handler._attnfuzz = True  # type: ignore[attr-defined]
        handler.setFormatter(_MaskingFormatter("%(name)s: %(message)s"))
        root.addHandler(handler)
    libraries = logging.DEBUG if value == logging.DEBUG else max(value, logging.WARNING)
    root.setLevel(value)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(value)
    for name in LIBRARY_LOGGERS:  # named, for those that set a level of their own (SQLAlchemy's echo)
        logging.getLogger(name).setLevel(libraries)
    handler = next(h for h in root.handlers if getattr(h, "_attnfuzz", False))
    handler.filters = [f for f in handler.filters if not isinstance(f, _OwnBelowWarning)]
    if libraries > value:  # --log-level info: a library logging under a name not listed stays at warning too
        handler.addFilter(_OwnBelowWarning())
    logging.captureWarnings(True)


class _OwnBelowWarning(logging.Filter):
    """Let through records below ``warning`` only from attnfuzz's own loggers (`OWN_LOGGERS`):
    the root logger is at the own level, so an unnamed library's ``info`` would otherwise pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name.split(".", 1)[0] in OWN_LOGGERS


def db_url(db: str | None) -> str:
    """The database URL for ``--db`` (None: ``$ATTNFUZZ_DATABASE_URL``, else the default).

    A value without ``://`` is a SQLite file path (``--db attnfuzz2.db`` = ``sqlite:///attnfuzz2.db``,
    ``--db /tmp/x.db`` = ``sqlite:////tmp/x.db``). ``postgres://`` and ``postgresql://`` (the
    schemes of most tools' ``DATABASE_URL``) name PostgreSQL through its installed driver
    (`POSTGRES_DRIVER`: ``postgresql+psycopg://``). Messages show the URL with its password masked
    (`fuzzer.text.masked_url`).

    Raises:
        typer.BadParameter: the value is empty (``--db ''``: it used to mean the default database,
            silently), neither a URL SQLAlchemy can parse nor a file path, or names a database
            attnfuzz cannot use (usage error, exit 2), e.g. ``postgresql:/host/db``.
    """
    from service.db.engine import default_database_url

    if db is not None and not db.strip():
        raise typer.BadParameter(
            f"{masked_url(db)!r} is empty; give a SQLAlchemy URL (e.g. sqlite:///attnfuzz.db or "
            "postgresql+psycopg://user@host:5432/db) or a SQLite file path, or leave --db out for "
            f"${DATABASE_URL_ENV} or the default sqlite:///attnfuzz.db",
            param_hint="'--db'",
        )
    value = db or default_database_url()
    shown = masked_url(value)
    if "://" not in value:
        if ":" in value.split(os.sep)[0] and not os.path.exists(value):
            raise typer.BadParameter(
                f"{shown!r} is not a database URL; did you mean sqlite:///{shown.split(':', 1)[-1].lstrip('/')} "
                "or postgresql+psycopg://user@host:5432/db?",
                param_hint="'--db'",
            )
        return f"sqlite:///{value}"
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(value)
    except ArgumentError as exc:
        raise typer.BadParameter(f"{shown!r} is not a database URL ({masked_url(str(exc))})", param_hint="'--db'") from None
    if parsed.drivername in ("postgres", "postgresql"):  # no driver named: the installed one
        parsed = parsed.set(drivername=f"postgresql+{POSTGRES_DRIVER}")
        value = parsed.render_as_string(hide_password=False)
    if parsed.get_backend_name() not in DB_BACKENDS:
        raise typer.BadParameter(
            f"{shown!r}: unsupported database {parsed.get_backend_name()!r} (allowed: {', '.join(DB_BACKENDS)}, and "
            "postgres:// for postgresql; e.g. sqlite:///attnfuzz.db or postgresql+psycopg://user@host:5432/db)",
            param_hint="'--db'",
        )
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        # each connection of an in-memory SQLite database is a database of its own: the tables made
        # by the migration were gone for the worker ("no such table: builds", a new-user trial)
        raise typer.BadParameter(
            f"{shown!r} is an in-memory SQLite database, which keeps nothing between the connections and "
            "processes attnfuzz uses; give a file, e.g. sqlite:///attnfuzz.db",
            param_hint="'--db'",
        )
    return value


POSTGRES_DRIVER = "psycopg"
"""The driver a ``postgres://`` or ``postgresql://`` URL is given (psycopg 3, the ``postgres``
extra; `service.db.engine.make_engine` connects through it too)."""

DB_BACKENDS = ("sqlite", "postgresql")
"""The databases ``--db`` takes (SQLAlchemy backend names; PostgreSQL through psycopg 3:
``pip install -e '.[postgres]'``)."""


def exit_code(exc: AttnFuzzError) -> int:
    """The exit code of ``exc``: its class's `oracle.errors.AttnFuzzError.exit_code` (one of
    `EXIT_CODES`; 1 for 0 or a value that is not one of them, as a plugin's class might set)."""
    code = getattr(exc, "exit_code", 1)
    return code if isinstance(code, int) and not isinstance(code, bool) and code in EXIT_CODES and code != 0 else 1


def fail(exc: AttnFuzzError, code: int | None = None) -> NoReturn:
    """Print ``exc`` (any database password in it masked: `fuzzer.text.masked_text`) and exit
    with ``code`` (default: `exit_code`)."""
    console.print(f"[bold red]error:[/] {escape(masked_text(str(exc)))}")
    raise typer.Exit(exit_code(exc) if code is None else code)


# Connection failures no wait cures: the server answered, and said no.
PERMANENT_CONNECT_ERRORS = (
    "does not exist",  # database "x" / role "x" does not exist
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    "invalid dsn",
    "invalid connection option",
)


def is_permanent_connect_error(exc: Exception) -> bool:
    """Whether a connection error is one that retrying cannot fix (see `PERMANENT_CONNECT_ERRORS`);
    "connection refused", "the database system is starting up", timeouts are not."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    return any(needle in text for needle in PERMANENT_CONNECT_ERRORS)


def migrate(url: str, wait_s: float = 0.0) -> None:
    """Migrate ``url`` to the newest revision; while the server cannot be reached (connection
    refused, starting up), retry with backoff for up to ``wait_s`` seconds. A server that answers
    no (unknown database or role, bad password: `is_permanent_connect_error`) fails at once.

    Raises:
        ServiceError: the migration failed (the message names the database and the cause).
    """
    from sqlalchemy.exc import OperationalError

    from service.errors import ServiceError
    from service.db.migrations import upgrade

    deadline = time.monotonic() + wait_s
    delay = 0.5
    log.info("database %s: migrating to the newest schema revision", masked_url(url))
    while True:
        try:
            upgrade(url)
            return
        except OperationalError as exc:
            unreachable = (not url.startswith("sqlite") and not is_permanent_connect_error(exc)) or "locked" in str(exc)
            if unreachable and time.monotonic() + delay < deadline:
                log.warning("database %r unreachable (%s); retrying in %.1f s", masked_url(url), str(exc.orig).strip()[:200], delay)
                time.sleep(delay)  # backoff before reconnecting
                delay = min(delay * 2, 10.0)
                continue
            _raise_refused(url, exc)
            missing = _sqlite_folder(url)  # read by _raise_refused just before: a URL SQLAlchemy reads
            if missing is not None and not os.path.isdir(missing):
                raise ServiceError(
                    f"database {masked_url(url)!r}: its folder {missing} does not exist (create it, or give --db a path in an existing folder)"
                ) from exc
            raise ServiceError(f"database {masked_url(url)!r}: cannot migrate: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # SQLAlchemy / Alembic errors: name the database, keep the cause
            _raise_refused(url, exc)
            raise ServiceError(f"database {masked_url(url)!r}: cannot migrate: {type(exc).__name__}: {exc}{_driver_hint(exc)}") from exc


def _driver_hint(exc: Exception) -> str:
    """What to install when ``exc`` is the PostgreSQL driver's missing module (else ``""``): the
    ``postgres`` extra of pyproject.toml."""
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("psycopg", "psycopg2"):
        return (" (PostgreSQL needs psycopg 3: pip install -e '.[postgres]' in a checkout, else "
                "pip install 'attnfuzz[postgres]'; and a postgresql+psycopg:// URL)")
    return ""


def _sqlite_folder(url: str) -> str | None:
    """The folder of the SQLite file ``url`` names (absolute); None for another database or an
    in-memory one.

    Raises:
        sqlalchemy.exc.ArgumentError: ``url`` is not a URL SQLAlchemy reads.
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return os.path.dirname(os.path.abspath(parsed.database))


def _raise_refused(url: str, exc: Exception) -> None:
    """For a SQLite file: raise `StoreRefusedError` when its directory is read-only or its disk is
    full (SQLite itself only says "unable to open database file")."""
    import shutil

    from service.db.engine import StoreRefusedError

    directory = _sqlite_folder(url)
    if directory is None:
        return
    reason = None
    if os.path.isdir(directory) and not os.access(directory, os.W_OK):
        reason = f"read-only database: {directory} is not writable"
    elif os.path.isdir(directory) and shutil.disk_usage(directory).free == 0:
        reason = f"disk full: no space left in {directory}"
    if reason is not None:
        raise StoreRefusedError(f"database {masked_url(url)!r} refuses writes ({reason}): {type(exc).__name__}: {exc}") from exc


def schema_revision(url: str) -> str | None:
    """The schema revision of the database at ``url`` (None: no attnfuzz schema), read without
    writing.

    Raises:
        ServiceError: it cannot be opened (the message names the database and the driver's error).
    """
    from service.db.migrations import current
    from service.errors import ServiceError

    try:
        return current(url)
    except Exception as exc:  # SQLAlchemy/driver errors: name the database, keep the cause
        raise ServiceError(f"database {masked_url(url)!r}: cannot open: {type(exc).__name__}: "
                           f"{str(exc).strip().splitlines()[0]}{_driver_hint(exc)}") from exc


def require_database(url: str) -> None:
    """Check that a SQLite ``url`` names a file that exists (other URLs pass): the reading commands
    and ``export`` refuse to create an empty database where none was meant to be.

    Raises:
        ServiceError: no SQLite file there (the message says to run ``attnfuzz db upgrade --db URL``).
    """
    from sqlalchemy.engine import make_url

    from service.errors import ServiceError

    parsed = make_url(url)
    path = parsed.database
    if path and parsed.query.get("uri") == "true" and path.startswith("file:"):  # sqlite:///file:x.db?mode=ro&uri=true
        path = path.removeprefix("file:").split("?", 1)[0]
    if parsed.get_backend_name() == "sqlite" and path not in (None, "", ":memory:"):
        if not os.path.exists(path):
            raise ServiceError(f"no database at {masked_url(url)!r} ({os.path.abspath(path)} does not exist); "
                               f"create it with: attnfuzz db upgrade --db {masked_url(url)}")


def check_schema(url: str) -> None:
    """For reading commands (``cases``, ``report``, ``serve``, ``buckets``): check, without
    writing, that ``url`` holds a database at the newest schema revision. Reading commands never
    migrate, so a read-only database stays readable.

    Raises:
        ServiceError: no database there, it cannot be opened, or its schema is not the newest one
            (the message says to run ``attnfuzz db upgrade --db URL``).
    """
    from service.errors import ServiceError
    from service.db.migrations import head

    require_database(url)
    revision = schema_revision(url)
    newest = head()
    if revision is not None and revision != newest and not _known_revision(revision):
        raise ServiceError(f"database {masked_url(url)!r} is at schema revision {revision}, which this attnfuzz does not know "
                           f"(made by a newer attnfuzz?); its newest is {newest}: upgrade attnfuzz to read it")
    if revision != newest:
        state = "has no attnfuzz schema" if revision is None else f"is at schema revision {revision}"
        raise ServiceError(f"database {masked_url(url)!r} {state}; this attnfuzz reads revision {newest}: "
                           f"run `attnfuzz db upgrade --db {masked_url(url)}` first")


def open_database(db: str | None, *, write: bool = False, create: bool = True) -> tuple[str, Engine]:
    """The URL ``--db`` names (`db_url`) and an Engine on it, for a command: a writing command
    (``write``) migrates the database first (`migrate`), a reading one checks, without writing,
    that it is at the newest revision (`check_schema`). The caller disposes of the Engine.
    Without ``create`` a writing command too refuses a SQLite file that does not exist
    (`require_database`): ``export`` reads a stored case and has nothing to put in a new one.

    Raises:
        typer.BadParameter: ``db`` is not a database URL nor a file path (exit 2).
        ServiceError: the database cannot be opened or migrated, (reading) its schema is old, or
            (reading, or without ``create``) no SQLite file is there.
        StoreRefusedError: (writing) a SQLite file on a read-only directory or a full disk.
    """
    from service.db.engine import make_engine

    url = db_url(db)
    if write:
        if not create:
            require_database(url)
        migrate(url)
    else:
        check_schema(url)
    return url, make_engine(url)


def stray_output_to_stderr() -> Callable[[], None]:
    """Send what this process, and every process it starts from now on, would print on stdout to
    stderr instead, until the returned function is called: a ``--json`` command keeps stdout for
    its JSON, which a plugin's ``print`` (at import, in ``unsupported_reasons``, in ``run`` with
    ``--isolation none``) or a library writing to fd 1 would break.

    Python's ``sys.stdout`` is swapped for ``sys.stderr``; when it is this process's fd 1, that
    fd is pointed at fd 2 too (``dup2``: C libraries and child processes write there).

    Returns:
        The function that puts both back (calling it again does nothing).
    """
    previous = sys.stdout
    saved_fd = None
    try:
        previous.flush()
        if previous.fileno() == 1:
            saved_fd = os.dup(1)
            os.dup2(2, 1)
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): Python's level only
        saved_fd = None
    sys.stdout = sys.stderr
    restored: list[bool] = []

    def restore() -> None:
        if restored:
            return
        restored.append(True)
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        sys.stdout = previous
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)

    return restore


def print_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (indented; values JSON cannot hold, e.g. datetimes, as
    their ``str``): every ``--json`` output of the CLI."""
    out.print_json(json.dumps(data, default=str))


def id_column(table, header: str, values, **kwargs) -> None:
    """Add a column to a rich ``table`` that never truncates or wraps: ids and names must stay
    copyable (``torch-cpu-flash``, a 16-hex case id) whatever the terminal width; the other,
    wrapping columns give way."""
    width = max([len(header), *(len(str(v)) for v in values)])
    table.add_column(header, no_wrap=True, min_width=width, overflow="ignore", **kwargs)


def resolve_case_id(session, value: str) -> str:
    """The stored case id that ``value`` is, or is the unique prefix of (as git takes commits).

    Raises:
        NotFoundError: no stored case id is or starts with ``value`` (exit 2).
        FieldValidationError: several do (the message lists some of them; exit 2).
    """
    from sqlalchemy import select

    from service.errors import FieldValidationError, NotFoundError
    from service.db.models import Case

    if session.get(Case, value) is not None:
        return value
    escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    found = session.scalars(select(Case.id).where(Case.id.like(f"{escaped}%", escape="\\")).limit(6)).all()
    if not found:
        raise NotFoundError("case", value, hint="`attnfuzz cases list` shows the stored cases")
    if len(found) > 1:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise FieldValidationError("case_id", f"{value!r} is the prefix of several cases ({shown}); give more characters")
    return found[0]


def describe_stored_case(config: dict) -> str:
    """``AttentionCase.describe()`` of a stored case's JSON, or ``"(stored config no longer
    validates)"`` for one stored before a bound it now breaks."""
    from oracle.config import AttentionCase

    try:
        return AttentionCase.from_json(config).describe()
    except AttnFuzzError:
        return "(stored config no longer validates)"


def check_stored_name(session, field: str, value: str) -> None:
    """A filter naming a ``backend`` (or ``variant``) that the database has never stored is a typo
    until proven otherwise: say so, with the names it has, instead of showing nothing.

    Raises:
        FieldValidationError: ``value`` is not among the stored names (exit 2).
    """
    from sqlalchemy import select, union

    from service.errors import FieldValidationError
    from service.db.models import Bucket, Result

    column = {"backend": (Result.backend, Bucket.backend), "variant": (Result.variant, Bucket.variant)}[field]
    names = sorted(set(session.scalars(union(select(column[0]).distinct(), select(column[1]).distinct())).all()))
    if value not in names:
        allowed = ", ".join(names) if names else "none stored yet"
        raise FieldValidationError(field, f"no stored result names {value!r} (stored: {allowed})")


def print_table(table, console: Console | None = None) -> None:
    """Print a rich table whose `id_column`s do not fit the terminal wider than the terminal
    (uncropped) rather than cutting an id: the terminal wraps the lines, the ids stay whole."""
    from rich.measure import Measurement

    target = console or out
    measured = Measurement.get(target, target.options.update_width(100_000), table)
    if measured.minimum > target.width:
        # Narrower than the table's minimum, rich squeezes the columns (no_wrap ones down to
        # nothing, whatever their min_width), and Console.print(width=) is clamped to the
        # console's width: widen the console itself to the minimum while printing, uncropped.
        saved = target.width
        target.width = measured.minimum
        try:
            target.print(table, crop=False)
        finally:
            target.width = saved
    else:
        target.print(table)


def _known_revision(revision: str) -> bool:
    """Whether ``revision`` is one of this attnfuzz's migrations."""
    from alembic.script import ScriptDirectory

    from service.db.migrations import make_config

    try:
        return ScriptDirectory.from_config(make_config()).get_revision(revision) is not None
    except Exception:  # alembic.util.CommandError and friends: unknown revision
        return False


def cwd_importable() -> None:
    """Put the current directory at the end of ``sys.path`` so a ``module:attr`` plugin spec finds
    ``./module.py``; at the end, so a local file never shadows an installed package. The backend
    child processes (multiprocessing "spawn") start with this ``sys.path``."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)

