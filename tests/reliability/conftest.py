"""Fault-injection helpers: run the real CLI as a subprocess, wait for what it does, count rows.

* ``cli(*args)``: start ``python -m service.cli.main`` in the repository root (a `Cli` handle); the
  stand-in backends come from ``tests.fuzzer.standins``.
* `wait_until`: poll a condition (a row appears, a marker file exists) until it holds or a
  deadline passes; the tests never sleep for a fixed time to synchronise.
* `counts`: exact row counts of every table, for "before and after" assertions.
* ``private_postgres``: a PostgreSQL server of the test's own (`pgcluster.PrivatePostgres`) that a
  test may stop and restart; skipped (with the reason) when the server binaries are missing,
  unless ``ATTNFUZZ_TEST_POSTGRES_REQUIRED=1``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import text

from service.db import migrations
from service.db.engine import make_engine
from tests.reliability.pgcluster import PostgresUnavailable, PrivatePostgres
from tests.service.conftest import POSTGRES_REQUIRED_ENV, postgres_server  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]
TABLES = ("builds", "workers", "cases", "results", "buckets", "hypothesis_examples")
GATE = "tests.fuzzer.standins:GateBackend"


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.05) -> object:
    """Return ``condition()``'s first truthy value; fail the test after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)  # polling interval of a condition wait


def counts(url: str) -> dict[str, int]:
    """Rows per table."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return {t: connection.scalar(text(f"SELECT COUNT(*) FROM {t}")) for t in TABLES}
    finally:
        engine.dispose()


def query(url: str, sql: str, **params: object) -> list[tuple]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(text(sql), params)]
    finally:
        engine.dispose()


@dataclass
class Cli:
    """A running ``attnfuzz`` process and its combined output file."""

    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            pytest.fail(f"attnfuzz did not exit within {timeout_s:g} s; output:\n{self.output()[-4000:]}")


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Callable[..., Cli]]:
    """``cli(*args, env=None)``: start the CLI; every process still running at teardown is killed."""
    started: list[Cli] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Cli:
        log = tmp_path / f"cli-{len(started)}.log"
        handle = open(log, "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli.main", *args],
            cwd=REPO,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
        )
        handle.close()
        started.append(Cli(process, log))
        return started[-1]

    yield start
    for handle in started:
        if handle.process.poll() is None:
            handle.process.kill()
            handle.process.wait(timeout=30)


def fuzz_args(url: str, spool: Path, *extra: str, backends: tuple[str, ...] = (GATE,)) -> list[str]:
    """``fuzz`` arguments for a quick CPU run on stand-ins."""
    args = ["fuzz", "--db", url, "--quiet", "--isolation", "process", "--spool-dir", str(spool),
            "--case-timeout", "60", "--shrink-deadline", "30", "--heartbeat", "0.5", "--max-seqlen", "16"]
    for backend in backends:
        args += ["--backend", backend]
    return args + list(extra)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite database file."""
    url = f"sqlite:///{tmp_path / 'attnfuzz.db'}"
    migrations.upgrade(url)
    return url


@pytest.fixture
def private_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivatePostgres]:
    """A running PostgreSQL server of this test's own, migrated (the ``postgres`` database)."""
    try:  # not under pytest's own directory, which only root may enter
        server = PrivatePostgres(tempfile.mkdtemp(prefix="attnfuzz-pg-"))
        server.start()
    except PostgresUnavailable as exc:
        if os.environ.get(POSTGRES_REQUIRED_ENV) == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        migrations.upgrade(server.url)
        yield server
    finally:
        server.close()
