"""A CPU fleet campaign on a local multi-node Ray cluster with one node killed midway, and its
check (issue 36, acceptance 1): shared by ``tests/fleet/test_fleet_cluster.py`` (short) and
``benchmarks/fleet_kill.py`` (five minutes, JSON manifest).

`run_campaign` starts the cluster (`LocalRayCluster`: a head without CPUs for workers, so every
worker is on a node that may be killed), runs ``attnfuzz db upgrade`` and ``attnfuzz fleet up``
(the stand-in `LateBugBackend` fails from ``kill_after_s`` on, slowly, so a bucket is found and
shrunk then, its lease held for seconds), waits on measured progress (stored results, a lease
held by a worker of a killable node), ``kill -9``s
that node's processes, waits for the actors to come back (``attnfuzz fleet status --json``), for
the dead workers' rows to be ``lost`` and their leases to move on, lets the campaign run to its
end, stops it (``attnfuzz fleet down``) and compares every worker's ledger with the database:

* ``losses``: result keys a ledger reported that are not stored;
* ``duplicate_keys``: result keys ``(case_id, build_id, backend, variant, phase)`` stored twice;
* ``leases_taken_over``: buckets whose lease a killed worker held, since claimed or minimised by
  another worker;
* ``spooled_left``: writes still in the spool slots.

Nothing here sleeps to synchronise: every wait polls a measured condition against a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text

from service.db.engine import make_engine
from tests.fleet.raycluster import LocalRayCluster

REPO = Path(__file__).resolve().parents[2]
LATE_BUG = "tests.fleet.standins:LateBugBackend"
KEY = "case_id, build_id, backend, variant, phase"


class CampaignFailed(AssertionError):
    """A wait of the campaign ran past its deadline: what it waited for and the workers' logs."""


@dataclass
class Figures:
    """What a campaign measured (the benchmark's manifest; the test's assertions)."""

    workers: int
    nodes_cpus: list[int]
    duration_s: float
    killed_node: int | None = None
    killed_processes: int = 0
    killed_workers: list[int] = field(default_factory=list)
    kill_at_s: float | None = None
    results_before_kill: int = 0
    results_stored: int = 0
    cases_stored: int = 0
    reported_keys: int = 0
    reported_lines: int = 0
    losses: int = 0
    duplicate_keys: int = 0
    buckets: int = 0
    buckets_minimised: int = 0
    leases_of_killed: list[int] = field(default_factory=list)
    leases_taken_over: list[int] = field(default_factory=list)
    leases_left: int = 0
    spooled_left: int = 0
    restarts: int = 0
    actors_back_s: float | None = None
    lost_rows: int = 0
    worker_rows: dict[str, int] = field(default_factory=dict)
    down_exit_codes: list[Any] = field(default_factory=list)
    down_s: float | None = None
    status_after_kill: list[dict] = field(default_factory=list)
    status_with_rows: list[dict] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)


_ENGINES: dict[str, Any] = {}


def query(url: str, sql: str, **params: object) -> list[tuple]:
    """Rows of ``sql`` (one engine per URL, kept: the waits poll often)."""
    engine = _ENGINES.get(url) or _ENGINES.setdefault(url, make_engine(url))
    with engine.connect() as connection:
        return [tuple(r) for r in connection.execute(text(sql), params)]


def snapshot(url: str) -> str:
    """The workers and buckets now, for a failure message."""
    try:
        workers = query(url, "SELECT id, pid, status, slot, cases_run, last_heartbeat FROM workers ORDER BY id")
        buckets = query(url, "SELECT id, signature, minimise_owner_id, minimise_attempts, minimised_case_id IS NOT NULL "
                             "FROM buckets ORDER BY id")
        results = query(url, "SELECT COUNT(*) FROM results")[0][0]
    except Exception as exc:  # noqa: BLE001 - a message only
        return f"(database not read: {exc})"
    return f"results {results}\nworkers (id, pid, status, slot, cases, heartbeat): {workers}\n" \
           f"buckets (id, signature, owner, attempts, minimised): {buckets}"


def attnfuzz(*args: str, timeout_s: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``attnfuzz ARGS`` (``python -m attnfuzz``) from the repository root; its output captured."""
    return subprocess.run([sys.executable, "-m", "attnfuzz", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "COLUMNS": "200", **(env or {})})


def wait(condition: Callable[[], Any], what: str, deadline_s: float, logs: Path, url: str, poll_s: float = 1.0) -> Any:
    """``condition()``'s first truthy value, polled; `CampaignFailed` after ``deadline_s``, with
    the database's workers and buckets, the campaign's log and the workers' logs."""
    end = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            files = [logs / "campaign.log", *sorted(logs.glob("worker-*.log"))]
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in files if p.exists())
            last = f"\nlast fleet status: {LAST_STATUS['output']}" if LAST_STATUS.get("output") else ""
            raise CampaignFailed(f"timed out after {deadline_s:g} s waiting for {what}\n{snapshot(url)}{last}\n{tails}")
        time.sleep(poll_s)  # polling interval of a condition wait


def ledger_keys(root: Path) -> tuple[set[tuple], int]:
    """The result keys the workers' ledgers reported, and how many result lines (a line cut by
    ``kill -9`` is skipped: its result was not handed to storage)."""
    keys, lines = set(), 0
    for path in root.glob("ledger-*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "result":
                lines += 1
                keys.add((event["case_id"], event["build_id"], event["backend"], event["variant"], event["phase"]))
    return keys, lines


LAST_STATUS: dict[str, str] = {}
"""What the latest `status` call printed (for the message of a wait that runs out)."""


def status(address: str, campaign: str) -> list[dict]:
    """``attnfuzz fleet status --json --timeout 60`` (an empty list when it fails or runs past
    240 s: on a loaded machine Ray's actors answer slowly)."""
    try:
        done = attnfuzz("fleet", "status", "--address", address, "--campaign", campaign, "--json", "--timeout", "60",
                        timeout_s=240)
    except subprocess.TimeoutExpired:
        LAST_STATUS["output"] = "fleet status ran past 240 s"
        return []
    LAST_STATUS["output"] = f"rc {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
    if done.returncode != 0:
        return []
    try:
        return json.loads(done.stdout)
    except ValueError:
        return []


def run_campaign(root: Path, url: str, *, workers: int = 2, cpus: list[int] | None = None, duration_s: float = 120,
                 kill_after_s: float = 0.0, deadline_s: float = 600, backends: tuple[str, ...] = ("torch-cpu-math", LATE_BUG),
                 until_end: bool = False, log: Callable[[str], None] = lambda m: None) -> Figures:
    """Run the campaign (see the module docstring) in ``root`` on the migrated-or-empty database
    ``url``. ``kill_after_s``: the earliest the node is killed (from ``fleet up``); it is killed
    once a lease is held by a worker of a killable node and results are stored (or, for the long
    run, at most ``deadline_s`` after that, with whatever is held). ``until_end``: after the kill,
    run to the campaign's end (``duration_s``) before ``fleet down``; else stop as soon as the
    leases have moved on. Returns the `Figures`; raises `CampaignFailed` when a wait runs past
    ``deadline_s``."""
    cpus = cpus or [0, 2, 2]
    root.mkdir(parents=True, exist_ok=True)
    figures = Figures(workers=workers, nodes_cpus=cpus, duration_s=duration_s)
    t0 = time.monotonic()

    def mark(what: str) -> None:
        figures.timeline.append((round(time.monotonic() - t0, 1), what))
        line = f"{time.monotonic() - t0:7.1f} s  {what}"
        with open(root / "campaign.log", "a") as fh:
            fh.write(line + "\n")
        log(line)

    cluster = LocalRayCluster(root / "cluster", cpus=cpus)
    campaign = "acceptance"
    try:
        cluster.start()
        mark(f"cluster up at {cluster.address}: nodes with {cpus} CPUs")
        done = attnfuzz("db", "upgrade", "--db", url)
        assert done.returncode == 0, done.stdout + done.stderr
        fuzz = ["--spool-dir", str(root / "spool"), "--ledger", str(root / "ledger-{worker}.jsonl"), "--heartbeat", "1",
                "--shrink-deadline", "20", "--minimise-lease", "30", "--shrink-share", "1", "--max-seqlen", "16",
                "--case-timeout", "60", "--corpus", "", "--db-timeout", "30"]
        for backend in backends:
            fuzz += ["--backend", backend]
        started_at = time.monotonic()
        bug_at = time.time() + kill_after_s
        done = attnfuzz("fleet", "up", "--address", cluster.address, "--campaign", campaign, "--workers", str(workers),
                        "--device", "cpu", "--target", url, "--time-budget", f"{duration_s:.0f}", "--workdir", str(REPO),
                        "--log-dir", str(root), "--env", f"ATTNFUZZ_LATE_BUG_AT={bug_at:.3f}", "--json", "--", *fuzz,
                        timeout_s=600)
        assert done.returncode == 0, done.stdout + done.stderr
        placed = {}
        for info in json.loads(done.stdout):
            placed[info["node_id"][:8]] = placed.get(info["node_id"][:8], 0) + 1
        mark(f"fleet up: {workers} workers, per node {placed}")

        def held_on_killable() -> tuple[int, list[int]] | None:
            """(node index, bucket ids) of a lease held by a worker of a non-head node."""
            if time.monotonic() - started_at < kill_after_s:
                return None
            if not query(url, "SELECT 1 FROM results LIMIT 1"):
                return None
            rows = query(url, "SELECT b.id, w.pid FROM buckets b JOIN workers w ON w.id = b.minimise_owner_id "
                              "WHERE b.minimised_case_id IS NULL AND w.status = 'running'")
            for index in range(1, len(cpus)):
                pids = cluster.node_processes(index)
                held = [bucket for bucket, pid in rows if pid in pids]
                if held:
                    return index, held
            return None

        found = wait(held_on_killable, "stored results and a minimisation lease held by a worker of a killable node",
                     deadline_s + kill_after_s, root, url, poll_s=0.3)
        node, _ = found
        victims = cluster.node_processes(node)
        killed_rows = query(url, "SELECT id, pid FROM workers WHERE status = 'running'")
        figures.killed_workers = sorted(wid for wid, pid in killed_rows if pid in victims)
        figures.results_before_kill = query(url, "SELECT COUNT(*) FROM results")[0][0]
        figures.killed_processes = cluster.kill_node(node)
        figures.killed_node = node
        figures.kill_at_s = round(time.monotonic() - started_at, 1)
        ids = ",".join(str(w) for w in figures.killed_workers) or "0"
        figures.leases_of_killed = sorted(r[0] for r in query(
            url, f"SELECT id FROM buckets WHERE minimise_owner_id IN ({ids}) AND minimised_case_id IS NULL"))
        mark(f"kill -9 of node {node}: {figures.killed_processes} processes, workers {figures.killed_workers}, "
             f"leases {figures.leases_of_killed}, {figures.results_before_kill} results stored")

        def actors_back() -> list[dict] | None:
            records = status(cluster.address, campaign)
            ok = (len(records) == workers and all(r["actor_state"] == "ALIVE" and r.get("state") in ("running", "done")
                                                  for r in records)
                  and sum(r["restarts"] for r in records) >= 1)
            return records if ok else None

        figures.status_after_kill = wait(actors_back, "every actor alive again, one restarted at least", deadline_s, root, url)
        figures.actors_back_s = round(time.monotonic() - started_at - figures.kill_at_s, 1)
        figures.restarts = sum(r["restarts"] for r in figures.status_after_kill)
        mark(f"actors back: restarts {figures.restarts}, on nodes {sorted({r.get('node_id', '')[:8] for r in figures.status_after_kill})}")

        def lost_and_moved_on() -> bool:
            lost = query(url, f"SELECT COUNT(*) FROM workers WHERE id IN ({ids}) AND status = 'lost'")[0][0]
            if lost < len(figures.killed_workers):
                return False
            if not figures.leases_of_killed:
                return True
            moved = query(url, f"SELECT id FROM buckets WHERE id IN ({','.join(map(str, figures.leases_of_killed))}) "
                               f"AND (minimised_case_id IS NOT NULL OR (minimise_owner_id IS NOT NULL AND minimise_owner_id NOT IN ({ids})))")
            figures.leases_taken_over = sorted(r[0] for r in moved)
            return len(figures.leases_taken_over) == len(figures.leases_of_killed)

        wait(lost_and_moved_on, "the killed workers' rows lost and their leases taken over", deadline_s, root, url)
        mark(f"killed workers lost, leases taken over: {figures.leases_taken_over}")

        def rows_shown() -> list[dict] | None:
            records = status(cluster.address, campaign)
            ok = len(records) == workers and all((r.get("worker") or {}).get("status") == "running" for r in records)
            return records if ok else None

        figures.status_with_rows = wait(rows_shown, "fleet status showing every worker's row (running, heartbeat)",
                                        deadline_s, root, url)
        mark("fleet status: every worker's row, cases "
             f"{[r['worker']['cases_run'] for r in figures.status_with_rows]}")
        if until_end:
            def ended() -> bool:
                records = status(cluster.address, campaign)
                return bool(records) and all(r.get("state") in ("done", "failed") for r in records)

            wait(ended, "the campaign's end", duration_s + deadline_s, root, url, poll_s=5)
            mark("campaign at its end")
        down_started = time.monotonic()
        done = attnfuzz("fleet", "down", "--address", cluster.address, "--campaign", campaign, "--json", timeout_s=300)
        figures.down_s = round(time.monotonic() - down_started, 1)
        assert done.returncode == 0, done.stdout + done.stderr
        figures.down_exit_codes = [d.get("exit_code") for d in json.loads(done.stdout)]
        mark(f"fleet down in {figures.down_s} s: exit codes {figures.down_exit_codes}")
    finally:
        cluster.stop()

    from fuzzer.spool import SPOOL_FILE, database_key
    import sqlite3

    for path in (root / "spool" / database_key(url)).glob(f"slot-*/{SPOOL_FILE}"):
        with sqlite3.connect(path, timeout=5) as db:
            figures.spooled_left += db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
    reported, figures.reported_lines = ledger_keys(root)
    stored = query(url, f"SELECT {KEY} FROM results")
    figures.results_stored = len(stored)
    figures.cases_stored = query(url, "SELECT COUNT(*) FROM cases")[0][0]
    figures.reported_keys = len(reported)
    figures.losses = len(reported - set(stored))
    figures.duplicate_keys = len(query(url, f"SELECT {KEY} FROM results GROUP BY {KEY} HAVING COUNT(*) > 1"))
    figures.buckets, figures.buckets_minimised = query(
        url, "SELECT COUNT(*), COUNT(minimised_case_id) FROM buckets")[0]
    figures.leases_left = query(url, "SELECT COUNT(*) FROM buckets WHERE minimise_owner_id IS NOT NULL "
                                     "AND minimised_case_id IS NULL")[0][0]
    figures.worker_rows = dict(query(url, "SELECT status, COUNT(*) FROM workers GROUP BY status"))
    figures.lost_rows = figures.worker_rows.get("lost", 0)
    mark(f"checked: {figures.results_stored} results, losses {figures.losses}, duplicates {figures.duplicate_keys}")
    engine = _ENGINES.pop(url, None)
    if engine is not None:
        engine.dispose()
    return figures
