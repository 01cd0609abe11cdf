"""``serve`` while its PostgreSQL database drops connections or is down (issue 38, red team:
terminated connections answered 500 three times): each request that meets the fault answers 503
with ``Retry-After``, never 500, and the next request once the database answers again works
(the pool is pre-pinged, a dead connection is replaced)."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.engine import make_url

from service.api.app import create_app
from service.db.engine import make_engine
from service.settings import Settings

pytestmark = pytest.mark.postgres

PATHS = ["/api/overview", "/", "/api/buckets", "/buckets"]


def _terminate_next_query(app_engine, admin_url: str) -> list[int]:
    """Make the app's next SQL statement meet a connection that ``pg_terminate_backend`` ended
    (from another connection, as an operator or a failover does), once. Returns the list the
    terminated backend pids are appended to."""
    killed: list[int] = []
    admin = make_engine(admin_url)

    def before(connection, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if killed:
            return
        pid = connection.connection.dbapi_connection.info.backend_pid
        with admin.connect() as other:
            other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
            other.commit()
            # wait until the server has ended it (measured, not slept): its row leaves pg_stat_activity.
            # Each check in a transaction of its own: pg_stat_activity is a snapshot taken once per
            # transaction, so a check repeated inside one never sees the row go.
            deadline = time.monotonic() + 60
            while other.exec_driver_sql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {int(pid)}").scalar_one():
                other.commit()
                assert time.monotonic() < deadline, f"backend {pid} still listed 60 s after pg_terminate_backend"
                time.sleep(0.05)
            other.commit()
        killed.append(pid)

    event.listen(app_engine, "before_cursor_execute", before)
    return killed


@pytest.mark.parametrize("path", PATHS)
def test_a_terminated_postgresql_connection_answers_503_then_the_next_request_works(postgresql_database, path) -> None:
    app = create_app(Settings(database_url=postgresql_database.url))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get(path).status_code == 200  # a pooled connection now exists
        killed = _terminate_next_query(app.state.engine, postgresql_database.url)
        answer = client.get(path)
        assert killed, "the app's connection was not terminated"
        assert answer.status_code == 503, (answer.status_code, answer.text[:500])
        assert answer.headers.get("retry-after") == "1"
        assert "retry" in answer.text
        assert client.get(path).status_code == 200, "the request after the fault did not get a working connection"


@pytest.mark.parametrize("path", PATHS)
def test_a_postgresql_server_that_is_down_answers_503_with_retry_after(postgresql_database, path) -> None:
    # the same database URL on a port where nothing listens: connection refused, as for a stopped server
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = make_url(postgresql_database.url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    app = create_app(Settings(database_url=down))
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.get(path)
    assert answer.status_code == 503, (answer.status_code, answer.text[:500])
    assert answer.headers.get("retry-after") == "1"
