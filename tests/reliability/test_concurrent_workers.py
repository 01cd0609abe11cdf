"""Four workers writing one SQLite file and one PostgreSQL database at once (the real CLI).

Two pairs of workers share a seed, so they draw the same cases and race to store the same result
keys; all four race to claim the same buckets. Afterwards every result each worker reported (its
ledger) is stored exactly once, no bucket is duplicated, each bucket's hit count equals its
results, and no two live workers held one bucket's minimisation at the same time (from the
ledgers' claim and end events). Each worker runs 40 cases (a few seconds each on CI); the chaos soak
(``benchmarks/chaos/soak.py``) runs the same for 30 minutes with faults.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from service.db import migrations
from tests.reliability.conftest import counts, fuzz_args, query

pytestmark = pytest.mark.timeout(400)

WORKERS = 4
CASES = "40"  # per worker: the pairs race on the same keys however slowly the machine starts four workers
# An upper bound only: the workers stop after CASES cases. A budget alone (25 s from the command's start,
# WorkerConfig.ends_at_s) left four workers starting side by side on a loaded 2-core machine no time for a
# case (the full suite on 2026-12-02: no result stored, so the pairs' race was not seen).
BUDGET_S = "240"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = server.new_schema_url()
        request.addfinalizer(lambda: server.drop_schema_of(url))
    migrations.upgrade(url)
    return url


def _events(ledgers: list[Path]) -> list[dict]:
    return [json.loads(line) for path in ledgers for line in path.read_text().splitlines()]


def _overlaps(events: list[dict]) -> list[tuple]:
    """Claims of a bucket made while another worker still held it (claimed, not yet ended)."""
    by_bucket = defaultdict(list)
    for event in events:
        if event["event"] in ("claim", "minimised", "released"):
            by_bucket[event["bucket_id"]].append(event)
    overlaps = []
    for bucket_id, bucket_events in by_bucket.items():
        holder = None
        for event in sorted(bucket_events, key=lambda e: e["t"]):
            if event["event"] == "claim":
                if holder is not None and holder != event["pid"]:
                    overlaps.append((bucket_id, holder, event["pid"]))
                holder = event["pid"]
            elif event["pid"] == holder:
                holder = None
    return overlaps


def test_four_workers_store_every_result_exactly_once_and_share_minimisation(cli, shared_url, tmp_path) -> None:
    ledgers = [tmp_path / f"ledger-{i}.jsonl" for i in range(WORKERS)]
    workers = [
        cli(*fuzz_args(shared_url, tmp_path / "spool", "--time-budget", BUDGET_S, "--max-cases", CASES, "--seed", str(i // 2),
                       "--ledger", str(ledgers[i]), "--shrink-deadline", "5", "--db-timeout", "30",
                       "--shrink-share", "1"))  # every worker claims (a run this short is too short for a 25% share)
        for i in range(WORKERS)
    ]
    codes = [w.wait(300) for w in workers]
    assert codes == [0] * WORKERS, "\n\n".join(w.output()[-2000:] for w in workers)

    events = _events(ledgers)
    reported = {(e["case_id"], e["build_id"], e["backend"], e["variant"], e["phase"]) for e in events if e["event"] == "result"}
    stored = query(shared_url, "SELECT case_id, build_id, backend, variant, phase FROM results")
    rows = counts(shared_url)
    assert len(stored) == len(set(stored)) == rows["results"], "no result key stored twice"
    assert set(stored) == reported, f"lost {len(reported - set(stored))}, unreported {len(set(stored) - reported)}"
    assert sum(e["event"] == "result" for e in events) > len(reported), "the same-seed pairs raced on the same keys"
    assert rows["workers"] == WORKERS and query(shared_url, "SELECT DISTINCT status FROM workers") == [("stopped",)]
    keys = query(shared_url, "SELECT backend, variant, signature FROM buckets")
    assert len(keys) == len(set(keys)) >= 1, "buckets are not duplicated"
    mismatched = query(
        shared_url,
        "SELECT b.id FROM buckets b WHERE b.hit_count != (SELECT COUNT(*) FROM results r WHERE r.backend = b.backend"
        " AND r.variant = b.variant AND r.signature = b.signature)",
    )
    assert mismatched == []
    claims = [e for e in events if e["event"] == "claim"]
    assert claims, "the workers minimised buckets"
    assert _overlaps(events) == [], "one worker at a time per bucket"
    held = query(shared_url, "SELECT COUNT(*) FROM buckets WHERE minimise_owner_id IS NOT NULL")
    assert held == [(0,)], "every lease ended with its worker"
    claimed_by = defaultdict(set)
    for claim in claims:
        claimed_by[claim["bucket_id"]].add(claim["pid"])
    attempts = dict(query(shared_url, "SELECT id, minimise_attempts FROM buckets"))
    assert all(attempts[b] == len([c for c in claims if c["bucket_id"] == b]) for b in claimed_by)
