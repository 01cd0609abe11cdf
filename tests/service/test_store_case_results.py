"""`SqlStore.record_case_results`: a case with all its results in one transaction, with the same
rows, buckets and answers as `record_case` + `record_result` per result (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.errors import FieldValidationError, NotFoundError
from service.db.models import Bucket, Case, Result
from service.db.store import SqlStore

CASE = AttentionCase(batch_size=1, seqlen_q=17, seqlen_k=33, num_heads=2, causal=True)
OTHER = AttentionCase(batch_size=1, seqlen_q=9, seqlen_k=9, num_heads=2)


def _results(case: AttentionCase) -> list[CaseResult]:
    cid = case.case_id
    return [
        CaseResult(cid, "b1", "native", "pass"),
        CaseResult(cid, "b1", "window", "unsupported", detail="no windows"),
        CaseResult(cid, "b2", "native", "fail", signature="out:all_zero", signatures=("out:all_zero",), error_ratio=50.0),
        CaseResult(cid, "b2", "other", "crash", signature="crash", signatures=("crash",), detail="SIGSEGV"),
    ]


def _count(session: Session, model: type) -> int:
    return session.scalar(select(func.count()).select_from(model))


@pytest.fixture
def ids(store: SqlStore) -> tuple[int, int]:
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    return build_id, store.register_worker(build_id, "host", 1, "cpu")


def test_one_call_stores_the_case_and_every_result(store: SqlStore, session: Session, ids: tuple[int, int]) -> None:
    build_id, worker_id = ids
    updates = store.record_case_results(CASE.to_json(), "fuzz", _results(CASE), build_id, worker_id)
    assert [u is None for u in updates] == [True, True, False, False]
    assert updates[2].is_new and updates[3].is_new and updates[2].bucket_id != updates[3].bucket_id
    assert _count(session, Case) == 1
    assert _count(session, Result) == 4
    statuses = sorted(session.scalars(select(Result.status)).all())
    assert statuses == ["crash", "fail", "pass", "unsupported"]


def test_again_changes_nothing_and_names_the_same_buckets(store: SqlStore, session: Session, ids: tuple[int, int]) -> None:
    build_id, worker_id = ids
    first = store.record_case_results(CASE.to_json(), "fuzz", _results(CASE), build_id, worker_id)
    again = store.record_case_results(CASE.to_json(), "fuzz", _results(CASE), build_id, worker_id)
    assert [u and u.bucket_id for u in again] == [u and u.bucket_id for u in first]
    assert not any(u.is_new for u in again if u is not None)
    assert _count(session, Result) == 4
    assert sorted(session.scalars(select(Bucket.hit_count)).all()) == [1, 1]


def test_same_rows_and_counts_as_one_result_at_a_time(store: SqlStore, session: Session, ids: tuple[int, int]) -> None:
    build_id, worker_id = ids
    store.record_case(OTHER.to_json(), "fuzz")
    singles = [store.record_result(r, build_id, worker_id) for r in _results(OTHER)]
    batched = store.record_case_results(CASE.to_json(), "fuzz", _results(CASE), build_id, worker_id)
    # the second case hits the buckets the first one created: counted, not new
    assert [u and u.bucket_id for u in batched] == [u and u.bucket_id for u in singles]
    assert all(not u.is_new for u in batched if u is not None)
    assert sorted(session.scalars(select(Bucket.hit_count)).all()) == [2, 2]
    rows = session.execute(select(Result.case_id, Result.backend, Result.variant, Result.status, Result.detail)).all()
    by_case: dict[str, set] = {}
    for case_id, *rest in rows:
        by_case.setdefault(case_id, set()).add(tuple(rest))
    assert by_case[CASE.case_id] == by_case[OTHER.case_id]


def test_a_key_repeated_in_one_call_is_stored_once(store: SqlStore, session: Session, ids: tuple[int, int]) -> None:
    build_id, worker_id = ids
    failure = _results(CASE)[2]
    updates = store.record_case_results(CASE.to_json(), "fuzz", [failure, failure], build_id, worker_id)
    assert updates[0].is_new and not updates[1].is_new and updates[0].bucket_id == updates[1].bucket_id
    assert _count(session, Result) == 1
    assert session.scalar(select(Bucket.hit_count)) == 1


def test_hundreds_of_results_of_one_case(store: SqlStore, session: Session, ids: tuple[int, int]) -> None:
    build_id, worker_id = ids
    many = [CaseResult(CASE.case_id, "b1", f"v{i}", "pass") for i in range(250)]  # more than one batch of rows
    assert store.record_case_results(CASE.to_json(), "fuzz", many, build_id, worker_id) == [None] * len(many)
    assert _count(session, Result) == len(many)


def test_nothing_is_stored_when_the_worker_is_unknown(store: SqlStore, session: Session, ids: tuple[int, int]) -> None:
    build_id, worker_id = ids
    with pytest.raises(NotFoundError):
        store.record_case_results(CASE.to_json(), "fuzz", _results(CASE), build_id, worker_id + 1000)
    assert _count(session, Case) == 0
    assert _count(session, Result) == 0


def test_a_result_of_another_case_is_refused(store: SqlStore, session: Session, ids: tuple[int, int]) -> None:
    build_id, worker_id = ids
    with pytest.raises(FieldValidationError, match="case_id"):
        store.record_case_results(CASE.to_json(), "fuzz", _results(OTHER), build_id, worker_id)
    assert _count(session, Case) == 0


def test_the_unknown_build_or_worker_is_named(store: SqlStore, session: Session, ids: tuple[int, int]) -> None:
    """One SELECT checks both: an unknown build is named first, then an unknown worker; a known
    pair (and a None worker) passes."""
    build_id, worker_id = ids
    with pytest.raises(NotFoundError, match="build"):
        store.record_case_results(CASE.to_json(), "fuzz", _results(CASE), build_id + 1000, worker_id + 1000)
    with pytest.raises(NotFoundError, match="build"):
        store.record_case_results(CASE.to_json(), "fuzz", _results(CASE), build_id + 1000, None)
    with pytest.raises(NotFoundError, match="worker"):
        store.record_case_results(CASE.to_json(), "fuzz", _results(CASE), build_id, worker_id + 1000)
    assert _count(session, Case) == 0
    store.record_case_results(CASE.to_json(), "fuzz", _results(CASE), build_id, None)
    assert _count(session, Result) == len(_results(CASE))
