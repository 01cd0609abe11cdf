"""`SqlStore` beside a stopped worker (issue 38): no write waits on a row lock that a stopped
process holds, and a lease holder resumed after its lease was taken over stores nothing.

On PostgreSQL a worker stopped with SIGSTOP inside its write keeps that transaction's row locks
until it is continued; the stand-in here is a second connection that locks the bucket's row (as
the stopped worker's ``UPDATE buckets`` did) and never commits while the test runs. Before the
fix the other workers waited on that lock and stored no result for 90 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select, text

from fuzzer.results import BuildFingerprint, CaseResult, LeaseLostError
from oracle.config import AttentionCase
from service.db import migrations
from service.db.engine import make_engine
from service.db.models import Bucket, utcnow
from service.db.store import SqlStore

LATER = timedelta(hours=1)
FEW_S = 10.0  # "within a few seconds" on a loaded 2-core machine; a stopped holder never lets go


def _failure(case: AttentionCase, signature: str = "out:nan", ratio: float | None = None) -> CaseResult:
    return CaseResult(
        case_id=case.case_id, backend="sdpa", variant="default", status="fail", signature=signature, error_ratio=ratio
    )


def _cases(n: int, start: int = 1) -> list[AttentionCase]:
    return [AttentionCase(seqlen_q=start + i, seqlen_k=7) for i in range(n)]


@pytest.fixture
def pg_url(postgres_server) -> Iterator[str]:
    url = postgres_server.new_schema_url()
    migrations.upgrade(url)
    yield url
    postgres_server.drop_schema_of(url)


def _in_thread(fn, timeout_s: float) -> tuple[bool, object, float]:
    """``(finished, value or exception, seconds)`` of ``fn()`` in a daemon thread, waited for at
    most ``timeout_s``: a write stuck on a lock fails the test instead of hanging it."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["value"] = exc

    t0 = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return not thread.is_alive(), box.get("value"), time.monotonic() - t0


@pytest.mark.postgres
def test_a_bucket_row_locked_by_a_stopped_worker_does_not_stop_another_from_storing_results(pg_url: str) -> None:
    """Break 3: the others waited on the stopped worker's bucket row lock. Now the results are
    stored at once, the bucket's counts are kept aside while the row is locked and written by the
    first write after it is free: every hit is counted exactly once."""
    engine = make_engine(pg_url)
    holder = make_engine(pg_url).connect()
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        worker_id = store.register_worker(build_id, "h", 2, "cpu")
        first, *more = _cases(4)
        bucket_id = store.record_case_results(first.to_json(), "fuzz", [_failure(first)], build_id, worker_id)[0].bucket_id

        transaction = holder.begin()  # the stopped worker, inside its UPDATE buckets
        holder.execute(text("UPDATE buckets SET hit_count = hit_count + 0 WHERE id = :id"), {"id": bucket_id})

        def store_more() -> list:
            return [
                store.record_case_results(c.to_json(), "fuzz", [_failure(c, ratio=50.0 + i)], build_id, worker_id)[0]
                for i, c in enumerate(more)
            ]

        finished, value, took_s = _in_thread(store_more, FEW_S)
        assert finished, f"storing waited {took_s:.0f} s (and on) on the locked bucket row"
        assert not isinstance(value, BaseException), repr(value)
        assert [u.bucket_id for u in value] == [bucket_id] * 3, value
        with engine.connect() as reader:
            stored = reader.scalar(text("SELECT COUNT(*) FROM results"))
        assert stored == 4, "every result stored while the row was locked"
        assert sum(h.count for h in store.deferred_hits.values()) == 3, store.deferred_hits

        transaction.rollback()  # SIGCONT: the stopped worker's transaction ends
        store.heartbeat(worker_id, 4)  # any later write adds the counts kept aside
        with engine.connect() as reader:
            hits, ratio, severity = reader.execute(
                select(Bucket.hit_count, Bucket.max_error_ratio, Bucket.severity).where(Bucket.id == bucket_id)
            ).one()
        assert (hits, ratio) == (4, 52.0) and not store.deferred_hits, (hits, ratio, store.deferred_hits)
        assert severity == "wrong", severity
    finally:
        holder.close()
        engine.dispose()


@pytest.mark.postgres
def test_a_claim_skips_a_bucket_row_locked_by_a_stopped_worker(pg_url: str) -> None:
    """A claim between chunks waited on a bucket row that a stopped worker held; it now takes
    the next claimable bucket (and the locked one once it is free)."""
    engine = make_engine(pg_url)
    holder = make_engine(pg_url).connect()
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        worker_id = store.register_worker(build_id, "h", 2, "cpu")
        ids = []
        for i, c in enumerate(_cases(2)):
            ids.append(store.record_case_results(c.to_json(), "fuzz", [_failure(c, f"out:sig{i}")], build_id, None)[0].bucket_id)
        transaction = holder.begin()
        holder.execute(text("SELECT id FROM buckets WHERE id = :id FOR UPDATE"), {"id": ids[0]})
        finished, claim, took_s = _in_thread(lambda: store.claim_minimisation(worker_id, ["sdpa"], 60.0), FEW_S)
        assert finished, f"the claim waited {took_s:.0f} s (and on) on the locked bucket row"
        assert not isinstance(claim, BaseException) and claim.bucket_id == ids[1], claim
        transaction.rollback()
        assert store.claim_minimisation(worker_id, ["sdpa"], 60.0).bucket_id == ids[0]
    finally:
        holder.close()
        engine.dispose()


def test_a_stale_lease_holder_cannot_record_a_second_minimisation(store: SqlStore) -> None:
    """Break 3: after SIGCONT a worker whose lease had expired and been taken over recorded a
    second minimisation over the new holder's. ``record_minimised(lease=claim.attempt)`` is
    fenced: refused (`LeaseLostError`, nothing written) once another worker claimed the bucket,
    before and after that worker records its own; the current holder's record stands."""
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    (case,) = _cases(1)
    bucket_id = store.record_case_results(case.to_json(), "fuzz", [_failure(case)], build_id, None)[0].bucket_id
    stopped = store.register_worker(build_id, "h", 1, "cpu")
    other = store.register_worker(build_id, "h", 2, "cpu")
    stale = store.claim_minimisation(stopped, ["sdpa"], lease_s=60.0)
    taken = store.claim_minimisation(other, ["sdpa"], lease_s=60.0, now=utcnow() + LATER)  # the lease ran out
    assert (stale.attempt, taken.attempt) == (1, 2)
    minimal = AttentionCase(seqlen_q=1, seqlen_k=1).to_json()
    with pytest.raises(LeaseLostError, match=f"bucket {bucket_id}: the lease of claim 1"):
        store.record_minimised(bucket_id, minimal, case.case_id, "minimised: stale", worker_id=stopped, lease=stale.attempt)
    store.record_minimised(bucket_id, AttentionCase(seqlen_q=2, seqlen_k=1).to_json(), case.case_id, "minimised: holder",
                           worker_id=other, lease=taken.attempt)
    with pytest.raises(LeaseLostError):
        store.record_minimised(bucket_id, minimal, case.case_id, "minimised: stale", worker_id=stopped, lease=stale.attempt)
    with pytest.raises(LeaseLostError):  # the holder's own second record: it has its minimised case
        store.record_minimised(bucket_id, minimal, case.case_id, "minimised: again", worker_id=other, lease=taken.attempt)
    rows = store.known_failures(["sdpa"])
    assert [AttentionCase.from_json(c).seqlen_q for _, c in rows] == [2], rows
