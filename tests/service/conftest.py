"""Databases for the service tests: SQLite and PostgreSQL, schema built by the migrations.

* ``database``: a migrated database shared by the session, parametrised over SQLite (a file
  under tmp_path_factory) and PostgreSQL (a schema of its own, ``attnfuzz_test_<random>``, in the
  database at ``$ATTNFUZZ_TEST_POSTGRES_URL``, dropped at the end; other runs never see it).
* ``connection``: a connection to ``database`` inside a transaction that is rolled back after
  the test; ``session`` (savepoints inside it), ``store`` and ``client`` all work in it.
* ``fresh_database_url``: an empty database (new SQLite file / new PostgreSQL schema) for tests
  that migrate or commit themselves.

PostgreSQL tests skip with the reason when the server is unreachable, unless
``ATTNFUZZ_TEST_POSTGRES_REQUIRED=1`` (set it in CI), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import Session

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.db import migrations
from service.api.deps import get_session, get_write_session
from service.api.app import create_app
from service.db.engine import make_engine
from service.settings import Settings
from service.db.store import SqlStore

POSTGRES_URL_ENV = "ATTNFUZZ_TEST_POSTGRES_URL"
POSTGRES_REQUIRED_ENV = "ATTNFUZZ_TEST_POSTGRES_REQUIRED"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DB_KINDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@dataclass(frozen=True)
class Database:
    """A migrated database: ``url`` reaches it (for create_app, migrations, other processes)."""

    kind: str
    url: str
    engine: Engine


class PostgresServer:
    """Creates and drops private schemas in the test server's database."""

    def __init__(self, url: str):
        self.url = url
        self.admin = make_engine(url, pool_size=1)
        self.schemas: list[str] = []

    def new_schema_url(self) -> str:
        """A URL whose connections see only a new, empty schema."""
        schema = f"attnfuzz_test_{uuid.uuid4().hex[:12]}"
        with self.admin.begin() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        self.schemas.append(schema)
        url = make_url(self.url).update_query_dict({"options": f"-csearch_path={schema}"})
        return url.render_as_string(hide_password=False)

    def drop_schema_of(self, url: str) -> None:
        schema = make_url(url).query["options"].removeprefix("-csearch_path=")
        with self.admin.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        self.schemas.remove(schema)

    def close(self) -> None:
        for schema in list(self.schemas):
            with self.admin.begin() as connection:
                connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        self.admin.dispose()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    url = os.environ.get(POSTGRES_URL_ENV) or DEFAULT_POSTGRES_URL
    engine = make_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except Exception as exc:  # any failure to connect means "not reachable"
        reason = f"PostgreSQL not reachable at {url} (set {POSTGRES_URL_ENV}): {type(exc).__name__}: {exc}"
        if os.environ.get(POSTGRES_REQUIRED_ENV) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    finally:
        engine.dispose()
    server = PostgresServer(url)
    yield server
    server.close()


def _migrated(kind: str, url: str) -> Iterator[Database]:
    migrations.upgrade(url)
    engine = make_engine(url)
    yield Database(kind=kind, url=url, engine=engine)
    engine.dispose()


@pytest.fixture(scope="session")
def sqlite_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    path = tmp_path_factory.mktemp("sqlite") / "attnfuzz.db"
    yield from _migrated("sqlite", f"sqlite:///{path}")


@pytest.fixture(scope="session")
def postgresql_database(postgres_server: PostgresServer) -> Iterator[Database]:
    yield from _migrated("postgresql", postgres_server.new_schema_url())


@pytest.fixture(scope="session", params=DB_KINDS)
def db_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def database(request: pytest.FixtureRequest, db_kind: str) -> Database:
    """The session's migrated database of kind ``db_kind``."""
    return request.getfixturevalue(f"{db_kind}_database")


@contextmanager
def rolled_back(engine: Engine) -> Iterator[Connection]:
    """A connection inside a transaction that is rolled back at exit."""
    with engine.connect() as connection:
        transaction = connection.begin()
        try:
            yield connection
        finally:
            transaction.rollback()


@pytest.fixture
def connection(database: Database) -> Iterator[Connection]:
    with rolled_back(database.engine) as connection:
        yield connection


@pytest.fixture
def session(connection: Connection) -> Iterator[Session]:
    """An ORM session whose commits release savepoints of the test's transaction."""
    with Session(bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False) as session:
        yield session


@pytest.fixture
def store(connection: Connection) -> SqlStore:
    return SqlStore(connection)


@pytest.fixture
def make_client(database: Database, session: Session) -> Iterator[Callable[..., TestClient]]:
    """``make_client(api_token=..., read_requires_token=...)``: a TestClient whose requests use
    the test's session."""
    clients: list[TestClient] = []

    def make(**settings: object) -> TestClient:
        app: FastAPI = create_app(
            Settings(database_url=database.url, **{"api_token": None, "read_requires_token": False, **settings})
        )

        def test_session() -> Iterator[Session]:
            yield session

        app.dependency_overrides[get_session] = test_session
        app.dependency_overrides[get_write_session] = test_session
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    """A client of an app without an API token."""
    return make_client()


@pytest.fixture
def fresh_database_url(request: pytest.FixtureRequest, db_kind: str, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty, unmigrated database of kind ``db_kind``."""
    if db_kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.new_schema_url()
    yield url
    server.drop_schema_of(url)


# ------------------------------------------------------------------------------- sample data
@dataclass(frozen=True)
class Seeded:
    """What `seeded` stored: ids to assert on."""

    build_id: int
    other_build_id: int
    worker_id: int
    case: AttentionCase
    other_case: AttentionCase
    minimised_case: AttentionCase
    nan_bucket_id: int
    crash_bucket_id: int
    fa4_bucket_id: int


NAN_METRICS = {
    "out": {"error_ratio": 7.5, "err_backend": 0.31, "err_baseline": 0.04, "worst_index": [0, 3, 0, 17]},
    "lse": {"error_ratio": 0.2, "err_backend": 0.001, "err_baseline": 0.005, "worst_index": [0, 0, 3]},
}


@pytest.fixture
def seeded(store: SqlStore) -> Seeded:
    """Two builds, a worker, three cases and results in three buckets (one minimised)."""
    build_id = store.register_build(BuildFingerprint(torch="2.13.0", cuda="13.0", device_name="NVIDIA H200"))
    other_build_id = store.register_build(BuildFingerprint(torch="2.14.0", device_name="NVIDIA H200"))
    worker_id = store.register_worker(build_id, "gpu-host-1", 4242, "cuda:0")
    case = AttentionCase(batch_size=2, seqlen_q=113, seqlen_k=799, num_heads=8, num_heads_kv=2, causal=True)
    other_case = AttentionCase(seqlen_q=1023, seqlen_k=1023, head_dim=128, window_size_left=64, dtype="float16")
    minimised_case = AttentionCase(seqlen_q=2, seqlen_k=3, causal=True, causal_alignment="bottom_right")
    for c in (case, other_case):
        store.record_case(c.to_json(), "fuzz")

    def fail(c: AttentionCase, backend: str, signature: str, status: str = "fail", **kw: object) -> CaseResult:
        return CaseResult(
            case_id=c.case_id,
            backend=backend,
            variant="default",
            status=status,
            signature=signature,
            signatures=(signature,),
            **kw,
        )

    nan = store.record_result(
        fail(case, "sdpa", "out:nan", metrics=NAN_METRICS, error_ratio=7.5, run_ms=1.5), build_id, worker_id
    )
    store.record_result(fail(other_case, "sdpa", "out:nan", error_ratio=3.0), other_build_id, worker_id)
    crash = store.record_result(
        fail(case, "fa2", "crash", status="crash", detail="SIGSEGV in flash_fwd"), build_id, None
    )
    fa4 = store.record_result(fail(other_case, "fa4", "lse:mismatch", error_ratio=1.7), build_id, worker_id)
    store.record_result(
        CaseResult(case_id=case.case_id, backend="te", variant="default", status="pass"), build_id, worker_id
    )
    store.record_result(
        CaseResult(
            case_id=other_case.case_id, backend="te", variant="default", status="unsupported", detail="no window"
        ),
        build_id,
        worker_id,
    )
    store.record_minimised(nan.bucket_id, minimised_case.to_json(), case.case_id, "shrunk in 41 steps")
    store.record_result(fail(minimised_case, "sdpa", "out:nan", phase="shrink", metrics=NAN_METRICS), build_id, None)
    return Seeded(
        build_id=build_id,
        other_build_id=other_build_id,
        worker_id=worker_id,
        case=case,
        other_case=other_case,
        minimised_case=minimised_case,
        nan_bucket_id=nan.bucket_id,
        crash_bucket_id=crash.bucket_id,
        fa4_bucket_id=fa4.bucket_id,
    )
