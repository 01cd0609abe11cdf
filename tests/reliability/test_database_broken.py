"""A database that breaks under a running worker (issue 38, red team: a corrupted SQLite file or a
schema downgrade mid-run ended the run with exit 1 and a raw traceback). Now: one line naming the
database (password masked) and what is wrong, exit code 5, no traceback, and the write that met
the fault kept in the spool (stored by the next run once the database is mended)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.db import migrations
from tests.reliability.conftest import WORK_CAP_S, fuzz_args, spooled_writes
from tests.reliability.test_database_faults import (
    FAULT_WORK_S,
    FIRST_RESULTS_WORK_S,
    LONG_BUDGET,
    _assert_stored_exactly_once,
    _ledger_keys,
    _stored_keys,
    _stored_results,
)

pytestmark = pytest.mark.timeout(3 * WORK_CAP_S)


def _one_clear_line(output: str, *needles: str) -> None:
    assert "Traceback" not in output and "╭" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert lines, output[-3000:]
    assert any(all(n in line for n in needles) for line in lines), (needles, lines)


def test_a_schema_downgraded_under_a_running_worker_stops_it_with_exit_5_and_loses_nothing(cli, sqlite_url, tmp_path) -> None:
    spool, ledger = tmp_path / "spool", tmp_path / "ledger.jsonl"
    path = sqlite_url.removeprefix("sqlite:///")
    worker = cli(*fuzz_args(sqlite_url, spool, *LONG_BUDGET, "--no-shrink", "--workers", "1", "--ledger", str(ledger)))
    worker.wait_for_work(lambda: _stored_results(sqlite_url) >= 4, "the first results", FIRST_RESULTS_WORK_S)
    migrations.downgrade(sqlite_url, "0006")  # drops the workers' evaluations/known_hits columns
    code = worker.finish(FAULT_WORK_S, "the worker to stop on the old schema")
    output = worker.output().replace("\n", " ").replace("error:", "\nerror:")  # rich wraps long lines
    assert code == 5, output[-3000:]
    # the revision the line names is the one read when the write failed: 0006, or the newest where
    # the write met the downgrade half done (SQLite's table rebuild; under load, 2026-12-05)
    _one_clear_line(output, path, "schema", "attnfuzz db upgrade")
    assert set(_stored_keys(sqlite_url)) <= _ledger_keys(ledger)[0], "nothing stored that the worker did not report"
    assert spooled_writes(spool, sqlite_url) >= 1, "the refused write waits in the spool"

    migrations.upgrade(sqlite_url)
    drain = cli(*fuzz_args(sqlite_url, spool, "--max-cases", "0", "--no-shrink", "--no-replay", "--ledger", str(ledger)))
    assert drain.finish(FIRST_RESULTS_WORK_S) == 0, drain.output()
    assert spooled_writes(spool, sqlite_url) == 0
    _assert_stored_exactly_once(sqlite_url, ledger)


def test_a_sqlite_file_corrupted_under_running_workers_stops_them_with_exit_5_and_a_clear_line(cli, sqlite_url, tmp_path) -> None:
    spool = tmp_path / "spool"
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    worker = cli(*fuzz_args(sqlite_url, spool, *LONG_BUDGET, "--no-shrink", "--workers", "2"))
    worker.wait_for_work(lambda: _stored_results(sqlite_url) >= 4, "the first results", FIRST_RESULTS_WORK_S)
    with open(path, "r+b") as handle:  # the same file (inode), its every byte garbage
        handle.write(os.urandom(path.stat().st_size))
    code = worker.finish(FAULT_WORK_S, "the workers to stop on the corrupted file")
    output = worker.output().replace("\n", " ").replace("error:", "\nerror:")
    assert code == 5, output[-3000:]
    _one_clear_line(output, str(path), "is corrupted")
    assert spooled_writes(spool, f"sqlite:///{path}") >= 1, "the refused write waits in the spool"
