"""Engine, session factory and the declarative `Base` shared by every table.

Nothing here runs at import time: `create_app()`, the CLI and the tests call `make_engine` with
the URL they were given.

SQLite is configured for several fuzz-worker processes writing one file: WAL journal (readers
never block the writer) with ``synchronous=NORMAL`` (no fsync per commit), a 30 s busy timeout, foreign keys on, and SQLAlchemy rather than the
``sqlite3`` driver emitting ``BEGIN`` (the driver's legacy mode breaks SAVEPOINT and
transactional DDL). A connection given the execution option ``{SQLITE_BEGIN_OPTION: "IMMEDIATE"}``
starts its transactions with ``BEGIN IMMEDIATE``: a read-then-write transaction then takes the
write lock up front and waits its turn (busy timeout) instead of failing with
``SQLITE_BUSY`` when it upgrades from reader to writer.

PostgreSQL goes through psycopg 3 (``postgresql+psycopg://``; a bare ``postgresql://`` URL is
mapped to it).

Source: SQLAlchemy 2 docs, "Transactions with SQLite and the sqlite3 driver"
(dialects/sqlite/base.py, section ``sqlite_enabling_transactions``).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from sqlalchemy import Engine, MetaData, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

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
    """The JSON serializer of every engine: portable across SQLite and PostgreSQL."""
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
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    key = next(iter(table.primary_key.columns))
    statement = insert(table).values(**values).on_conflict_do_nothing(index_elements=conflict).returning(key)
    return connection.execute(statement).scalar_one_or_none()
