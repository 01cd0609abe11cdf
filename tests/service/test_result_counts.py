"""The overview's counts on PostgreSQL come from `ResultTotal`, `ResultHour` and `CaseHour`, kept by
migration 0008's statement trigger on ``results``: they must equal counting ``results`` itself,
whichever path wrote the rows, and keeping them must never make one writer wait for another."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.api.requests import CaseBatchIn
from service.db import batch, ingest, stats
from service.db.store import SqlStore
from tests.service.conftest import Database, rolled_back


@pytest.fixture
def pg(postgresql_database: Database) -> Iterator[Connection]:
    with rolled_back(postgresql_database.engine) as connection:
        yield connection


def _counted(session: Session, start: datetime) -> tuple[list[tuple[str, str, int]], dict[datetime, tuple[int, int]]]:
    """What the overview shows, read from the count tables (``True``) or from ``results``."""
    return sorted(stats.result_counts(session)), stats._activity(session, start)


def _results(case: AttentionCase, backends: list[str]) -> list[CaseResult]:
    out = []
    for i, backend in enumerate(backends):
        status = ("pass", "unsupported", "fail")[i % 3]
        out.append(CaseResult(case.case_id, backend, "fwd", status, signature="out:mismatch" if status == "fail" else None,
                              detail="no" if status == "unsupported" else ""))
    return out


def test_the_kept_counts_equal_counting_the_results_whatever_path_wrote_them(
    pg: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqlStore(pg)
    build = store.register_build(BuildFingerprint(torch="2.13.0", device_name="counts"))
    worker = store.register_worker(build, "node", 1, "cpu")
    cases = [AttentionCase(seqlen_q=4, seqlen_k=4 + i, num_heads=2, head_dim=8, dtype="float32") for i in range(4)]
    backends = ["sdpa", "fa2", "fa4", "te"]
    # SqlStore, one case a transaction (a worker with a database URL)
    store.record_case_results(cases[0].to_json(), "fuzz", _results(cases[0], backends), build, worker)
    store.record_case_results(cases[0].to_json(), "fuzz", _results(cases[0], backends), build, worker)  # again: nothing new
    # one result
    store.record_case(cases[1].to_json(), "fuzz")
    store.record_result(_results(cases[1], backends)[0], build, worker)
    # POST /api/results
    ingest.ingest_results(pg, build, worker, _results(cases[1], backends)[1:])
    # POST /api/case-results: the document path and the rows path
    for case, document in ((cases[2], True), (cases[3], False)):
        body = CaseBatchIn.model_validate({"build_id": build, "worker_id": worker, "cases": [
            {"case": case.to_json(), "origin": "fuzz", "results": [r.to_json() for r in _results(case, backends * 2)]}]})
        doc = body.results_json() if document else None
        batch.ingest_case_batch(pg, build, worker, body.entries(light=document), batch.DeferredHits().begin(), results_json=doc)
        if document:  # retried
            batch.ingest_case_batch(pg, build, worker, body.entries(light=True), batch.DeferredHits().begin(), results_json=doc)

    # the same cases also written by another connection (a replay on a second worker): counted once
    pg.execute(text("INSERT INTO case_hours (hour, writer, case_id) SELECT hour, writer + 1, case_id FROM case_hours"))
    session = Session(bind=pg)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
    kept = _counted(session, start)
    monkeypatch.setattr(stats, "counts_kept_by_the_database", lambda session: False)
    counted = _counted(session, start)
    assert kept == counted
    assert sum(n for _, _, n in kept[0]) == 16 and sum(c for c, _ in kept[1].values()) == 4

    # the repair refills them to the same
    monkeypatch.undo()
    stats.rebuild_result_counts(session)
    assert _counted(session, start) == counted


def test_keeping_the_counts_never_makes_a_writer_wait_for_another(postgres_server: Any) -> None:
    from service.db import migrations
    from service.db.engine import make_engine

    url = postgres_server.new_schema_url()
    try:
        migrations.upgrade(url)
        engine = make_engine(url)
        store = SqlStore(engine)
        build = store.register_build(BuildFingerprint(torch="2.13.0", device_name="waits"))
        case = AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=2, head_dim=8, dtype="float32")
        store.record_case(case.to_json(), "fuzz")
        same = CaseResult(case.case_id, "sdpa", "fwd", "pass")
        with engine.connect() as first, engine.connect() as second:
            first.begin()
            SqlStore(first).record_result(same, build, None)  # same backend, status and hour: the same counts
            second.begin()
            second.execute(text("SET LOCAL lock_timeout = '1s'"))
            # the other transaction is open (a stopped worker): this one must not wait on a count row
            SqlStore(second).record_result(dataclasses.replace(same, variant="bwd"), build, None)
            second.commit()
            first.commit()
        with engine.connect() as c:
            assert c.execute(text("SELECT sum(results) FROM result_totals")).scalar_one() == 2
            assert c.execute(text("SELECT count(DISTINCT writer) FROM result_totals")).scalar_one() == 2
        engine.dispose()
    finally:
        postgres_server.drop_schema_of(url)
