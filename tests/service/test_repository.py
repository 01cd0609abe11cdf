"""`service.db.repository` on its own: validation, overview time buckets, duplicate chains."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from service.db import repository, stats
from service.errors import FieldValidationError, NotFoundError
from service.db.models import Bucket, Result, TriageState, Worker
from tests.service.conftest import Seeded

NOW = datetime(2026, 11, 29, 17, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sort": "notes"}, "sort"),
        ({"limit": 0}, "limit"),
        ({"offset": -5}, "offset"),
        ({"triage_state": "x"}, "triage_state"),
    ],
)
def test_list_buckets_names_the_bad_argument(session: Session, kwargs: dict, field: str) -> None:
    with pytest.raises(FieldValidationError) as raised:
        repository.list_buckets(session, **kwargs)
    assert raised.value.field == field


def test_get_bucket_and_get_case_return_none_for_unknown_ids(session: Session) -> None:
    assert repository.get_bucket(session, 424242) is None
    assert repository.get_case(session, "0123456789abcdef") is None


def test_get_case_maps_each_failure_to_its_bucket(session: Session, seeded: Seeded) -> None:
    detail = repository.get_case(session, seeded.other_case.case_id)
    assert {r.backend: detail.bucket_id_for(r) for r in detail.results} == {
        "sdpa": seeded.nan_bucket_id,
        "fa4": seeded.fa4_bucket_id,
        "te": None,
    }
    assert detail.case.to_attention_case() == seeded.other_case


def test_overview_counts_distinct_cases_per_utc_hour(session: Session, seeded: Seeded) -> None:
    hour = NOW.replace(minute=0)
    session.execute(update(Result).values(created_at=hour - timedelta(hours=2, minutes=-5)))
    session.execute(
        update(Result).where(Result.case_id == seeded.case.case_id).values(created_at=hour + timedelta(minutes=10))
    )
    session.execute(update(Result).where(Result.backend == "fa4").values(created_at=hour - timedelta(days=3)))
    stats.rebuild_result_counts(session)  # results are never updated but here: PostgreSQL's counts follow inserts
    overview = stats.overview(session, now=NOW, hours=3)
    assert [(h.hour, h.cases, h.results) for h in overview.cases_per_hour] == [
        (hour - timedelta(hours=2), 2, 3),  # other_case's sdpa + te, the minimised case's shrink run
        (hour - timedelta(hours=1), 0, 0),
        (hour, 1, 3),  # case: sdpa, fa2, te
    ]
    assert all(h.hour.tzinfo is UTC for h in overview.cases_per_hour)


def test_overview_lists_only_workers_with_a_recent_heartbeat(session: Session, seeded: Seeded) -> None:
    session.execute(update(Worker).values(last_heartbeat=NOW - timedelta(seconds=90)))
    live = stats.overview(session, now=NOW, live_within_s=120).live_workers
    assert [(w.worker.id, w.heartbeat_age_s) for w in live] == [(seeded.worker_id, 90.0)]
    assert live[0].worker.build.torch == "2.13.0"
    assert stats.overview(session, now=NOW, live_within_s=60).live_workers == []


def test_a_worker_that_stopped_is_not_live_however_recent_its_last_heartbeat(session: Session, seeded: Seeded) -> None:
    session.execute(update(Worker).values(last_heartbeat=NOW - timedelta(seconds=30), status="stopped"))
    assert stats.overview(session, now=NOW).live_workers == []
    assert repository.list_workers(session, live_only=True, now=NOW).items == []
    snapshot = stats.metrics_snapshot(session, now=NOW)
    assert snapshot.live_workers == 0
    assert [w.worker.id for w in snapshot.workers] == [seeded.worker_id]  # still reported per worker
    session.execute(update(Worker).values(status="running"))
    assert [w.worker.id for w in stats.overview(session, now=NOW).live_workers] == [seeded.worker_id]
    assert stats.metrics_snapshot(session, now=NOW).live_workers == 1


def test_overview_rejects_an_out_of_range_window(session: Session) -> None:
    with pytest.raises(FieldValidationError, match="hours"):
        stats.overview(session, hours=0)


def test_update_triage_refuses_duplicate_cycles(session: Session, seeded: Seeded) -> None:
    a, b, c = seeded.nan_bucket_id, seeded.crash_bucket_id, seeded.fa4_bucket_id
    repository.update_triage(session, a, triage_state="duplicate", duplicate_of_id=b)
    repository.update_triage(session, b, triage_state="duplicate", duplicate_of_id=c)
    with pytest.raises(FieldValidationError) as raised:
        repository.update_triage(session, c, triage_state="duplicate", duplicate_of_id=a)
    assert raised.value.field == "duplicate_of_id"
    assert session.get(Bucket, c).triage_state is TriageState.new


def test_update_triage_leaves_unset_fields_alone_and_clears_with_none(session: Session, seeded: Seeded) -> None:
    bucket_id = seeded.crash_bucket_id
    repository.update_triage(session, bucket_id, notes="segfault on sm90", upstream_url="https://example.org/1")
    bucket = repository.update_triage(session, bucket_id, triage_state=TriageState.reported)
    assert (bucket.notes, bucket.upstream_url, bucket.triage_state) == (
        "segfault on sm90",
        "https://example.org/1",
        TriageState.reported,
    )
    bucket = repository.update_triage(session, bucket_id, notes=None, upstream_url=None)
    assert (bucket.notes, bucket.upstream_url) == ("", None)


def test_update_triage_of_an_unknown_bucket_raises_not_found(session: Session) -> None:
    with pytest.raises(NotFoundError):
        repository.update_triage(session, 424242, notes="x")
