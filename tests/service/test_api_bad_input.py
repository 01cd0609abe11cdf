"""Bad input that used to answer 500 (found by schemathesis in tests/reliability/test_bad_input.py,
and by hand on PostgreSQL): each test sends one offending request and expects 422 with ``loc``
naming the field and a message that says what is allowed, and nothing stored."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fuzzer.results import ResultValidationError
from oracle.config import AttentionCase
from service.api.app import create_app
from service.db.models import MAX_SQL_BIGINT, MAX_SQL_INTEGER, Bucket, Build, Case, Result, Worker
from service.api.requests import MAX_METRICS_DEPTH
from service.settings import Settings
from tests.service.conftest import Seeded

TOO_BIG_ID = MAX_SQL_INTEGER + 1
HUGE = 2**64  # what schemathesis sent: "Python int too large to convert to SQLite INTEGER"


def _error(response, loc: list) -> str:
    """The message of the 422 error at ``loc``."""
    assert response.status_code == 422, response.text
    errors = {tuple(e["loc"]): e["msg"] for e in response.json()["detail"]}
    assert tuple(loc) in errors, errors
    return errors[tuple(loc)]


def _counts(session: Session) -> tuple[int, ...]:
    return tuple(session.scalar(select(func.count()).select_from(t)) for t in (Build, Worker, Case, Result, Bucket))


def _result(seeded: Seeded, **fields: object) -> dict:
    return {"case_id": seeded.case.case_id, "backend": "fa2", "variant": "v", "status": "pass", **fields}


# --------------------------------------------------------------------- integers beyond SQL's
@pytest.mark.parametrize(
    ("path", "name", "value", "bound"),
    [
        ("/api/buckets", "build_id", HUGE, MAX_SQL_INTEGER),
        ("/api/buckets", "head_dim", HUGE, MAX_SQL_INTEGER),
        ("/api/buckets", "offset", MAX_SQL_BIGINT + 1, MAX_SQL_BIGINT),
        ("/api/builds", "offset", HUGE, MAX_SQL_BIGINT),
        ("/api/workers", "offset", HUGE, MAX_SQL_BIGINT),
        ("/api/buckets/1/results", "offset", HUGE, MAX_SQL_BIGINT),
    ],
)
def test_an_integer_query_parameter_beyond_sql_is_422_naming_the_bound(
    client: TestClient, path: str, name: str, value: int, bound: int
) -> None:
    message = _error(client.get(path, params={name: value}), ["query", name])
    assert f"less than or equal to {bound}" in message


@pytest.mark.parametrize("path", ["/api/buckets", "/api/builds", "/api/workers"])
def test_the_largest_offset_answers_an_empty_page(client: TestClient, seeded: Seeded, path: str) -> None:
    response = client.get(path, params={"offset": MAX_SQL_BIGINT})
    assert response.status_code == 200, response.text
    assert response.json()["items"] == [] and response.json()["offset"] == MAX_SQL_BIGINT


def test_the_largest_id_is_looked_up_and_not_found(client: TestClient, seeded: Seeded) -> None:
    assert client.get(f"/api/buckets/{MAX_SQL_INTEGER}").status_code == 404
    assert client.get("/api/buckets", params={"build_id": MAX_SQL_INTEGER}).json()["items"] == []


@pytest.mark.parametrize(
    ("method", "path", "name", "body"),
    [
        ("GET", "/api/buckets/{}", "bucket_id", None),
        ("GET", "/api/buckets/{}/results", "bucket_id", None),
        ("GET", "/api/buckets/{}/repro.py", "bucket_id", None),
        ("PATCH", "/api/buckets/{}", "bucket_id", {"notes": "x"}),
        ("POST", "/api/buckets/{}/minimised", "bucket_id", {"case": {}, "original_case_id": "0" * 16}),
        ("GET", "/api/builds/{}", "build_id", None),
        ("POST", "/api/workers/{}/heartbeat", "worker_id", {"cases_run": 1}),
        ("GET", "/api/matrix/bisections/{}", "run_id", None),
    ],
)
def test_an_id_path_parameter_beyond_sql_is_422(
    client: TestClient, session: Session, method: str, path: str, name: str, body: dict | None
) -> None:
    before = _counts(session)
    message = _error(client.request(method, path.format(HUGE), json=body), ["path", name])
    assert f"less than or equal to {MAX_SQL_INTEGER}" in message
    assert _counts(session) == before


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        ("/api/workers", {"build_id": HUGE, "hostname": "h", "pid": 1, "device": "cpu"}, ["body", "build_id"]),
        ("/api/results", {"build_id": TOO_BIG_ID, "results": []}, ["body", "build_id"]),
        ("/api/results", {"build_id": 1, "worker_id": HUGE, "results": []}, ["body", "worker_id"]),
    ],
)
def test_an_id_in_a_body_beyond_sql_is_422(client: TestClient, session: Session, path: str, body: dict, loc: list) -> None:
    before = _counts(session)
    assert f"less than or equal to {MAX_SQL_INTEGER}" in _error(client.post(path, json=body), loc)
    assert _counts(session) == before


def test_a_duplicate_target_beyond_sql_is_422(client: TestClient, seeded: Seeded) -> None:
    response = client.patch(f"/api/buckets/{seeded.nan_bucket_id}", json={"triage_state": "duplicate", "duplicate_of_id": HUGE})
    assert f"less than or equal to {MAX_SQL_INTEGER}" in _error(response, ["body", "duplicate_of_id"])


@pytest.mark.parametrize("name", ["seqlen_q", "batch_size", "num_heads"])
def test_a_case_size_beyond_its_integer_column_is_422(client: TestClient, session: Session, name: str) -> None:
    case = AttentionCase(seqlen_q=3, seqlen_k=5, head_dim=16, dtype="float32").to_json()
    case.update({name: TOO_BIG_ID, "num_heads_kv": 1})
    before = _counts(session)
    message = _error(client.post("/api/cases", json={"case": case}), ["body", "case", name])
    bound = MAX_SQL_INTEGER if name == "seqlen_q" else 65535  # batch_size, num_heads: the CUDA grid (oracle.config)
    assert message == f"{name}: out of range: {TOO_BIG_ID} (allowed: 1 <= {name} <= {bound})"
    assert _counts(session) == before


def test_a_minimised_case_beyond_its_integer_column_is_422(client: TestClient, session: Session, seeded: Seeded) -> None:
    case = {**seeded.minimised_case.to_json(), "seqlen_k": HUGE}
    body = {"case": case, "original_case_id": seeded.case.case_id}
    before = _counts(session)
    assert "1 <= seqlen_k <= 2147483647" in _error(
        client.post(f"/api/buckets/{seeded.crash_bucket_id}/minimised", json=body), ["body", "case", "seqlen_k"]
    )
    assert _counts(session) == before


# ------------------------------------------------------------------------- result validation
@pytest.mark.parametrize("status", ["fail", "error", "crash", "timeout", "oom"])
def test_a_failing_result_without_a_signature_is_422(client: TestClient, session: Session, seeded: Seeded, status: str) -> None:
    before = _counts(session)
    body = {"build_id": seeded.build_id, "results": [_result(seeded, status=status)]}  # no "signature" key at all
    message = _error(client.post("/api/results", json=body), ["body", "results", 0, "signature"])
    assert f"required for status '{status}'" in message
    assert _counts(session) == before


def test_an_unknown_result_status_is_422_listing_the_allowed_ones(client: TestClient, seeded: Seeded) -> None:
    body = {"build_id": seeded.build_id, "results": [_result(seeded, status="exploded")]}
    message = _error(client.post("/api/results", json=body), ["body", "results", 0, "status"])
    assert "'pass', 'fail', 'unsupported', 'error', 'crash', 'timeout' or 'oom'" in message


def test_metrics_nested_too_deep_are_422(client: TestClient, session: Session, seeded: Seeded) -> None:
    metrics: dict = {}
    inner = metrics
    for _ in range(MAX_METRICS_DEPTH):  # one level more than allowed (storing them used to recurse: 500)
        inner["a"] = {}
        inner = inner["a"]
    before = _counts(session)
    body = {"build_id": seeded.build_id, "results": [_result(seeded, metrics=metrics)]}
    message = _error(client.post("/api/results", json=body), ["body", "results", 0, "metrics"])
    assert f"nested deeper than {MAX_METRICS_DEPTH} levels" in message
    assert _counts(session) == before


def test_a_result_validation_error_escaping_a_route_is_422_naming_the_field(tmp_path) -> None:
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}", api_token=None, read_requires_token=False))

    @app.post("/boom")
    def boom() -> None:
        raise ResultValidationError("signature: required for status 'oom'")

    with TestClient(app) as client:
        response = client.post("/boom")
    assert response.status_code == 422
    assert response.json()["detail"] == [
        {"loc": ["body", "signature"], "msg": "signature: required for status 'oom'", "type": "value_error"}
    ]


# ------------------------------------------------------------------ text no database can hold
def test_a_nul_character_in_a_query_parameter_is_422(client: TestClient, seeded: Seeded) -> None:
    message = _error(client.get("/api/buckets", params={"signature": "out\x00"}), ["query", "signature"])
    assert message == "Value error, must not contain the NUL character (\\x00)"


def test_a_nul_character_in_a_body_field_is_422(client: TestClient, session: Session) -> None:
    before = _counts(session)
    message = _error(client.post("/api/builds", json={"torch": "2.13.0\x00"}), ["body", "torch"])
    assert "NUL character" in message
    assert _counts(session) == before


def test_a_nul_character_in_a_metrics_key_names_the_nested_field(client: TestClient, session: Session, seeded: Seeded) -> None:
    before = _counts(session)
    body = {"build_id": seeded.build_id, "results": [_result(seeded, metrics={"out": {"a\x00b": 1.0}})]}
    response = client.post("/api/results", json=body)
    assert "NUL character" in _error(response, ["body", "results", 0, "metrics", "out", "a\\x00b"])
    assert _counts(session) == before


def test_a_nul_character_in_the_triage_form_is_422(client: TestClient, seeded: Seeded) -> None:
    response = client.post(
        f"/buckets/{seeded.nan_bucket_id}/triage",
        content="notes=a%00b",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert "NUL character" in _error(response, ["body", "notes"])


def test_a_lone_surrogate_in_a_body_field_is_422(client: TestClient, session: Session, seeded: Seeded) -> None:
    body = json.dumps({"notes": "\ud800"})  # ensure_ascii: the escape "\\ud800", which json.loads accepts
    before = session.scalar(select(Bucket.notes).where(Bucket.id == seeded.nan_bucket_id))
    response = client.patch(
        f"/api/buckets/{seeded.nan_bucket_id}", content=body, headers={"content-type": "application/json"}
    )
    assert _error(response, ["body", "notes"]) == "Value error, must not contain a lone surrogate (\\ud800): not valid Unicode"
    assert session.scalar(select(Bucket.notes).where(Bucket.id == seeded.nan_bucket_id)) == before


# ------------------------------------------------------------------------- other bad values
def test_an_unparsable_upstream_url_is_422(client: TestClient, seeded: Seeded) -> None:
    response = client.patch(f"/api/buckets/{seeded.nan_bucket_id}", json={"upstream_url": "http://[::1"})
    assert "must be an http(s) URL" in _error(response, ["body", "upstream_url"])


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("triage_state", "'new', 'confirmed', 'reported', 'fixed', 'wontfix' or 'duplicate'"),
        ("mask", "'none', "),
        ("sort", "'-last_seen'"),
    ],
)
def test_an_unknown_enum_value_in_a_query_is_422_listing_the_allowed_values(
    client: TestClient, name: str, allowed: str
) -> None:
    assert allowed in _error(client.get("/api/buckets", params={name: "bogus"}), ["query", name])
