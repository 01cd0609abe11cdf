"""Alembic environment for attnfuzz: targets `service.db.engine.Base.metadata`.

Configured by `service.db.migrations` (there is no alembic.ini). The database comes from, in order:

1. ``config.attributes["connection"]``: an open SQLAlchemy Connection, used as is. If it is
   inside a transaction the migrations join it and the caller commits or rolls back (tests run
   migrations inside their own transaction this way).
2. ``config.attributes["url"]``, else the ``sqlalchemy.url`` main option, else
   ``$ATTNFUZZ_DATABASE_URL``, else ``sqlite:///attnfuzz.db``: an engine from
   `service.db.engine.make_engine` (same SQLite pragmas as the application).

SQLite runs in batch mode (``render_as_batch``) and, since `service.db.engine` emits BEGIN itself,
with transactional DDL: an upgrade is all or nothing on both databases. When env.py opens the
SQLite connection itself it turns foreign keys off for the run (batch mode rebuilds tables by
copy-and-drop, which foreign keys would block or cascade) and checks them afterwards.

On PostgreSQL every run takes the transaction-level advisory lock `MIGRATION_LOCK_KEY` first
(``pg_advisory_xact_lock``, released at COMMIT/ROLLBACK): workers starting at once on a fresh
database queue on it, and each one after the first finds the schema already at head, instead of
racing on ``CREATE TABLE`` / ``INSERT INTO alembic_version``. SQLite needs no lock: its upgrade
begins ``IMMEDIATE`` (one writer at a time).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

import service.db.models  # noqa: F401  (registers the tables on Base.metadata)
from service.db.engine import SQLITE_BEGIN_OPTION, Base, default_database_url, make_engine

config = context.config
target_metadata = Base.metadata

MIGRATION_LOCK_KEY = 0x61747466757A7A  # "attnfuzz" in ASCII hex, as one bigint advisory lock id


def _lock(connection: Connection) -> None:
    """On PostgreSQL, wait for the migration advisory lock (held until the transaction ends)."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")


def _url() -> str:
    return config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or default_database_url()


def _configure(connection: Connection) -> None:
    is_sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
        transactional_ddl=True if is_sqlite else None,
    )


def run_migrations_offline() -> None:
    """Write the SQL to stdout instead of running it (``--sql``)."""
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            _lock(connection)
            context.run_migrations()
        return

    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            is_sqlite = connection.dialect.name == "sqlite"
            if is_sqlite:
                # Take the write lock at BEGIN: two processes migrating at once then queue on
                # the busy timeout instead of one failing with "database is locked".
                connection.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            if is_sqlite:
                # Outside any transaction (the pragma is a no-op inside one); the engine is
                # disposed below, so this connection never returns to a pool with it off.
                connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
            _configure(connection)
            with context.begin_transaction():
                _lock(connection)
                context.run_migrations()
                if is_sqlite:
                    violations = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if violations:
                        raise RuntimeError(f"migration left foreign-key violations: {violations[:10]}")
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
