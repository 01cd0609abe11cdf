"""The commands with a password in ``--db`` (issue 38): it appears in no output (the fuzz
summary's hints, ``--json``, logs at every level, ``serve``'s start line, errors) and nowhere on
disk or in the database (the spool slot, the worker rows); ``--db ''`` is refused naming the
option and what it takes; ``postgres://`` and ``postgresql://`` reach PostgreSQL through psycopg.

The password is ``secret`` on a trust-auth server (the test server's), which accepts any."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from service.cli.main import app
from service.db.engine import make_engine

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "secret"
CPU_RUN = ["--backend", "torch-cpu-math", "--isolation", "none", "--max-cases", "3", "--no-shrink", "--no-replay",
           "--corpus", "", "--workers", "1"]


def _attnfuzz(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("ATTNFUZZ_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "attnfuzz", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _with_password(url: str, scheme: str | None = None) -> str:
    parsed = make_url(url).set(password=PASSWORD)
    if scheme is not None:
        parsed = parsed.set(drivername=scheme)
    return parsed.render_as_string(hide_password=False)


@pytest.fixture
def secret_url(postgres_server) -> str:
    """A private schema on the test server, its URL with the password `PASSWORD`."""
    url = postgres_server.new_schema_url()
    yield _with_password(url)
    postgres_server.drop_schema_of(url)


def _shows_no_password(run: subprocess.CompletedProcess, what: str) -> None:
    assert PASSWORD not in run.stdout and PASSWORD not in run.stderr, f"{what}:\n{run.stdout}\n{run.stderr}"


@pytest.mark.slow
@pytest.mark.postgres
def test_no_command_prints_stores_or_logs_the_database_password(secret_url: str, tmp_path: Path) -> None:
    upgraded = _attnfuzz("db", "upgrade", "--json", "--db", secret_url, cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    _shows_no_password(upgraded, "db upgrade --json")
    assert json.loads(upgraded.stdout)["database"] == make_url(secret_url).render_as_string(hide_password=True)
    spool = tmp_path / "spool"
    plain = _attnfuzz("fuzz", *CPU_RUN, "--quiet", "--spool-dir", str(spool), "--db", secret_url, "--log-level", "debug",
                      cwd=tmp_path)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    _shows_no_password(plain, "fuzz (summary, hints, debug log)")
    assert "report --db postgresql+psycopg://postgres:***@" in plain.stdout, plain.stdout  # the hint, masked
    as_json = _attnfuzz("fuzz", *CPU_RUN, "--json", "--spool-dir", str(spool), "--db", secret_url, "--log-level", "info",
                        cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    _shows_no_password(as_json, "fuzz --json")
    assert json.loads(as_json.stdout)["database"].startswith("postgresql+psycopg://postgres:***@")
    empty = tmp_path / "empty-corpus"
    empty.mkdir()
    for args in (("report",), ("report", "--json"), ("buckets", "list"), ("cases", "list"), ("db", "current"),
                 ("db", "current", "--json"), ("corpus", "import", str(empty))):
        shown = _attnfuzz(*args, "--db", secret_url, cwd=tmp_path)
        assert shown.returncode == 0, (args, shown.stderr)
        _shows_no_password(shown, " ".join(args))
    # on disk: the spool slot's files (its metadata names the database)
    for path in spool.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    # in the database: every text of every row (the worker rows, the builds)
    engine = make_engine(secret_url)
    try:
        with engine.connect() as connection:
            for table in inspect(connection).get_table_names():
                rows = connection.execute(text(f'SELECT * FROM "{table}"')).all()
                assert PASSWORD not in repr(rows), table
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_serve_and_its_pages_name_the_database_without_its_password(secret_url: str, tmp_path: Path) -> None:
    assert _attnfuzz("db", "upgrade", "--db", secret_url, cwd=tmp_path).returncode == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        server = subprocess.Popen([sys.executable, "-m", "attnfuzz", "serve", "--port", str(port), "--db", secret_url,
                                   "--log-level", "debug"], cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "serving" not in log.read_text() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "serving postgresql+psycopg://postgres:***@" in log.read_text(), log.read_text()
        for path in ("/", "/buckets", "/builds", "/matrix", "/api/workers", "/api/overview", "/metrics", "/openapi.json"):
            for _ in range(100):  # the start line comes just before uvicorn listens
                try:
                    page = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=60)
                    break
                except httpx.ConnectError:
                    time.sleep(0.2)
            assert page.status_code == 200 and PASSWORD not in page.text, (path, page.status_code)
    finally:
        server.terminate()
        server.wait(30)
    assert PASSWORD not in log.read_text(), log.read_text()  # the start line and every debug line


@pytest.mark.parametrize(
    "url",
    [
        "mysql://user:secret@127.0.0.1/db",  # not a database attnfuzz takes
        "postgresql+psycopg://user:secret@127.0.0.1:1/db",  # nothing listens: the error names the database
        "postgresql:/user:secret@127.0.0.1/db",  # not a URL
    ],
)
def test_errors_name_the_database_without_its_password(url: str) -> None:
    for args in (("report",), ("db", "upgrade"), ("fuzz", "--time-budget", "5", "--db-wait", "0")):
        result = CliRunner().invoke(app, [*args, "--db", url], env={"COLUMNS": "250"})
        assert result.exit_code != 0, (args, result.output)
        assert PASSWORD not in result.output and "Traceback" not in result.output, (args, result.output)


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_db_is_a_usage_error_naming_the_option_and_what_it_takes(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ATTNFUZZ_DATABASE_URL", raising=False)
    for args in (("report",), ("db", "upgrade"), ("fuzz", "--time-budget", "5"), ("export", "0123456789abcdef")):
        result = CliRunner().invoke(app, [*args, "--db", value], env={"COLUMNS": "250"})
        said = " ".join(result.output.split())
        assert result.exit_code == 2, (args, result.output)
        assert "--db" in said and "is empty" in said and "sqlite:///attnfuzz.db" in said, said
    assert list(tmp_path.iterdir()) == []  # the default database was not made instead


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgres", "postgresql"])
def test_postgres_and_postgresql_urls_reach_postgresql_through_psycopg(postgres_server, scheme: str, tmp_path: Path) -> None:
    url = postgres_server.new_schema_url()
    try:
        given = _with_password(url, scheme=scheme)
        made = _attnfuzz("db", "upgrade", "--json", "--db", given, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        body = json.loads(made.stdout)
        assert body["up_to_date"] and body["database"].startswith("postgresql+psycopg://postgres:***@"), body
        listed = _attnfuzz("cases", "list", "--json", "--db", given, cwd=tmp_path)
        assert listed.returncode == 0 and json.loads(listed.stdout)["total"] == 0, listed.stderr
    finally:
        postgres_server.drop_schema_of(url)
