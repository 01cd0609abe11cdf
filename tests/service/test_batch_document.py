"""``POST /api/case-results`` on PostgreSQL writes a batch's result rows from ONE JSON document that
the database parses (`service.db.batch._insert_results_document`), the passing and unsupported
results never becoming `CaseResult`s. These tests hold it to the rows path (`CaseResult` per
result, COPY): the same rows, the same answers, and the rows path wherever a result needs
`CaseResult`'s cuts or JSON cannot spell a value."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Connection

from fuzzer.results import BuildFingerprint, CaseResult
from fuzzer.text import MAX_DETAIL, MAX_PACKAGE
from oracle.config import AttentionCase
from service.api.requests import CaseBatchIn
from service.db import batch
from service.db.models import Result
from service.db.store import SqlStore
from tests.service.conftest import Database, rolled_back

COMPARED = [c for c in batch.RESULT_COLUMNS if c not in ("build_id", "created_at")]

VERDICT = {  # the shape of a stored verdict's metrics, figures of every JSON kind
    "out": {"name": "out", "passed": True, "signatures": [], "rel_l2": 0.0031, "max_abs": 0.015625,
            "error_ratio": 0.42, "worst_index": [0, 3, 1, 17], "nan_count": 0, "is_all_zero": False, "note": None},
    "lse": {"name": "lse", "passed": True, "signatures": [], "rel_l2": 1e-300, "error_ratio": 1.7976931348623157e308},
}


@pytest.fixture
def connection(postgresql_database: Database) -> Iterator[Connection]:
    with rolled_back(postgresql_database.engine) as connection:
        yield connection


def _results(case: AttentionCase) -> list[dict[str, Any]]:
    cid = case.case_id
    return [
        CaseResult(cid, "sdpa", "fwd", "pass", metrics=copy.deepcopy(VERDICT), error_ratio=0.42, run_ms=1.25, oracle_ms=3.5,
                   backend_version="torch 2.13.0 \u00e9\u4e2d", selected_kernel="flash").to_json(),
        CaseResult(cid, "fa2", "fwd", "unsupported", detail="head_dim 8 not in (64, 128)\nsecond line").to_json(),
        CaseResult(cid, "fa4", "bwd", "fail", signature="dq:mismatch", signatures=("dq:mismatch", "dk:mismatch"),
                   metrics={"dq": {"passed": False, "error_ratio": 9.5}}, error_ratio=9.5, compile_ms=812.0).to_json(),
        CaseResult(cid, "fa4", "fwd", "error", signature="error:RuntimeError", detail="CUDA error").to_json(),
        # the same key twice in one batch: the first is the one stored, pass first then fail
        CaseResult(cid, "te-fused", "fwd", "pass").to_json(),
        CaseResult(cid, "te-fused", "fwd", "fail", signature="out:mismatch", error_ratio=3.0).to_json(),
        # ... and fail first then pass
        CaseResult(cid, "te-unfused", "fwd", "fail", signature="out:nan", error_ratio=2.0).to_json(),
        CaseResult(cid, "te-unfused", "fwd", "pass").to_json(),
        CaseResult(cid, "sdpa", "fwd", "pass", phase="replay").to_json(),
    ]


def _body(build_id: int, worker_id: int | None, cases: list[AttentionCase], edit: Any = None) -> CaseBatchIn:
    items = []
    for case in cases:
        results = _results(case)
        if edit is not None:
            edit(results)
        items.append({"case": case.to_json(), "origin": "fuzz", "results": results})
    return CaseBatchIn.model_validate({"build_id": build_id, "worker_id": worker_id, "cases": items})


def _ingest(connection: Connection, body: CaseBatchIn, document: bool) -> list[list[Any]]:
    doc = body.results_json() if document else None
    if document:
        assert doc is not None
    pending = batch.DeferredHits().begin()
    with connection.begin_nested():
        updates = batch.ingest_case_batch(
            connection, body.build_id, body.worker_id, body.entries(light=doc is not None), pending, results_json=doc
        )
    pending.commit()
    return [[None if u is None else (u.is_new, u.minimised) for u in case] for case in updates]


def _rows(connection: Connection, build_id: int) -> list[tuple[Any, ...]]:
    columns = [getattr(Result, c) for c in COMPARED]
    return [tuple(r) for r in connection.execute(
        select(*columns).where(Result.build_id == build_id).order_by(Result.case_id, Result.backend, Result.variant, Result.phase)
    )]


def _builds(connection: Connection) -> tuple[int, int, int]:
    store = SqlStore(connection)
    rows_build = store.register_build(BuildFingerprint(torch="2.13.0", device_name="rows"))
    doc_build = store.register_build(BuildFingerprint(torch="2.13.0", device_name="document"))
    worker = store.register_worker(doc_build, "node-1", 7, "cuda:0")
    return rows_build, doc_build, worker


def test_the_document_path_stores_the_rows_and_answers_the_rows_path_does(connection: Connection) -> None:
    rows_build, doc_build, worker = _builds(connection)
    cases = [AttentionCase(seqlen_q=4, seqlen_k=4 + i, num_heads=2, head_dim=8, dtype="float32") for i in range(3)]

    by_rows = _ingest(connection, _body(rows_build, worker, cases), document=False)
    by_document = _ingest(connection, _body(doc_build, worker, cases), document=True)
    stored_rows, stored_document = _rows(connection, rows_build), _rows(connection, doc_build)
    assert len(stored_document) == 3 * 7  # 9 results a case, two keys sent twice
    assert stored_document == stored_rows
    # the buckets were created by the rows path: the document path counts into them, same places
    assert [[u is not None for u in case] for case in by_document] == [[u is not None for u in case] for case in by_rows]
    assert by_document[0][2] == (False, False)

    # retried (the answer was lost): nothing stored twice, the failures answered from the stored rows
    again = _ingest(connection, _body(doc_build, worker, cases), document=True)
    assert _rows(connection, doc_build) == stored_document
    assert [[u is not None for u in case] for case in again] == [[u is not None for u in case] for case in by_document]


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda rs: rs[1].update(detail="x" * (MAX_DETAIL + 1)), "detail over its column: CaseResult cuts it"),
        (lambda rs: rs[0].update(selected_kernel="k" * (MAX_PACKAGE + 1)), "selected_kernel over its column"),
        (lambda rs: rs[2].update(error_ratio=math.inf), "a non-finite float"),
        (lambda rs: rs[0]["metrics"]["out"].update(rel_l2=math.nan), "a non-finite float in the metrics"),
    ],
)
def test_a_result_the_document_cannot_carry_as_the_rows_path_stores_it_takes_the_rows_path(
    connection: Connection, edit: Any, why: str
) -> None:
    rows_build, doc_build, worker = _builds(connection)
    case = AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=2, head_dim=8, dtype="float32")
    assert _body(doc_build, worker, [case], edit).results_json() is None, why
    assert _body(doc_build, worker, [case]).results_json() is not None


def test_text_that_only_looks_non_finite_keeps_the_document_path(connection: Connection) -> None:
    rows_build, doc_build, worker = _builds(connection)
    case = AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=2, head_dim=8, dtype="float32")

    def edit(rs: list[dict[str, Any]]) -> None:
        rs[1]["detail"] = "NaNs: Infinity"
        rs[3]["detail"] = "saw NaN"

    body = _body(doc_build, worker, [case], edit)
    _ingest(connection, _body(rows_build, worker, [case], edit), document=False)
    doc = body.results_json()
    assert doc is not None  # the words NaN and Infinity in a detail are no non-finite float
    pending = batch.DeferredHits().begin()
    batch.ingest_case_batch(connection, doc_build, worker, body.entries(light=doc is not None), pending, results_json=doc)
    assert _rows(connection, doc_build) == _rows(connection, rows_build)


def test_the_route_writes_from_the_document_on_postgresql(postgres_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.db import migrations
    from service.db.engine import make_engine
    from service.settings import Settings

    calls: list[int] = []
    real = batch._insert_results_document

    def counted(connection: Connection, document: str, *args: Any) -> Any:
        calls.append(len(document))
        return real(connection, document, *args)

    monkeypatch.setattr(batch, "_insert_results_document", counted)
    url = postgres_server.new_schema_url()  # its own schema: this test commits
    try:
        migrations.upgrade(url)
        engine = make_engine(url)
        build_id = SqlStore(engine).register_build(BuildFingerprint(torch="2.13.0", device_name="route"))
        app = create_app(Settings(database_url=url, api_token=None, read_requires_token=False, writer_token="t"))
        case = AttentionCase(seqlen_q=4, seqlen_k=9, num_heads=2, head_dim=8, dtype="float32")
        body = {"build_id": build_id, "worker_id": None,
                "cases": [{"case": case.to_json(), "origin": "fuzz", "results": _results(case)}]}
        with TestClient(app) as client:
            answer = client.post("/api/case-results", json=body, headers={"Authorization": "Bearer t"})
        assert answer.status_code == 200, answer.text
        assert [[u is not None for u in case] for case in answer.json()["updates"]] == [
            [False, False, True, True, False, False, True, False, False]  # a failure sent after a pass of its key: not stored
        ]
        assert len(calls) == 1 and calls[0] > 0
        with engine.connect() as c:
            stored = c.execute(select(Result.backend, Result.variant, Result.status).where(Result.case_id == case.case_id)
                               .order_by(Result.backend, Result.variant, Result.phase)).all()
        engine.dispose()
    finally:
        postgres_server.drop_schema_of(url)
    assert [tuple(r) for r in stored] == [
        ("fa2", "fwd", "unsupported"), ("fa4", "bwd", "fail"), ("fa4", "fwd", "error"), ("sdpa", "fwd", "pass"),
        ("sdpa", "fwd", "pass"), ("te-fused", "fwd", "pass"), ("te-unfused", "fwd", "fail"),
    ]


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": [1, 2.5, -0.0, 1e308, 12345678901234567890123, true, false, null, "x\\"y", "\\u00e9"]}',
        '{"\u00e9\u4e2d": "\u00e9\u4e2d", "n": NaN, "i": Infinity, "m": -Infinity}'.encode(),
        b'{"dup": 1, "dup": 2}',
        b'{"lone": "\\ud800"}',  # a lone surrogate: the standard parser's value, which the app then refuses
        b"null",
        b'[1, 2',  # invalid: the standard parser's error
    ],
)
def test_the_fast_json_request_parses_as_the_standard_library_does(body: bytes) -> None:
    import asyncio
    import json

    from service.api.deps import FastJSONRequest

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    request = FastJSONRequest({"type": "http", "method": "POST", "headers": []}, receive)
    try:
        expected: Any = json.loads(body)
    except json.JSONDecodeError as exc:
        with pytest.raises(json.JSONDecodeError) as raised:
            asyncio.run(request.json())
        assert (raised.value.msg, raised.value.pos) == (exc.msg, exc.pos)
        return
    got = asyncio.run(request.json())
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    if isinstance(expected, dict) and "a" in expected:
        assert [type(v) for v in got["a"]] == [type(v) for v in expected["a"]]
