"""Results the worker's ledger marks as written survive the SQLite ``-wal``/``-shm`` files being
removed under the worker, which is then killed (issue 38, red team: 94 results lost so). Each
write is checkpointed into the database file before it returns and before its ledger line
(`service.db.engine.checkpoint_wal`), so removing the log loses nothing the worker reported; the
first write that finds the log removed is refused (`service.db.engine.Transactor._check_log`), so
no checkpoint from the removed log writes the file after that: one killed in the middle left the
file with part of a transaction, "database disk image is malformed" (1 run of the suite in 4 on
a loaded machine, 2026-12-06)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.reliability.conftest import WORK_CAP_S, fuzz_args, query, spooled_writes
from tests.reliability.test_database_faults import FAULT_WORK_S, FIRST_RESULTS_WORK_S, LONG_BUDGET, _stored_keys

pytestmark = pytest.mark.timeout(3 * WORK_CAP_S)


def _written(ledger: Path) -> set[tuple]:
    """Result keys the ledger says were written to the database (not spooled)."""
    if not ledger.exists():
        return set()
    keys = set()
    for line in ledger.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if event["event"] == "result" and event["written"]:
            keys.add((event["case_id"], event["build_id"], event["backend"], event["variant"], event["phase"]))
    return keys


def test_results_marked_written_survive_the_wal_and_shm_removed_then_the_worker_killed(cli, sqlite_url, tmp_path) -> None:
    """The kill comes once the worker has refused a write (it is in the spool), not at once: a
    kill in the middle of the checkpoint that was copying when the log was removed leaves a torn
    file no process can repair (docs/reliability.md, "Not covered"; a writer killed at once after
    the removal was caught there twice in at least 310 runs under load); after the refusal no
    checkpoint copies anything."""
    spool, ledger = tmp_path / "spool", tmp_path / "ledger.jsonl"
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    worker = cli(*fuzz_args(sqlite_url, spool, *LONG_BUDGET, "--no-shrink", "--workers", "1", "--ledger", str(ledger)))
    # waits on the ledger alone: no reader of the test holds the log's frames back meanwhile
    worker.wait_for_work(lambda: len(_written(ledger)) >= 6, "results written", FIRST_RESULTS_WORK_S)
    for suffix in ("-wal", "-shm"):
        os.remove(f"{path}{suffix}")
    # its next write (a heartbeat every 0.5 s, a case's results) finds the log removed and is spooled
    worker.wait_for_work(
        lambda: worker.process.poll() is not None or spooled_writes(spool, sqlite_url), "a refused write", FAULT_WORK_S
    )
    if worker.process.poll() is None:
        worker.kill9()
    assert worker.process.returncode in (6, -9), worker.output()[-4000:]
    written = _written(ledger)
    stored = set(_stored_keys(sqlite_url))
    assert written, "the ledger names results written"
    lost = written - stored
    assert not lost, f"{len(lost)} of {len(written)} results the ledger marks written are not in the database"
    assert spooled_writes(spool, sqlite_url), "the refused write is kept in the spool"
    assert query(sqlite_url, "PRAGMA integrity_check") == [("ok",)]


@pytest.mark.parametrize(
    ("message", "raised"),
    [
        ("database or disk is full", "StoreRefusedError"),
        ("database disk image is malformed", "StoreBrokenError"),
        ("database is locked", None),
    ],
)
def test_a_checkpoint_sqlite_refuses_after_a_commit_is_classified_as_a_write_s_fault(message, raised, tmp_path, caplog) -> None:
    """A full disk or a corrupted file met by the checkpoint after a commit raises the store's
    classified error (the worker stops with its clear line, the write is spooled); a busy log is
    left to the next write's checkpoint. Raised raw, it left the worker hanging at exit."""
    import sqlite3
    from types import SimpleNamespace

    from sqlalchemy import create_engine

    from service.db import engine as engine_module

    class Refusing:
        def execute(self, sql):
            raise sqlite3.OperationalError(message)

    engine = create_engine(f"sqlite:///{tmp_path / 'attnfuzz.db'}")
    connection = SimpleNamespace(connection=SimpleNamespace(driver_connection=Refusing()), dialect=engine.dialect, engine=engine)
    if raised is None:
        with caplog.at_level("WARNING", logger="service.db.engine"):
            assert engine_module.checkpoint_wal(connection) is False
        assert message in caplog.text
        return
    with pytest.raises(getattr(engine_module, raised)) as info:
        engine_module.checkpoint_wal(connection)
    assert message in str(info.value), str(info.value)


def _rows_in_the_file_alone(path: Path, tmp_path: Path) -> list[int]:
    """The rows of table ``t`` in the database file without its ``-wal``: what a kill after the
    log's removal leaves (a copy of the main file, read on its own)."""
    import shutil
    import sqlite3

    copy = tmp_path / "alone.db"
    shutil.copy(path, copy)
    with sqlite3.connect(copy) as db:
        return [row[0] for row in db.execute("SELECT a FROM t ORDER BY a")]


def _table_t(path: Path):
    """An engine on a new SQLite file at ``path`` with a table ``t (a INTEGER PRIMARY KEY)``, and
    ``insert(tx, a)``: a write of one row through the `Transactor` ``tx``."""
    from sqlalchemy import text

    from service.db.engine import make_engine

    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as c:
        c.execute(text("CREATE TABLE t (a INTEGER PRIMARY KEY)"))
    return engine, lambda tx, a: tx.write(lambda c: c.execute(text("INSERT INTO t (a) VALUES (:a)"), {"a": a}))


@pytest.mark.parametrize("planted", [False, True], ids=["as-built", "planted-no-detection"])
def test_a_write_that_finds_the_wal_and_shm_removed_is_refused_and_leaves_the_file_as_it_was(planted, tmp_path, monkeypatch) -> None:
    """Each write is in the database file when it returns; once the ``-wal``/``-shm`` files are
    removed, the next write is refused (`StoreRefusedError` naming the log) and the database file
    keeps every byte: no commit goes into the removed log and no checkpoint from it writes the
    file, in which a kill would leave part of a transaction that only the log could repair. The
    planted bug (no detection) writes on: the write returns and the file changes under it."""
    from service.db.engine import StoreRefusedError, Transactor

    path = tmp_path / "attnfuzz.db"
    engine, insert = _table_t(path)
    tx = Transactor(engine)
    if planted:
        monkeypatch.setattr(Transactor, "_log_moved", lambda self, connection: False)
    insert(tx, 1)
    insert(tx, 2)
    assert _rows_in_the_file_alone(path, tmp_path) == [1, 2], "each write is in the file when it returns"
    for suffix in ("-wal", "-shm"):
        os.remove(f"{path}{suffix}")
    before = path.read_bytes()
    try:
        if planted:
            insert(tx, 3)
            assert path.read_bytes() != before and _rows_in_the_file_alone(path, tmp_path) == [1, 2, 3]
            return
        for a in (3, 4):  # refused again: the connection's log stays the removed one
            with pytest.raises(StoreRefusedError, match=r"-wal or its index .*-shm was removed or replaced while in use"):
                insert(tx, a)
        assert path.read_bytes() == before, "a refused write leaves the database file as it was"
        assert _rows_in_the_file_alone(path, tmp_path) == [1, 2]
    finally:
        engine.dispose()


@pytest.mark.parametrize("planted", [False, True], ids=["as-built", "planted-no-detection"])
def test_a_periodic_checkpoint_checkpoints_what_the_removed_wal_holds_then_refuses(planted, tmp_path, monkeypatch) -> None:
    """A worker without a ledger checkpoints at most every ``checkpoint_s``; the first write after
    its ``-wal`` file was removed (SQLite went on writing to the unlinked log) checkpoints what
    that log holds, the writes of the last period, into the file, and is refused. The planted
    bug (no detection) leaves the file without the writes after the last periodic checkpoint."""
    from service.db.engine import StoreRefusedError, Transactor

    path = tmp_path / "attnfuzz.db"
    engine, insert = _table_t(path)
    tx = Transactor(engine, checkpoint_s=3600.0)
    if planted:
        monkeypatch.setattr(Transactor, "_log_moved", lambda self, connection: False)
    insert(tx, 1)  # the first write checkpoints (none before it)
    insert(tx, 2)  # within the period: in the log only
    assert _rows_in_the_file_alone(path, tmp_path) == [1], "the period lets a write stay in the log"
    for suffix in ("-wal", "-shm"):
        os.remove(f"{path}{suffix}")
    try:
        if planted:
            insert(tx, 3)
            assert _rows_in_the_file_alone(path, tmp_path) == [1]
            return
        with pytest.raises(StoreRefusedError, match="what it held is in"):
            insert(tx, 3)
        assert _rows_in_the_file_alone(path, tmp_path) == [1, 2]
    finally:
        engine.dispose()


def test_a_log_sqlite_itself_removes_and_makes_again_is_no_removal(tmp_path) -> None:
    """SQLite deletes the ``-wal``/``-shm`` files when the last connection to the file closes and
    makes new ones at the next open; another process's connection opened and closed meanwhile
    leaves them alone. Neither is refused."""
    import sqlite3

    from service.db.engine import Transactor

    path = tmp_path / "attnfuzz.db"
    engine, insert = _table_t(path)
    tx = Transactor(engine)
    try:
        insert(tx, 1)
        with sqlite3.connect(path) as other:  # a second connection, then closed: the log stays
            other.execute("SELECT COUNT(*) FROM t").fetchone()
        other.close()
        insert(tx, 2)
        engine.dispose()  # the last connection: SQLite removes the log
        assert not os.path.exists(f"{path}-wal")
        insert(tx, 3)  # a new connection, a new log
        insert(tx, 4)
        assert _rows_in_the_file_alone(path, tmp_path) == [1, 2, 3, 4]
    finally:
        engine.dispose()


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "1"])
def test_a_checkpoint_period_that_is_not_seconds_is_refused_naming_the_field(bad, tmp_path) -> None:
    from service.db.engine import Transactor, make_engine

    with pytest.raises(ValueError, match="checkpoint_s"):
        Transactor(make_engine(f"sqlite:///{tmp_path / 'x.db'}"), checkpoint_s=bad)
