"""A result's metrics sent as JSON text (``metrics_json``, what `fuzzer.http_sink.HttpSink` sends):
stored as the same figures sent as objects would be, checked without being parsed where PostgreSQL
can parse them, refused with a 422 naming the result when they are no metrics (nothing of the batch
stored), and sent as objects again to a service from before the field. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fuzzer.http_sink import HttpSink, wire_result
from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.api.requests import MAX_METRICS_DEPTH, ResultIn, check_metrics_json
from service.db.models import Case, Result

TOKEN = "writer-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
METRICS = {  # figures of every JSON kind, a non-ASCII key, a number JSON keeps beyond float
    "out": {"name": "out", "passed": False, "signatures": ["out:mismatch"], "rel_l2": 0.0031, "max_abs": 1.25,
            "error_ratio": 7.5, "worst_index": [0, 3, 1, 17], "nan_count": 0, "is_all_zero": False, "note": None},
    "lse": {"name": "lse", "passed": True, "rel_l2": 1e-300, "error_ratio": 1.7976931348623157e308, "h\u00e9": "\u4e2d"},
}


def _case(seed: int) -> AttentionCase:
    return AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=2, head_dim=8, dtype="float32", seed=seed)


def _results(case: AttentionCase, metrics: dict[str, Any]) -> list[CaseResult]:
    return [
        CaseResult(case.case_id, "sdpa", "fwd", "pass", metrics=metrics, error_ratio=0.5),
        CaseResult(case.case_id, "eager", "fwd", "fail", signature="out:mismatch", error_ratio=7.5, metrics=metrics),
        CaseResult(case.case_id, "fa2", "fwd", "unsupported", detail="head_dim 8 not in (64, 128)"),
    ]


def _payload(case: AttentionCase, results: list[CaseResult], build_id: int) -> dict[str, Any]:
    return {"case_json": case.to_json(), "origin": "fuzz", "results": [r.to_json() for r in results],
            "build_id": build_id, "worker_id": None}


def _stored_metrics(session: Session, case: AttentionCase) -> dict[str, Any]:
    rows = session.execute(select(Result.backend, Result.metrics).where(Result.case_id == case.case_id)).all()
    return {backend: metrics for backend, metrics in rows}


@pytest.mark.parametrize("name, metrics", [
    ("figures of every kind", METRICS),
    ("a non-finite figure (the rows path: JSON cannot spell it for jsonb)", {"out": {"rel_l2": math.nan, "max_abs": math.inf}}),
    ("an escape the check parses", {"out": {"note": "tab\there \u0001"}}),
])
def test_metrics_sent_as_text_are_stored_as_the_same_metrics_sent_as_objects(
    make_client: Callable[..., TestClient], session: Session, name: str, metrics: dict[str, Any]
) -> None:
    client = make_client(writer_token=TOKEN)
    as_text = HttpSink("http://testserver", TOKEN, client=client)
    build_id = as_text.register_build(BuildFingerprint(torch="2.13.0"))
    sent: list[dict[str, Any]] = []
    for seed, form in ((1, "text"), (2, "objects")):
        case = _case(seed)
        payload = _payload(case, _results(case, metrics), build_id)
        if form == "text":
            assert "metrics_json" in wire_result(payload["results"][0]) and as_text.metrics_as_text
            as_text.record_batch([payload])
        else:
            body = {"build_id": build_id, "worker_id": None,
                    "cases": [{"case": payload["case_json"], "origin": "fuzz", "results": payload["results"]}]}
            answer = client.post("/api/case-results", content=json.dumps(body, allow_nan=True), headers=AUTH)
            assert answer.status_code == 200, answer.text
        sent.append(_stored_metrics(session, case))
    assert as_text.metrics_as_text  # the service took the text form
    assert sent[0] == sent[1], name
    assert sent[0]["fa2"] == {}
    if name == "figures of every kind":
        assert sent[0]["sdpa"]["out"] == METRICS["out"] and sent[0]["sdpa"]["lse"]["h\u00e9"] == "\u4e2d"


def _post_one(client: TestClient, build_id: int, result: dict[str, Any]) -> httpx.Response:
    case = _case(7)
    body = {"build_id": build_id, "worker_id": None,
            "cases": [{"case": case.to_json(), "origin": "fuzz", "results": [{**result, "case_id": case.case_id}]}]}
    return client.post("/api/case-results", content=json.dumps(body), headers=AUTH)


def _deep(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


@pytest.mark.parametrize("metrics_json, message", [
    ('{"out": {"max_abs": }}', "not valid JSON"),  # passes the cheap check: the database (or the rows path) finds it
    ('{"out": 1} {"lse": 2}', "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('"text"', "must be a JSON object"),
    (_deep(MAX_METRICS_DEPTH + 1), f"nested deeper than {MAX_METRICS_DEPTH}"),
    ('{"out": {"note": "\\u0000"}}', "NUL"),
    ('{"out": {"note": "\\ud800"}}', "lone surrogate"),
])
def test_text_that_is_no_metrics_is_422_naming_the_result_and_nothing_is_stored(
    make_client: Callable[..., TestClient], session: Session, metrics_json: str, message: str
) -> None:
    client = make_client(writer_token=TOKEN)
    build_id = HttpSink("http://testserver", TOKEN, client=client).register_build(BuildFingerprint(torch="2.13.0"))
    result = {"backend": "sdpa", "variant": "fwd", "status": "pass", "metrics_json": metrics_json}
    answer = _post_one(client, build_id, result)
    assert answer.status_code == 422, answer.text
    error = answer.json()["detail"][0]
    assert error["loc"][-5:] == ["cases", 0, "results", 0, "metrics_json"], error
    assert message in error["msg"], error
    assert session.scalar(select(func.count()).select_from(Result)) == 0
    assert session.scalar(select(func.count()).select_from(Case)) == 0


def test_metrics_given_both_ways_are_refused(make_client: Callable[..., TestClient], session: Session) -> None:
    client = make_client(writer_token=TOKEN)
    build_id = HttpSink("http://testserver", TOKEN, client=client).register_build(BuildFingerprint(torch="2.13.0"))
    result = {"backend": "sdpa", "variant": "fwd", "status": "pass", "metrics": {"out": {}}, "metrics_json": "{}"}
    answer = _post_one(client, build_id, result)
    assert answer.status_code == 422 and "not both" in answer.text
    assert session.scalar(select(func.count()).select_from(Result)) == 0


def test_the_cheap_check_parses_only_what_the_database_could_not_take_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **k: (parsed.append(text), real(text, *a, **k))[1])
    plain = json.dumps(METRICS, ensure_ascii=False)
    assert check_metrics_json(plain) == plain and parsed == []  # a verdict's figures: not parsed here
    escaped = json.dumps(METRICS)  # \u escapes: parsed (a NUL or a lone surrogate may hide there)
    assert check_metrics_json(escaped) == escaped and parsed == [escaped]
    deep = _deep(MAX_METRICS_DEPTH)  # at the limit by its brackets: parsed, and taken
    assert check_metrics_json(deep) == deep
    assert ResultIn.model_validate({"case_id": "0" * 16, "backend": "sdpa", "variant": "fwd", "status": "pass",
                                    "metrics_json": plain}).to_case_result().metrics == METRICS


def test_a_service_from_before_metrics_json_gets_the_metrics_as_objects_from_then_on() -> None:
    bodies: list[dict[str, Any]] = []

    def old_service(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        for i, item in enumerate(body["cases"]):
            for j, r in enumerate(item["results"]):
                if "metrics_json" in r:  # extra="forbid", as every request model of the service
                    loc = ["body", "cases", i, "results", j, "metrics_json"]
                    return httpx.Response(422, json={"detail": [{"type": "extra_forbidden", "loc": loc, "msg": "Extra inputs are not permitted"}]})
        return httpx.Response(200, json={"updates": [[None] * len(item["results"]) for item in body["cases"]]})

    client = httpx.Client(base_url="http://old", transport=httpx.MockTransport(old_service))
    sink = HttpSink("http://old", TOKEN, client=client)
    case = _case(3)
    payload = _payload(case, _results(case, METRICS), 1)
    assert sink.record_batch([payload]) == [[None, None, None]]
    assert not sink.metrics_as_text and len(bodies) == 2
    assert bodies[1]["cases"][0]["results"][0]["metrics"] == METRICS
    sink.record_batch([payload])  # from then on: one request, the objects
    assert len(bodies) == 3 and "metrics_json" not in bodies[2]["cases"][0]["results"][0]


def test_another_422_about_the_text_is_not_taken_for_an_old_service() -> None:
    def refusing(request: httpx.Request) -> httpx.Response:
        loc = ["body", "cases", 0, "results", 0, "metrics_json"]
        return httpx.Response(422, json={"detail": [{"type": "value_error", "loc": loc, "msg": "not valid JSON"}]})

    from fuzzer.http_sink import ServiceRejectedError

    sink = HttpSink("http://new", TOKEN, client=httpx.Client(base_url="http://new", transport=httpx.MockTransport(refusing)))
    case = _case(4)
    with pytest.raises(ServiceRejectedError):
        sink.record_batch([_payload(case, _results(case, METRICS), 1)])
    assert sink.metrics_as_text and sink.requests == 1
