"""Results the worker's ledger marks as written survive the SQLite ``-wal``/``-shm`` files being
removed under the worker, which is then killed (issue 38, red team: 94 results lost so). Each
write is checkpointed into the database file before it returns and before its ledger line
(`service.db.engine.checkpoint_wal`), so removing the log loses nothing the worker reported."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.reliability.conftest import WORK_CAP_S, fuzz_args
from tests.reliability.test_database_faults import FIRST_RESULTS_WORK_S, LONG_BUDGET, _stored_keys

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
    spool, ledger = tmp_path / "spool", tmp_path / "ledger.jsonl"
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    worker = cli(*fuzz_args(sqlite_url, spool, *LONG_BUDGET, "--no-shrink", "--workers", "1", "--ledger", str(ledger)))
    # waits on the ledger alone: no reader of the test holds the log's frames back meanwhile
    worker.wait_for_work(lambda: len(_written(ledger)) >= 6, "results written", FIRST_RESULTS_WORK_S)
    for suffix in ("-wal", "-shm"):
        os.remove(f"{path}{suffix}")
    worker.kill9()
    written = _written(ledger)
    stored = set(_stored_keys(sqlite_url))
    assert written, "the ledger names results written"
    lost = written - stored
    assert not lost, f"{len(lost)} of {len(written)} results the ledger marks written are not in the database"


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


@pytest.mark.parametrize("planted", [False, True], ids=["as-built", "planted-no-detection"])
def test_a_periodic_checkpoint_checkpoints_at_once_once_the_wal_file_is_removed(planted, tmp_path, monkeypatch, caplog) -> None:
    """A worker without a ledger checkpoints at most every ``checkpoint_s``; the first write after
    its ``-wal`` file was removed (SQLite went on writing to the unlinked log) is checkpointed at
    once, with everything before it, and so is every write after. The planted bug (no detection)
    leaves the file without the writes after the last periodic checkpoint."""
    from sqlalchemy import text

    from service.db.engine import Transactor, make_engine

    path = tmp_path / "attnfuzz.db"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as c:
        c.execute(text("CREATE TABLE t (a INTEGER PRIMARY KEY)"))
    tx = Transactor(engine, checkpoint_s=3600.0)
    if planted:
        monkeypatch.setattr(Transactor, "_wal_moved", lambda self: False)
    insert = lambda a: tx.write(lambda c: c.execute(text("INSERT INTO t (a) VALUES (:a)"), {"a": a}))  # noqa: E731
    insert(1)  # the first write checkpoints (none before it)
    insert(2)  # within the period: in the log only
    assert _rows_in_the_file_alone(path, tmp_path) == [1], "the period lets a write stay in the log"
    for suffix in ("-wal", "-shm"):
        os.remove(f"{path}{suffix}")
    with caplog.at_level("WARNING", logger="service.db.engine"):
        insert(3)
    insert(4)
    alone = _rows_in_the_file_alone(path, tmp_path)
    engine.dispose()
    if planted:
        assert alone == [1], alone
        return
    assert alone == [1, 2, 3, 4], alone
    assert "-wal was removed or replaced while in use" in caplog.text and tx.checkpoint_s == 0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "1"])
def test_a_checkpoint_period_that_is_not_seconds_is_refused_naming_the_field(bad, tmp_path) -> None:
    from service.db.engine import Transactor, make_engine

    with pytest.raises(ValueError, match="checkpoint_s"):
        Transactor(make_engine(f"sqlite:///{tmp_path / 'x.db'}"), checkpoint_s=bad)
