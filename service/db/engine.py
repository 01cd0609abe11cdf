"""Engine, session factory, the declarative `Base` shared by every table, and the one way to
the database: `insert_ignore`, the write/read transactions (`Transactor`, `write_transaction`)
and the translation of database faults into the service's errors (`StoreUnavailableError`,
`StoreRefusedError`).

Nothing here runs at import time: `create_app()`, the CLI and the tests call `make_engine` with
the URL they were given.

SQLite is configured for several fuzz-worker processes writing one file: WAL journal (readers
never block the writer) with ``synchronous=NORMAL`` (no fsync per commit; a `Transactor` write is
checkpointed into the database file before it returns, or at most ``checkpoint_s`` later:
`checkpoint_wal`; a write that finds the ``-wal``/``-shm`` files it uses removed is refused), a
30 s busy timeout, foreign keys on, and SQLAlchemy rather than the ``sqlite3`` driver emitting
``BEGIN`` (the driver's legacy mode breaks SAVEPOINT and transactional DDL). A connection given the execution option ``{SQLITE_BEGIN_OPTION: "IMMEDIATE"}``
starts its transactions with ``BEGIN IMMEDIATE``: a read-then-write transaction then takes the
write lock up front and waits its turn (busy timeout) instead of failing with
``SQLITE_BUSY`` when it upgrades from reader to writer.

PostgreSQL goes through psycopg 3 (``postgresql+psycopg://``; a bare ``postgresql://`` URL is
mapped to it).

Source: SQLAlchemy 2 docs, "Transactions with SQLite and the sqlite3 driver"
(dialects/sqlite/base.py, section ``sqlite_enabling_transactions``).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, MetaData, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from fuzzer.results import SinkFatalError, SinkUnavailableError, stops_deferred
from service.errors import ServiceError

logger = logging.getLogger(__name__)

DEFAULT_DATABASE_URL = "sqlite:///attnfuzz.db"
DATABASE_URL_ENV = "ATTNFUZZ_DATABASE_URL"
SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_BEGIN_OPTION = "attnfuzz_sqlite_begin"

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base; its metadata names every constraint (stable names for migrations)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def default_database_url() -> str:
    """``$ATTNFUZZ_DATABASE_URL`` if set, else ``sqlite:///attnfuzz.db`` (relative to the cwd)."""
    return os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL


def _json_safe(value: Any) -> Any:
    """Non-finite floats become the strings "nan", "inf", "-inf" (PostgreSQL JSON rejects NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def json_dumps(value: Any) -> str:
    """The JSON serializer of every engine: portable across SQLite and PostgreSQL.

    A value without a non-finite float (the usual one) is encoded as it is, which gives the text
    `_json_safe` would (it changes only those floats, and tuples the encoder writes as lists
    anyway); only when the encoder refuses it is the value walked and encoded again (the walk of
    every result's metrics was most of a CPU fuzz case's serialisation)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_json_safe(value), allow_nan=False)


def make_engine(url: str, *, timeout_s: float | None = None, **kwargs: Any) -> Engine:
    """An Engine for ``url`` (SQLite or PostgreSQL) set up as the module docstring says.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:///attnfuzz.db`` or
            ``postgresql+psycopg://user@host:5432/db``.
        timeout_s: SQLite: how long a write waits for another writer's lock (busy timeout,
            default 30 s); PostgreSQL: how long connecting may take (``connect_timeout``, whole
            seconds, at least 1; default: libpq's). Seconds.
        **kwargs: passed on to `sqlalchemy.create_engine`.

    Raises:
        ValueError: ``timeout_s`` is not positive.
    """
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s: must be positive, got {timeout_s!r}")
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    kwargs.setdefault("json_serializer", json_dumps)
    if parsed.get_backend_name() == "sqlite":
        busy_timeout_ms = SQLITE_BUSY_TIMEOUT_MS if timeout_s is None else max(int(timeout_s * 1000), 1)
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args.setdefault("timeout", busy_timeout_ms / 1000)
        engine = create_engine(parsed, **kwargs)
        _configure_sqlite(engine, busy_timeout_ms)
        return engine
    if parsed.get_backend_name() == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
        if timeout_s is not None:
            kwargs.setdefault("connect_args", {}).setdefault("connect_timeout", max(int(round(timeout_s)), 1))
    return create_engine(parsed, **kwargs)


def _configure_sqlite(engine: Engine, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy emit BEGIN (see `_on_begin`); the driver then never opens transactions.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit is not fsynced, the WAL is at checkpoints. A committed
            # transaction survives the process being killed (the soak and kill tests); only an
            # OS crash or power loss may lose the last ones. (SQLite docs, "pragma synchronous".)
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "DEFERRED")
        if mode not in ("DEFERRED", "IMMEDIATE", "EXCLUSIVE"):
            raise ValueError(f"{SQLITE_BEGIN_OPTION}: unknown value {mode!r}")
        connection.exec_driver_sql(f"BEGIN {mode}")


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A `sessionmaker` bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)


def insert_ignore(connection: Connection, table: Table, values: dict[str, Any], conflict: list[str]) -> Any | None:
    """``INSERT ... ON CONFLICT (conflict) DO NOTHING RETURNING <first primary-key column>``, on
    SQLite and PostgreSQL alike: the statement-level get-or-create every write builds on (a key
    raced by two writers never raises).

    Args:
        connection: an open Connection (or a Session's), inside the caller's transaction.
        table: the table (``Model.__table__``).
        values: the new row's column values.
        conflict: the columns of the unique key that may already hold the row.

    Returns:
        The new row's first primary-key value (``id``; ``build_id`` of ``build_packages``), or
        None when a row with that key already existed (nothing written).
    """
    statement = _insert_ignore_returning(connection.dialect.name, table, tuple(conflict))
    return connection.execute(statement, values).scalar_one_or_none()


@functools.lru_cache(maxsize=64)
def _insert_ignore_returning(dialect: str, table: Table, conflict: tuple[str, ...]) -> Any:
    """`insert_ignore`'s statement without values, built once per dialect, table and key (the
    values go as the execution's parameters: the same SQL, and no statement to build, hash and
    look up per row; that was about half of a fuzz case's SQLite write)."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    key = next(iter(table.primary_key.columns))
    return insert(table).on_conflict_do_nothing(index_elements=list(conflict)).returning(key)


def insert_ignore_statement(connection: Connection, table: Table, conflict: list[str]) -> Any:
    """``INSERT INTO table ... ON CONFLICT (conflict) DO NOTHING`` in ``connection``'s dialect
    (SQLite or PostgreSQL), without values: for `insert_ignore` and for multi-row inserts
    (``connection.execute(statement.returning(...), rows)``)."""
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    return insert(table).on_conflict_do_nothing(index_elements=conflict)


# ------------------------------------------------------------------------------------ faults
# The one translation of database errors into the service's errors, and the one way a write
# transaction starts (`Transactor`, `write_transaction`): every module that writes uses them.
#
# Faults: an error that means "the database cannot be reached now" (connection refused or lost,
# PostgreSQL shutting down or starting, SQLite still locked after the retries) is raised as
# `StoreUnavailableError` (a `fuzzer.results.SinkUnavailableError`: try again later); one that
# means "the database refuses writes" (disk full, read-only file or transaction) as
# `StoreRefusedError` (a `fuzzer.results.SinkFatalError`: stop). A transaction that fails
# transiently (SQLite "database is locked" after the busy timeout, PostgreSQL serialization
# failure or deadlock) is retried a few times with a short backoff. Every call is one
# transaction, so after either error nothing of the call is stored.

TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
# admin_shutdown, crash_shutdown, cannot_connect_now, too_many_connections; lock_not_available: a
# row lock held past the write's lock_timeout (by a stopped worker: retrying now cannot help)
UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300", "55P03"})
# disk_full, read_only_sql_transaction, insufficient_resources' out_of_memory is left out (transient)
REFUSED_SQLSTATES = {"53100": "disk full", "25006": "read-only database"}
SQLITE_REFUSED_MESSAGES = {
    "database or disk is full": "disk full",
    "readonly database": "read-only database",
    "disk i/o error": "disk I/O error",
}
DEFAULT_RETRIES = 5

T = TypeVar("T")


class StoreUnavailableError(SinkUnavailableError, ServiceError):
    """The database cannot be reached now; nothing of the call was stored. Try again later."""


class StoreRefusedError(SinkFatalError, ServiceError):
    """The database refuses writes (disk full, read-only); nothing of the call was stored."""


class StoreBrokenError(SinkFatalError, ServiceError):
    """The database cannot be used as it is: its SQLite file is corrupted, or its schema is older
    than the one this attnfuzz writes (downgraded while in use). Nothing of the call was stored;
    a worker stops (exit 5) and keeps the write in its spool. The message names the database
    (password masked) and what is wrong."""

    exit_code = 5


SQLITE_CORRUPT_MESSAGES = ("file is not a database", "database disk image is malformed")
SCHEMA_SQLSTATES = frozenset({"42P01", "42703"})  # undefined_table, undefined_column
SQLITE_SCHEMA_MESSAGES = ("no such table", "no such column", "has no column named")


def _database_name(bind: Engine | Connection) -> str:
    """The URL of ``bind``'s database with its password masked (for messages)."""
    return bind.engine.url.render_as_string(hide_password=True)


def _schema_revision(bind: Engine | Connection) -> str | None:
    """The ``alembic_version`` of ``bind``'s database, read on a connection of its own (None:
    none, or it cannot be read)."""
    engine = bind.engine
    try:
        with engine.connect() as connection:
            return connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    except Exception:  # noqa: BLE001 - no table, no connection: the caller says "unknown"
        return None


def broken_store(exc: DBAPIError, bind: Engine | Connection) -> StoreBrokenError | None:
    """The `StoreBrokenError` that ``exc`` means, or None: a corrupted SQLite file ("file is not
    a database", "database disk image is malformed"), or a table or column missing (the schema
    is not the one the code writes: downgraded while in use; the message gives the revision read
    from ``alembic_version``, which `service.db.migrations` compares with its newest)."""
    dialect = bind.dialect.name
    sqlstate = getattr(exc.orig, "sqlstate", None)
    text = str(exc.orig).lower()
    first_line = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig).__name__
    name = _database_name(bind)
    if dialect == "sqlite" and any(needle in text for needle in SQLITE_CORRUPT_MESSAGES):
        return StoreBrokenError(
            f"database {name!r} is corrupted ({first_line}): restore the file from a copy "
            "(or `sqlite3 FILE .recover`), or give --db another database"
        )
    if sqlstate in SCHEMA_SQLSTATES or (dialect == "sqlite" and any(needle in text for needle in SQLITE_SCHEMA_MESSAGES)):
        revision = _schema_revision(bind)
        state = "has no attnfuzz schema" if revision is None else f"is at schema revision {revision}"
        return StoreBrokenError(
            f"database {name!r} lacks what this attnfuzz writes ({first_line}); it {state} "
            f"(changed while in use: downgraded?): run `attnfuzz db upgrade --db {name}`"
        )
    return None


def is_transient(exc: DBAPIError) -> bool:
    """A conflict that a retry may resolve: serialization failure, deadlock, SQLite locked/busy."""
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate in TRANSIENT_SQLSTATES:
        return True
    text = str(exc.orig).lower()
    return "database is locked" in text or "database is busy" in text


def translate_fault(exc: DBAPIError, dialect: str) -> Exception | None:
    """The one fault translation of the service (every write and read goes through `Transactor`):
    the `StoreUnavailableError`/`StoreRefusedError` that ``exc`` means, or None (a bug: re-raise)."""
    sqlstate = getattr(exc.orig, "sqlstate", None)
    text = str(exc.orig).lower()
    first_line = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig).__name__
    if sqlstate in REFUSED_SQLSTATES:
        return StoreRefusedError(f"database refuses writes ({REFUSED_SQLSTATES[sqlstate]}): {first_line}")
    if dialect == "sqlite":
        for needle, what in SQLITE_REFUSED_MESSAGES.items():
            if needle in text:
                return StoreRefusedError(f"database refuses writes ({what}): {first_line}")
    if exc.connection_invalidated or is_transient(exc) or sqlstate in UNAVAILABLE_SQLSTATES:
        return StoreUnavailableError(f"database unavailable: {first_line}")
    if sqlstate is not None and sqlstate.startswith("08"):  # connection_exception class
        return StoreUnavailableError(f"database unavailable: {first_line}")
    if dialect == "postgresql" and isinstance(exc, OperationalError):  # refused, reset, closed
        return StoreUnavailableError(f"database unavailable: {first_line}")
    return None


def _sqlite_file(bind: Engine | Connection) -> str | None:
    """The absolute path of a SQLite database file (None for ``:memory:``, a temporary database,
    or a Connection: the tests' rolled-back transactions need no check)."""
    if not isinstance(bind, Engine):
        return None
    database = bind.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return os.path.abspath(database)


SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite 3 database file (https://sqlite.org/fileformat.html, 1.3)."""


_HEADER_FDS: dict[tuple[int, int], int] = {}
"""Descriptors `sqlite_header_broken` reads through, one per SQLite file (by device and inode),
kept open for the process's life: closing any descriptor of a file drops every POSIX lock the
process holds on it, SQLite's included (https://sqlite.org/howtocorrupt.html, 2.2), which let
a schema change and a worker's write interleave and corrupt the file
(``tests/reliability/test_database_broken.py``, 2026-12-05)."""
_HEADER_FDS_MAX = 256
"""At most this many kept; past it no descriptor is kept and the header is not checked."""


def sqlite_header_broken(path: str, identity: tuple[int, int] | None = None) -> bool:
    """Whether the file at ``path`` exists, is not empty and does not start with `SQLITE_HEADER`.
    ``identity``: the file's ``(st_dev, st_ino)`` where the caller has just read it (`_identity`);
    None: read here.

    Why a worker reads it: with the write-ahead log, each connection keeps the pages it read in
    its cache and validates them against the log's index, not the file. A file overwritten under
    running workers (every byte garbage) went unseen for minutes: the workers wrote on from their
    caches, and each checkpoint put back the pages it copied, page 1 (the header) among them when
    the database had grown (``tests/reliability/test_database_broken.py`` under load, 2026-12-05).
    Read before each write and before each checkpoint, the header catches it at the next write.
    A 16-byte ``pread`` on a descriptor opened once (`_HEADER_FDS`): microseconds a write.
    """
    identity = identity or _identity(path)
    if identity is None:  # gone: `Transactor._check_file` says so
        return False
    fd = _HEADER_FDS.get(identity)
    if fd is None:
        if len(_HEADER_FDS) >= _HEADER_FDS_MAX:
            return False
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # unreadable: the write itself will say more
            return False
        _HEADER_FDS[identity] = fd  # never closed (see `_HEADER_FDS`), even if another file took the path
    try:
        head = os.pread(fd, len(SQLITE_HEADER), 0)
    except OSError:
        return False
    return bool(head) and head != SQLITE_HEADER


def _identity(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of ``path``, None when it does not exist."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError:  # a directory we may not enter, ...: the write itself will say more
        return None
    return (info.st_dev, info.st_ino)


WAL_CHECKPOINT_TRIES = 20

SQLITE_LOG_INFO = "attnfuzz_sqlite_log"
"""Key of a SQLite connection's ``info``: the ``(st_dev, st_ino)`` of the ``-wal`` and ``-shm``
files it writes through, as `Transactor` first saw them (`Transactor._log_moved`)."""


def checkpoint_wal(connection: Connection) -> bool:
    """Copy what is committed in a SQLite file's write-ahead log into the database file
    (``PRAGMA wal_checkpoint(PASSIVE)``, on ``connection``, outside a transaction), trying again
    for a while when another connection's read still holds frames back.

    Why after every write: a commit lives only in the ``-wal`` file until a checkpoint. Removing
    the ``-wal``/``-shm`` files under a running worker (a clean-up by hand) unlinks them; SQLite
    goes on using its open descriptors, and when the worker is then killed every result since the
    last checkpoint is gone, although the worker had reported it stored (94 results in a red-team
    run, 2026-12-03). Checkpointed before the write returns (and before the worker's ledger says
    "written"), a result is in the database file itself. Cost: about 0.6-0.9 ms a write on this
    machine's disk (two fsyncs), against a CPU fuzz case's tens of milliseconds.

    A checkpoint that SQLite refuses (``sqlite3.Error``) is classified as a write's error is
    (`broken_store`, `translate_fault`): a corrupted file raises `StoreBrokenError`, a full disk or
    an I/O error `StoreRefusedError`, so the worker stops with its clear line and the write goes to
    the spool (stored again by the next run: every insert is ``ON CONFLICT DO NOTHING``, so the
    commit that stands in the log is not stored twice). Busy or locked, or anything unclassified,
    raises nothing (logged; the next write's checkpoint takes the frames). Raised raw, after the
    commit, the error escaped that classification and left the worker hanging at exit
    (2026-12-05, ``tests/reliability/test_database_faults.py`` on a full tmpfs).

    Returns:
        True when every frame of the log is in the database file; False when readers held some
        back through every try (they go with the next write's checkpoint) or SQLite refused it
        for a reason that is not a fault of the store.

    Raises:
        StoreBrokenError: the SQLite file is corrupted.
        StoreRefusedError: the disk is full, or an I/O error.
    """
    # on the driver's connection: SQLAlchemy's would begin a transaction first, inside which
    # SQLite refuses to checkpoint (SQLITE_LOCKED)
    driver = connection.connection.driver_connection
    for attempt in range(WAL_CHECKPOINT_TRIES):
        try:
            row = driver.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            wrapped = DBAPIError.instance("PRAGMA wal_checkpoint(PASSIVE)", (), exc, sqlite3.Error)
            translated = None if is_transient(wrapped) else broken_store(wrapped, connection) or translate_fault(wrapped, "sqlite")
            if isinstance(translated, (StoreBrokenError, StoreRefusedError)):
                raise translated from exc
            logger.warning("SQLite refused the checkpoint after a commit (%s); the commit stays in the log", exc)
            return False
        if row is None or row[1] < 0 or row[2] >= row[1]:  # (busy, frames in the log, frames checkpointed)
            return True
        time.sleep(min(0.001 * 2**attempt, 0.05))  # a reader's short transaction ending; not a test sync
    return False


ctrl_c_deferred = stops_deferred
"""`fuzzer.results.stops_deferred`: every write transaction of `Transactor` runs inside it, so a
Ctrl-C (or a SIGTERM made a stop) never cuts one in two."""


class Transactor:
    """Runs a function in a short write transaction (or a savepoint), retrying transient errors.

    A Ctrl-C during a write takes effect when the write's transaction has ended (`ctrl_c_deferred`).

    Args:
        bind: an Engine (a transaction per write) or a Connection (a savepoint per write).
        retries: how many times a transient conflict is retried.
        lock_timeout_ms: PostgreSQL: how long a write waits for a lock (``SET LOCAL
            lock_timeout`` at its start), milliseconds; past it the write fails as unavailable
            (`StoreUnavailableError`, no retry). None: the server's setting (no limit by default).
        checkpoint_s: SQLite file: 0 (the default) checkpoints every write before it returns
            (`checkpoint_wal`: two fsyncs, 0.6-0.9 ms on a quiet disk, 6-16 ms on this 2-core
            machine under a load average of 10); > 0 checkpoints a write only when the last
            checkpoint is at least this many seconds old. What a larger value risks: the writes
            of the last ``checkpoint_s`` seconds before the ``-wal`` file is removed by hand, when
            the process is killed before its next write.

    A SQLite write that finds the ``-wal`` or ``-shm`` file its connection writes through removed
    or replaced since the connection first saw them (`_log_moved`; a clean-up by hand under a
    running worker) is refused before it begins: what the removed log still holds is
    checkpointed into the database file once more (nothing with ``checkpoint_s`` 0; the writes of
    the last period otherwise), and `StoreRefusedError` is raised (the worker stops with exit 6,
    the write stays in its spool). SQLite would go on writing to the unlinked log and
    checkpointing from it, and each such checkpoint writes the database file in place: a kill in
    the middle of one leaves the file with part of a transaction, which only the log could
    complete ("database disk image is malformed"). A process that opens the file meanwhile makes
    a new log of its own beside the unlinked one, and nothing keeps their writes apart. A
    checkpoint already copying when the log is removed cannot be helped (docs/reliability.md,
    "Not covered").

    Raises:
        ValueError: ``checkpoint_s`` is negative or not finite.
    """

    def __init__(
        self, bind: Engine | Connection, retries: int = DEFAULT_RETRIES, *, lock_timeout_ms: int | None = None,
        checkpoint_s: float = 0.0,
    ):
        if not (isinstance(checkpoint_s, (int, float)) and math.isfinite(checkpoint_s) and checkpoint_s >= 0):
            raise ValueError(f"checkpoint_s: {checkpoint_s!r} is not a number of seconds >= 0")
        if not isinstance(bind, (Engine, Connection)):
            raise TypeError(f"bind must be an Engine or a Connection, got {type(bind).__name__}")
        self.bind = bind
        self.retries = retries
        self.lock_timeout_ms = lock_timeout_ms
        self.dialect = bind.dialect.name
        if self.dialect not in ("sqlite", "postgresql"):
            raise NotImplementedError(f"unsupported database {self.dialect!r} (SQLite and PostgreSQL are)")
        self._write_engine = (
            bind.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            if isinstance(bind, Engine) and self.dialect == "sqlite"
            else bind
        )
        self._file = _sqlite_file(bind) if self.dialect == "sqlite" else None
        self._identity = _identity(self._file) if self._file is not None else None
        self.checkpoint_s = float(checkpoint_s)
        self._last_checkpoint = -math.inf  # time.monotonic() of the last complete checkpoint

    def _check_file(self) -> None:
        """Loud on loss: the SQLite file must still be the one this store opened (same device and
        inode). After ``rm -rf`` of its directory, or a file put in its place, SQLite would go on
        writing to the unlinked file and every result would vanish with it.

        Raises:
            StoreRefusedError: the file is gone or replaced (the worker stops, its spool keeps
                the write).
            StoreBrokenError: the file no longer starts with SQLite's header (`_check_header`).
        """
        if self._file is None:
            return
        now = _identity(self._file)
        if self._identity is None:
            self._identity = now
            return
        if now != self._identity:
            what = "removed" if now is None else "replaced by another file"
            raise StoreRefusedError(
                f"database refuses writes (the SQLite file {self._file} was {what} while in use): "
                "results after this point are kept in the spool"
            )
        self._check_header(now)

    def _check_header(self, identity: tuple[int, int] | None = None) -> None:
        """The SQLite file must still start with SQLite's header (`sqlite_header_broken`;
        ``identity`` as there).

        Raises:
            StoreBrokenError: it does not: the file was overwritten while in use.
        """
        if self._file is not None and sqlite_header_broken(self._file, identity):
            raise StoreBrokenError(
                f"database {_database_name(self.bind)!r} is corrupted (its file no longer starts with "
                "SQLite's header): restore the file from a copy (or `sqlite3 FILE .recover`), or give --db "
                "another database"
            )

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        if isinstance(self.bind, Connection):
            with self.bind.begin_nested():
                yield self.bind
        elif self._file is not None:
            with self._write_engine.connect() as connection:
                self._check_log(connection)
                with connection.begin():
                    yield connection
                if SQLITE_LOG_INFO not in connection.info:  # a new connection's log exists from its first commit on
                    self._log_moved(connection)
                # committed to the log; a checkpoint on an overwritten file would put page 1 back
                # and hide the damage from every later check
                self._check_header()
                if self._checkpoint_due():  # committed: now into the main file, before "written"
                    if checkpoint_wal(connection):
                        self._last_checkpoint = time.monotonic()
        else:
            with self._write_engine.begin() as connection:
                yield connection

    def _log_moved(self, connection: Connection) -> bool:
        """Whether the ``-wal`` or ``-shm`` file of this SQLite file is no longer the one
        ``connection`` writes through (removed, or replaced by another file) since it was first
        seen there (`SQLITE_LOG_INFO`, recorded at the connection's first check that finds both)."""
        now = (_identity(f"{self._file}-wal"), _identity(f"{self._file}-shm"))
        seen = connection.info.get(SQLITE_LOG_INFO)
        if seen is None:
            if None not in now:
                connection.info[SQLITE_LOG_INFO] = now
            return False
        return now != seen

    def _check_log(self, connection: Connection) -> None:
        """Before a write: refuse it when the log ``connection`` writes through was removed or
        replaced (`_log_moved`), once what that log holds is checkpointed into the database file.

        Raises:
            StoreRefusedError: the log was removed or replaced while in use.
            StoreBrokenError: the checkpoint found the file corrupted (`checkpoint_wal`).
        """
        if not self._log_moved(connection):
            return
        # the commits only the removed log holds (none when every write was checkpointed)
        held = "what it held is in" if checkpoint_wal(connection) else "readers held some of what it held back from"
        raise StoreRefusedError(
            f"database refuses writes (the SQLite log {self._file}-wal or its index {self._file}-shm was removed "
            f"or replaced while in use; {held} {self._file}): results after this point are kept in the spool; "
            "the next run writes them with a new log"
        )

    def _checkpoint_due(self) -> bool:
        """After a commit: whether to checkpoint now (``checkpoint_s``)."""
        return self.checkpoint_s == 0 or time.monotonic() - self._last_checkpoint >= self.checkpoint_s

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in a write transaction.

        Raises:
            StoreUnavailableError: the database cannot be reached (after the retries for locks).
            StoreRefusedError: the database refuses writes (disk full, read-only; a SQLite file
                or its ``-wal``/``-shm`` removed or replaced while in use).
            StoreBrokenError: the SQLite file is corrupted, or the schema is older than this
                attnfuzz's (`broken_store`).
        """
        for attempt in range(self.retries + 1):
            try:
                self._check_file()
                with ctrl_c_deferred(), self._begin() as connection:
                    if self.lock_timeout_ms is not None and self.dialect == "postgresql":
                        # SET LOCAL lasts to the end of the transaction: the caller's, for a savepoint
                        connection.exec_driver_sql(f"SET LOCAL lock_timeout = {int(self.lock_timeout_ms)}")
                    value = fn(connection)
                self._check_file()  # removed while this write ran: it went to the unlinked file
                return value
            except DBAPIError as exc:
                if attempt < self.retries and is_transient(exc) and not exc.connection_invalidated:
                    time.sleep(min(0.05 * 2**attempt, 1.0))  # backoff between retries, not a test sync
                    continue
                translated = broken_store(exc, self.bind) or translate_fault(exc, self.dialect)
                if translated is None:
                    raise
                raise translated from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` on a connection (no write lock).

        Raises:
            StoreUnavailableError: the database cannot be reached.
            StoreRefusedError: the database cannot be read (I/O error).
        """
        try:
            if isinstance(self.bind, Connection):
                return fn(self.bind)
            with self.bind.connect() as connection:
                return fn(connection)
        except DBAPIError as exc:
            translated = broken_store(exc, self.bind) or translate_fault(exc, self.dialect)
            if translated is None:
                raise
            raise translated from exc


def write_transaction(bind: Engine | Connection, fn: Callable[[Connection], T], *, retries: int = DEFAULT_RETRIES) -> T:
    """Run ``fn`` in a short write transaction on an Engine (``BEGIN IMMEDIATE`` on SQLite), or a
    savepoint of the caller's transaction on a Connection, retrying lock conflicts: what every
    `service.db.store.SqlStore` write does, for the other modules that write (`service.matrix.grid`).

    Raises:
        StoreUnavailableError: the database cannot be reached (after the retries for locks).
        StoreRefusedError: the database refuses writes (disk full, read-only).
    """
    return Transactor(bind, retries).write(fn)


@contextmanager
def reading(bind: Engine | Connection | Session) -> Iterator[Connection | Session]:
    """Something to read on: a new Connection of an Engine (closed afterwards), else ``bind``
    itself (an open Connection or Session: the caller's transaction)."""
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            yield connection
    else:
        yield bind


@contextmanager
def session_for(bind: Engine | Connection | Session) -> Iterator[Session]:
    """A Session on ``bind`` (objects stay readable after it closes), or ``bind`` itself when it
    is one."""
    if isinstance(bind, Session):
        yield bind
        return
    with Session(bind=bind, expire_on_commit=False) as session:
        yield session
