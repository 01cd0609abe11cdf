"""The database going away, locked, full or read-only under a running worker (the real CLI).

* PostgreSQL stopped (``immediate``: like a crash) and restarted: the worker spools, flushes when
  the server is back, and the database ends with exactly the results the worker reported in its
  ledger, each once.
* SQLite locked by another writer past the busy timeout: the same.
* Disk full (a small tmpfs filled up): exit code 6 with "disk full", no torn rows, the refused
  writes kept in the spool and stored by the next run once there is space.
* Read-only: PostgreSQL switched to read-only transactions under the worker (exit 6, then
  recovery as above); a SQLite file on a read-only filesystem (clear error at start, nothing
  written).

Every wait is bounded in CPU seconds of the worker under test (`wait_for_work`), not in seconds:
these tests timed out twice on a machine with a load average of 8.4 on 2 cores (2026-12-03).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.reliability.conftest import WORK_CAP_S, counts, fuzz_args, query, spooled_writes

# each wait is bounded in CPU seconds of the worker (`wait_for_work`) and by WORK_CAP_S of wall time
pytestmark = pytest.mark.timeout(3 * WORK_CAP_S)

FIRST_RESULTS_WORK_S = 300.0
"""CPU seconds a worker may use before its first results are stored (a quiet 2-core machine: about
25: torch imported twice, the child started, the gate's first cases)."""
FAULT_WORK_S = 300.0
"""CPU seconds a worker may use, fuzzing on, until it has reacted to a fault or its end (spooled a
few writes, flushed them after a retry delay of up to 30 s, exited): a few seconds of its work on
a quiet machine, the retry delay's worth of fuzzing at most."""
# The runs have an hour's budget and end when the test stops them (SIGINT, exit 130) once it has
# seen what it waits for, or by themselves on a fault that stops a worker: a wall-clock budget
# spent on a loaded machine before the worker got to the fault was the failure these tests had
# (2026-12-03, load average 8.4 on 2 cores: 60 s waiting to spool, 120 s for the first results).
LONG_BUDGET = ("--time-budget", "3600")


def _stored_results(url: str) -> int:
    """Results stored, or -1 while the database cannot be read (the server is down)."""
    try:
        return counts(url)["results"]
    except Exception:  # noqa: BLE001 - a stopped server or a file locked at that instant
        return -1


def _ledger_keys(path: Path) -> tuple[set[tuple], int]:
    """Result keys the worker reported, and how many of them went through the spool."""
    keys, spooled = set(), 0
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "result":
            keys.add((event["case_id"], event["build_id"], event["backend"], event["variant"], event["phase"]))
            spooled += not event["written"]
    return keys, spooled


def _stored_keys(url: str) -> list[tuple]:
    return query(url, "SELECT case_id, build_id, backend, variant, phase FROM results")


def _assert_stored_exactly_once(url: str, ledger: Path) -> None:
    reported, _ = _ledger_keys(ledger)
    stored = _stored_keys(url)
    assert len(stored) == len(set(stored)), "no result key stored twice"
    assert set(stored) == reported, (
        f"lost: {len(reported - set(stored))}, stored but never reported: {len(set(stored) - reported)}"
    )
    incomplete = query(
        url, "SELECT c.id FROM cases c LEFT JOIN results r ON r.case_id = c.id GROUP BY c.id HAVING COUNT(r.id) != 2"
    )
    assert incomplete == [], "every case has the gate's two results"
    mismatched = query(
        url,
        "SELECT b.id FROM buckets b WHERE b.hit_count != (SELECT COUNT(*) FROM results r WHERE r.backend = b.backend"
        " AND r.variant = b.variant AND r.signature = b.signature)",
    )
    assert mismatched == [], "no retried write counted twice in a bucket"


def test_postgresql_stopped_and_restarted_under_a_running_worker_loses_nothing(cli, private_postgres, tmp_path) -> None:
    url, spool, ledger = private_postgres.url, tmp_path / "spool", tmp_path / "ledger.jsonl"
    worker = cli(*fuzz_args(url, spool, *LONG_BUDGET, "--no-shrink", "--ledger", str(ledger), "--db-timeout", "2"))
    worker.wait_for_work(lambda: _stored_results(url) >= 4, "the first results", FIRST_RESULTS_WORK_S)
    before = counts(url)
    private_postgres.stop("immediate")
    worker.wait_for_work(lambda: spooled_writes(spool, url) >= 2, "the worker to spool while the server is down", FAULT_WORK_S)
    private_postgres.start()
    worker.wait_for_work(
        lambda: spooled_writes(spool, url) == 0 and _stored_results(url) > before["results"], "the spool's flush", FAULT_WORK_S
    )
    worker.stop(signal.SIGINT)
    assert worker.finish(FAULT_WORK_S, "the worker to stop on Ctrl-C") == 130, worker.output()

    after = counts(url)
    _, spooled = _ledger_keys(ledger)
    assert spooled >= 1, "some results went through the spool"
    assert after["results"] > before["results"] and after["workers"] == before["workers"] == 1
    assert spooled_writes(spool, url) == 0, "the spool is empty after the flush"
    _assert_stored_exactly_once(url, ledger)
    assert "database outages: " in worker.output() and "left in" in worker.output()


def test_sqlite_locked_by_another_writer_makes_the_worker_spool_then_flush(cli, sqlite_url, tmp_path) -> None:
    spool, ledger = tmp_path / "spool", tmp_path / "ledger.jsonl"
    worker = cli(*fuzz_args(sqlite_url, spool, *LONG_BUDGET, "--no-shrink", "--ledger", str(ledger), "--db-timeout", "0.2"))
    worker.wait_for_work(lambda: _stored_results(sqlite_url) >= 4, "the first results", FIRST_RESULTS_WORK_S)
    lock = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=30, isolation_level=None)
    try:
        lock.execute("BEGIN EXCLUSIVE")
        locked = counts(sqlite_url)  # readers still read the last committed state (WAL)
        worker.wait_for_work(lambda: spooled_writes(spool, sqlite_url) >= 2, "the worker to spool while the file is locked", FAULT_WORK_S)
        assert counts(sqlite_url) == locked, "nothing written while another writer holds the lock"
    finally:
        lock.execute("COMMIT")
        lock.close()
    worker.wait_for_work(
        lambda: spooled_writes(spool, sqlite_url) == 0 and _stored_results(sqlite_url) > locked["results"], "the spool's flush", FAULT_WORK_S
    )
    worker.stop(signal.SIGINT)
    assert worker.finish(FAULT_WORK_S, "the worker to stop on Ctrl-C") == 130, worker.output()
    assert spooled_writes(spool, sqlite_url) == 0
    assert counts(sqlite_url)["results"] > locked["results"]
    _assert_stored_exactly_once(sqlite_url, ledger)


@pytest.fixture
def small_filesystem(tmp_path: Path):
    """A 8 MiB tmpfs mounted at ``tmp_path / "small"`` (needs root; skipped otherwise)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(directory: Path) -> Path:
    """Write a file until the filesystem is full; the file (absent when the worker's own writes
    filled the filesystem first: on a loaded machine the fast worker can get there before this
    runs, and even the open fails with ENOSPC)."""
    filler = directory / "filler"
    try:
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    except OSError:
        return filler
    try:
        while True:
            os.write(fd, b"\0" * 65536)  # unbuffered: nothing is left to flush on close
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def _free_space(mount_point: Path, filler: Path) -> None:
    """Give the full filesystem room again: drop the filler and grow the tmpfs (a remount keeps
    its files), so the drain can flush even when the worker's own writes filled it."""
    filler.unlink(missing_ok=True)
    subprocess.run(["mount", "-o", "remount,size=64m", str(mount_point)], check=True, capture_output=True)


def test_disk_full_stops_the_worker_with_a_clear_error_and_loses_nothing(cli, small_filesystem, tmp_path) -> None:
    from service.db import migrations
    url = f"sqlite:///{small_filesystem / 'attnfuzz.db'}"
    migrations.upgrade(url)
    spool, ledger = tmp_path / "spool", tmp_path / "ledger.jsonl"
    args = fuzz_args(url, spool, *LONG_BUDGET, "--no-shrink", "--ledger", str(ledger))
    worker = cli(*args)
    worker.wait_for_work(lambda: _stored_results(url) >= 4, "the first results", FIRST_RESULTS_WORK_S)
    filler = _fill(small_filesystem)
    code = worker.finish(FAULT_WORK_S, "the worker to stop on the full disk")
    output = worker.output()
    assert code == 6, output
    assert "database refuses writes (disk full)" in output and "kept in spool" in output, output[-2000:]
    with sqlite3.connect(small_filesystem / "attnfuzz.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert spooled_writes(spool, url) >= 1, "the refused write waits in the spool"
    stored = set(_stored_keys(url))
    reported, _ = _ledger_keys(ledger)
    assert stored <= reported, "nothing stored that the worker did not report"

    _free_space(small_filesystem, filler)
    drain = cli(*fuzz_args(url, spool, "--max-cases", "0", "--no-shrink", "--no-replay", "--ledger", str(ledger)))
    assert drain.finish(FIRST_RESULTS_WORK_S) == 0, drain.output()
    assert spooled_writes(spool, url) == 0
    _assert_stored_exactly_once(url, ledger)


def test_postgresql_turned_read_only_stops_the_worker_and_nothing_is_lost(cli, private_postgres, tmp_path) -> None:
    url, spool, ledger = private_postgres.url, tmp_path / "spool", tmp_path / "ledger.jsonl"
    worker = cli(*fuzz_args(url, spool, *LONG_BUDGET, "--no-shrink", "--ledger", str(ledger)))
    worker.wait_for_work(lambda: _stored_results(url) >= 4, "the first results", FIRST_RESULTS_WORK_S)
    private_postgres.execute("ALTER SYSTEM SET default_transaction_read_only = on")
    private_postgres.execute("SELECT pg_reload_conf()")
    code = worker.finish(FAULT_WORK_S, "the worker to stop on the read-only database")
    output = worker.output()
    assert code == 6, output
    assert "database refuses writes (read-only database)" in output, output[-2000:]
    frozen = counts(url)
    assert set(_stored_keys(url)) <= _ledger_keys(ledger)[0]

    private_postgres.execute("ALTER SYSTEM RESET default_transaction_read_only")
    private_postgres.execute("SELECT pg_reload_conf()")
    drain = cli(*fuzz_args(url, spool, "--max-cases", "0", "--no-shrink", "--no-replay", "--ledger", str(ledger)))
    assert drain.finish(FIRST_RESULTS_WORK_S) == 0, drain.output()
    assert counts(url)["results"] >= frozen["results"]
    assert spooled_writes(spool, url) == 0
    _assert_stored_exactly_once(url, ledger)


def test_a_sqlite_file_on_a_read_only_filesystem_is_refused_at_start(cli, small_filesystem, tmp_path) -> None:
    from service.db import migrations
    url = f"sqlite:///{small_filesystem / 'attnfuzz.db'}"
    migrations.upgrade(url)
    before = counts(url)
    remount = subprocess.run(["mount", "-o", "remount,ro", str(small_filesystem)], capture_output=True, text=True)
    assert remount.returncode == 0, remount.stderr
    worker = cli(*fuzz_args(url, tmp_path / "spool", "--max-cases", "3", "--no-shrink"))
    code = worker.finish(FIRST_RESULTS_WORK_S)
    output = worker.output()
    assert code == 6, output
    assert "refuses writes (read-only database" in output and "is not writable" in output, output[-2000:]
    immutable = sqlite3.connect(f"file:{small_filesystem / 'attnfuzz.db'}?immutable=1", uri=True)
    try:
        after = {t: immutable.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in before}
    finally:
        immutable.close()
    assert after == before, "nothing written"
