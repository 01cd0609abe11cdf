"""Signals as schedulers and terminals send them, to a real ``attnfuzz fuzz --workers 2`` run on
the CPU (the gate stand-in, `tests.fuzzer.standins.GateBackend`), on SQLite and on PostgreSQL.

* SIGTERM (Slurm, Kubernetes and systemd stop a job so) or SIGINT sent to the command's process
  alone, not to its process group: every process of the run (the command, the second worker
  process, both workers' backend children) is gone within `STOP_BOUND_S`, the exit code is 128 +
  the signal, both worker rows end ``stopped``, nothing is left in the spool, no result key is
  stored twice and no case is stored without its results.
* SIGTERM to the second worker process alone: that worker stops cleanly (its processes gone, its
  row ``stopped``) and the command's own worker goes on storing results.
* SIGKILL of the command: the second worker stops cleanly all the same (the kernel's parent-death
  signal), and no process of the run is left.

Before these, SIGTERM killed the command at once and left the second worker running to the end
of its budget (its row ``running``), and SIGINT to the command alone left the second worker
running for the command's join grace (247 s in the report of 2026-12-03).

The runs have an hour's budget: they end when the test stops them, once both workers have stored
results; that wait's deadline is in CPU seconds of the run (`wait_for_work`), so a loaded machine
waits longer in proportion. The stop's own bound is wall-clock: a scheduler waits so long.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from service.db import migrations
from tests.reliability.conftest import (
    Cli,
    fuzz_args,
    is_running,
    process_tree,
    query,
    spooled_writes,
    tagged_processes,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

STOP_BOUND_S = 30.0
"""Seconds from the signal to the last process of the run gone (a scheduler's usual grace before
its SIGKILL)."""
STARTUP_WORK_S = 600.0
"""CPU seconds the run may use before both workers have stored `LEAST_RESULTS` results each (a
quiet 2-core machine: about 60; imports of torch, four processes, the gate's cases)."""
LEAST_RESULTS = 6


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def run_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of each kind (PostgreSQL: a schema of its own on the test server)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'attnfuzz.db'}"
    else:
        url = request.getfixturevalue("postgres_server").new_schema_url()
    migrations.upgrade(url)
    return url


def _start(cli, url: str, spool: Path) -> Cli:
    return cli(*fuzz_args(url, spool, "--workers", "2", "--time-budget", "3600", "--no-shrink", "--corpus", ""))


def _results_by_worker(url: str) -> dict[int, int]:
    try:
        return dict(query(url, "SELECT worker_id, COUNT(*) FROM results GROUP BY worker_id"))
    except Exception:  # noqa: BLE001 - not there yet (SQLite locked at that instant): not yet
        return {}


def _both_stored(url: str) -> bool:
    by_worker = _results_by_worker(url)
    return len(by_worker) == 2 and min(by_worker.values()) >= LEAST_RESULTS


def _worker_pids(url: str) -> dict[int, int]:
    """``{worker row id: pid}``."""
    return dict(query(url, "SELECT id, pid FROM workers"))


def _run_processes(run: Cli) -> set[int]:
    """Every process of the run now: the command's tree and whatever carries its tag."""
    return process_tree(run.process.pid) | tagged_processes(run.tag)


def _described(pid: int) -> str:
    """``pid``'s parent, state and command line, for a failure message."""
    try:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160].decode(errors="replace")
    except OSError:
        return f"{pid}: gone"
    return f"{pid} (parent {status.get('PPid')}, {status.get('State')}): {command}"


def _wait_gone(pids: set[int], tag: str | None, bound_s: float, run: Cli) -> float:
    """Seconds until none of ``pids`` (nor any process tagged ``tag``) runs; fails past ``bound_s``."""
    started = time.monotonic()
    while True:
        left = {p for p in pids if is_running(p)} | (tagged_processes(tag) if tag else set())
        waited = time.monotonic() - started
        if not left:
            return waited
        if waited > bound_s:
            described = "\n".join(_described(p) for p in sorted(left))
            pytest.fail(
                f"{len(left)} processes of the run still running {bound_s:g} s after the signal:\n{described}\n"
                f"output:\n{run.output()[-3000:]}"
            )
        time.sleep(0.1)  # polling interval of a condition wait


def _assert_nothing_lost_or_doubled(url: str, spool: Path | None) -> None:
    """No result key twice, no case without its results, and (``spool`` given) nothing left in
    the spool."""
    doubled = query(
        url,
        "SELECT case_id, build_id, backend, variant, phase FROM results"
        " GROUP BY case_id, build_id, backend, variant, phase HAVING COUNT(*) > 1",
    )
    assert doubled == [], "no result key stored twice"
    torn = query(url, "SELECT c.id FROM cases c LEFT JOIN results r ON r.case_id = c.id GROUP BY c.id HAVING COUNT(r.id) != 2")
    assert torn == [], "every stored case has the gate's two results"
    if spool is not None:
        assert spooled_writes(spool, url) == 0, "every write flushed: nothing left in the spool"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_to_the_command_alone_stops_every_process_of_the_run_within_30_s(cli, run_url, tmp_path, signum) -> None:
    spool = tmp_path / "spool"
    run = _start(cli, run_url, spool)
    run.wait_for_work(lambda: _both_stored(run_url), f"both workers to store {LEAST_RESULTS} results", STARTUP_WORK_S)
    processes = _run_processes(run)
    assert len(processes) >= 4, f"the command, a second worker and their backend children: {processes}"
    os.kill(run.process.pid, signum)  # the command alone: not its process group
    took = _wait_gone(processes, run.tag, STOP_BOUND_S, run)
    code = run.wait(10)
    assert code == 128 + signum, f"exit {code} after {took:.1f} s; output:\n{run.output()[-3000:]}"
    statuses = [s for (s,) in query(run_url, "SELECT status FROM workers ORDER BY id")]
    assert statuses == ["stopped", "stopped"], f"a stop, not a failure or a lost worker ({took:.1f} s)"
    assert all(n >= LEAST_RESULTS for n in _results_by_worker(run_url).values())
    _assert_nothing_lost_or_doubled(run_url, spool)


def test_sigterm_to_one_worker_process_stops_that_worker_alone_and_cleanly(cli, sqlite_url, tmp_path) -> None:
    spool = tmp_path / "spool"
    run = _start(cli, sqlite_url, spool)
    run.wait_for_work(lambda: _both_stored(sqlite_url), f"both workers to store {LEAST_RESULTS} results", STARTUP_WORK_S)
    pids = _worker_pids(sqlite_url)
    ((other_id, other_pid),) = [(i, p) for i, p in pids.items() if p != run.process.pid]
    other_processes = process_tree(other_pid)
    assert len(other_processes) >= 2, "the second worker and its backend child"
    os.kill(other_pid, signal.SIGTERM)
    _wait_gone(other_processes, None, STOP_BOUND_S, run)
    assert dict(query(sqlite_url, "SELECT id, status FROM workers"))[other_id] == "stopped"
    assert run.process.poll() is None, "the command goes on"
    own_id = next(i for i in pids if i != other_id)
    before = _results_by_worker(sqlite_url).get(own_id, 0)
    run.wait_for_work(lambda: _results_by_worker(sqlite_url).get(own_id, 0) > before, "the command's worker to store more", 120)

    processes = _run_processes(run)
    run.stop(signal.SIGTERM)
    _wait_gone(processes, run.tag, STOP_BOUND_S, run)
    assert run.wait(10) == 128 + signal.SIGTERM, run.output()[-3000:]
    assert [s for (s,) in query(sqlite_url, "SELECT status FROM workers ORDER BY id")] == ["stopped", "stopped"]
    _assert_nothing_lost_or_doubled(sqlite_url, spool)


def test_a_command_killed_by_sigkill_leaves_no_worker_process_behind(cli, sqlite_url, tmp_path) -> None:
    """The second worker gets SIGTERM from the kernel when the command dies and stops as it would
    on its own SIGTERM; the command's backend child dies with it (SIGKILL); its row stays
    ``running`` (the next worker on the database marks it lost)."""
    run = _start(cli, sqlite_url, tmp_path / "spool")
    run.wait_for_work(lambda: _both_stored(sqlite_url), f"both workers to store {LEAST_RESULTS} results", STARTUP_WORK_S)
    pids = _worker_pids(sqlite_url)
    processes = _run_processes(run)
    run.kill9()
    _wait_gone(processes, run.tag, STOP_BOUND_S, run)
    statuses = dict(query(sqlite_url, "SELECT pid, status FROM workers"))
    assert statuses == {pid: "running" if pid == run.process.pid else "stopped" for pid in pids.values()}
    _assert_nothing_lost_or_doubled(sqlite_url, None)
