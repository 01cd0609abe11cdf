"""The JSON API: filters, pagination, 404 and 422, triage with and without a token."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Bucket, TriageState
from tests.service.conftest import NAN_METRICS, Seeded

TOKEN = "s3cret-token"
WRITER = "writer-token-for-tests"


def _ids(response) -> list[int]:
    assert response.status_code == 200, response.text
    return [b["id"] for b in response.json()["items"]]


def _error_locations(response) -> list[list]:
    assert response.status_code == 422, response.text
    return [e["loc"] for e in response.json()["detail"]]


# ------------------------------------------------------------------------------- GET buckets
def test_list_buckets_returns_every_bucket_with_the_total(client: TestClient, seeded: Seeded) -> None:
    body = client.get("/api/buckets").json()
    assert body["total"] == 3
    assert {b["id"] for b in body["items"]} == {seeded.nan_bucket_id, seeded.crash_bucket_id, seeded.fa4_bucket_id}
    nan = next(b for b in body["items"] if b["id"] == seeded.nan_bucket_id)
    assert (nan["backend"], nan["variant"], nan["signature"], nan["hit_count"]) == ("sdpa", "default", "out:nan", 3)
    assert nan["minimised_case_id"] == seeded.minimised_case.case_id
    assert nan["triage_state"] == "new"


def test_list_buckets_filters_by_backend_signature_and_triage_state(
    client: TestClient, seeded: Seeded, session: Session
) -> None:
    assert _ids(client.get("/api/buckets", params={"backend": "fa2"})) == [seeded.crash_bucket_id]
    assert _ids(client.get("/api/buckets", params={"signature": "mismatch"})) == [seeded.fa4_bucket_id]
    assert _ids(client.get("/api/buckets", params={"signature": "%"})) == [], "LIKE wildcards are literal"
    session.get(Bucket, seeded.crash_bucket_id).triage_state = TriageState.confirmed
    session.flush()
    assert _ids(client.get("/api/buckets", params={"triage_state": "confirmed"})) == [seeded.crash_bucket_id]
    assert client.get("/api/buckets", params={"backend": "sdpa", "triage_state": "confirmed"}).json()["total"] == 0


def test_list_buckets_sorts_and_pages_without_overlap(client: TestClient, seeded: Seeded) -> None:
    by_hits = _ids(client.get("/api/buckets", params={"sort": "-hit_count"}))
    assert by_hits[0] == seeded.nan_bucket_id
    pages = [client.get("/api/buckets", params={"sort": "id", "limit": 2, "offset": o}).json() for o in (0, 2, 4)]
    assert [len(p["items"]) for p in pages] == [2, 1, 0]
    assert all(p["total"] == 3 for p in pages)
    assert [b["id"] for p in pages for b in p["items"]] == sorted(
        [seeded.nan_bucket_id, seeded.crash_bucket_id, seeded.fa4_bucket_id]
    )
    assert (pages[1]["limit"], pages[1]["offset"]) == (2, 2)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 10_000}, "limit"),
        ({"offset": -1}, "offset"),
        ({"sort": "signature; drop table"}, "sort"),
        ({"triage_state": "maybe"}, "triage_state"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_list_buckets_rejects_bad_parameters_naming_them(client: TestClient, params: dict, field: str) -> None:
    assert ["query", field] in _error_locations(client.get("/api/buckets", params=params))


def test_get_bucket_returns_cases_metrics_and_results(client: TestClient, seeded: Seeded) -> None:
    body = client.get(f"/api/buckets/{seeded.nan_bucket_id}").json()
    assert body["first_case"]["case_id"] == seeded.case.case_id
    assert body["minimised_case"]["case_id"] == seeded.minimised_case.case_id
    assert body["minimised_case"]["description"] == seeded.minimised_case.describe()
    assert body["minimise_note"] == "shrunk in 41 steps"
    assert body["failing_result"]["case_id"] == seeded.minimised_case.case_id
    assert body["failing_result"]["metrics"] == NAN_METRICS
    assert body["result_count"] == 3
    assert {r["case_id"] for r in body["results"]} == {
        seeded.case.case_id,
        seeded.other_case.case_id,
        seeded.minimised_case.case_id,
    }
    assert {r["build"]["torch"] for r in body["results"]} == {"2.13.0", "2.14.0"}
    assert body["last_build"]["torch"] == "2.13.0", "the shrink run on build 2.13 came last"


def test_unknown_bucket_is_404_and_a_non_integer_id_is_422(client: TestClient) -> None:
    assert client.get("/api/buckets/987654").status_code == 404
    assert client.patch("/api/buckets/987654", json={"notes": "x"}).status_code == 404
    assert ["path", "bucket_id"] in _error_locations(client.get("/api/buckets/abc"))


# --------------------------------------------------------------------------------- GET cases
def test_get_case_returns_its_json_description_and_every_result(client: TestClient, seeded: Seeded) -> None:
    body = client.get(f"/api/cases/{seeded.case.case_id}").json()
    assert body["config"] == seeded.case.to_json()
    assert body["description"] == seeded.case.describe()
    assert body["origin"] == "fuzz"
    by_backend = {r["backend"]: r for r in body["results"]}
    assert set(by_backend) == {"sdpa", "fa2", "te"}
    assert by_backend["fa2"]["status"] == "crash"
    assert by_backend["fa2"]["bucket_id"] == seeded.crash_bucket_id
    assert by_backend["te"]["bucket_id"] is None
    assert by_backend["sdpa"]["build"]["device_name"] == "NVIDIA H200"


def test_unknown_case_is_404_and_a_malformed_id_is_422(client: TestClient) -> None:
    assert client.get("/api/cases/0000000000000000").status_code == 404
    assert ["path", "case_id"] in _error_locations(client.get("/api/cases/not-a-case-id"))


# ------------------------------------------------------------------------------ GET overview
def test_overview_counts_results_buckets_and_workers(client: TestClient, seeded: Seeded) -> None:
    body = client.get("/api/overview").json()
    assert body["case_count"] == 3
    assert body["result_count"] == 7
    assert body["results_by_status"] == {"crash": 1, "fail": 4, "pass": 1, "unsupported": 1}
    assert body["results_by_backend"]["te"] == {"pass": 1, "unsupported": 1}
    assert body["buckets_by_backend"] == {"fa2": 1, "fa4": 1, "sdpa": 1}
    assert body["buckets_by_triage_state"] == {"new": 3}
    assert [w["hostname"] for w in body["live_workers"]] == ["gpu-host-1"]
    assert len(body["cases_per_hour"]) == 24
    assert sum(h["results"] for h in body["cases_per_hour"]) == 7


# ----------------------------------------------------------------------------------- triage
def test_triage_without_a_configured_token_is_open_and_persists(client: TestClient, seeded: Seeded) -> None:
    update = {"triage_state": "reported", "upstream_url": "https://github.com/pytorch/pytorch/issues/1", "notes": "hi"}
    response = client.patch(f"/api/buckets/{seeded.nan_bucket_id}", json=update)
    assert response.status_code == 200, response.text
    assert {k: response.json()[k] for k in update} == update
    stored = client.get(f"/api/buckets/{seeded.nan_bucket_id}").json()
    assert {k: stored[k] for k in update} == update


def test_triage_sends_only_the_fields_given_and_null_clears(client: TestClient, seeded: Seeded) -> None:
    url = f"/api/buckets/{seeded.nan_bucket_id}"
    client.patch(url, json={"notes": "first", "upstream_url": "https://example.org/bug"})
    body = client.patch(url, json={"triage_state": "confirmed"}).json()
    assert (body["triage_state"], body["notes"], body["upstream_url"]) == (
        "confirmed",
        "first",
        "https://example.org/bug",
    )
    body = client.patch(url, json={"upstream_url": None}).json()
    assert (body["triage_state"], body["upstream_url"]) == ("confirmed", None)


def test_marking_a_duplicate_needs_another_existing_bucket(client: TestClient, seeded: Seeded) -> None:
    url = f"/api/buckets/{seeded.fa4_bucket_id}"
    assert ["body", "duplicate_of_id"] in _error_locations(client.patch(url, json={"triage_state": "duplicate"}))
    itself = {"triage_state": "duplicate", "duplicate_of_id": seeded.fa4_bucket_id}
    assert ["body", "duplicate_of_id"] in _error_locations(client.patch(url, json=itself))
    unknown = {"triage_state": "duplicate", "duplicate_of_id": 987654}
    assert ["body", "duplicate_of_id"] in _error_locations(client.patch(url, json=unknown))
    ok = client.patch(url, json={"triage_state": "duplicate", "duplicate_of_id": seeded.nan_bucket_id})
    assert ok.json()["duplicate_of_id"] == seeded.nan_bucket_id
    back = client.patch(url, json={"triage_state": "confirmed"}).json()
    assert (back["triage_state"], back["duplicate_of_id"]) == ("confirmed", None)


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"triage_state": "solved"}, "triage_state"),
        ({"triage_state": None}, "triage_state"),
        ({"upstream_url": "javascript:alert(1)"}, "upstream_url"),
        ({"duplicate_of_id": 0}, "duplicate_of_id"),
        ({"duplicate_of_id": 1}, "duplicate_of_id"),
        ({"hit_count": 0}, "hit_count"),
    ],
)
def test_triage_rejects_bad_input_naming_the_field(
    client: TestClient, seeded: Seeded, update: dict, field: str
) -> None:
    response = client.patch(f"/api/buckets/{seeded.crash_bucket_id}", json=update)
    assert ["body", field] in _error_locations(response)
    assert client.get(f"/api/buckets/{seeded.crash_bucket_id}").json()["triage_state"] == "new"


def test_triage_needs_the_bearer_token_when_one_is_configured(
    make_client: Callable[..., TestClient], seeded: Seeded
) -> None:
    client = make_client(api_token=TOKEN)
    url = f"/api/buckets/{seeded.nan_bucket_id}"
    missing = client.patch(url, json={"triage_state": "fixed"})
    wrong = client.patch(url, json={"triage_state": "fixed"}, headers={"Authorization": "Bearer nope"})
    basic = client.patch(url, json={"triage_state": "fixed"}, headers={"Authorization": f"Basic {TOKEN}"})
    assert [r.status_code for r in (missing, wrong, basic)] == [401, 401, 401]
    assert missing.headers["www-authenticate"] == "Bearer"
    assert client.get(url).json()["triage_state"] == "new", "reads stay open and nothing changed"
    ok = client.patch(url, json={"triage_state": "fixed"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200, ok.text
    assert client.get(url).json()["triage_state"] == "fixed"


def _stored_triage(session: Session, bucket_id: int) -> tuple:
    """The bucket's triage columns as the database holds them (not through the API)."""
    columns = (Bucket.triage_state, Bucket.notes, Bucket.upstream_url, Bucket.duplicate_of_id)
    return tuple(session.execute(select(*columns).where(Bucket.id == bucket_id)).one())


def test_with_the_writer_token_alone_triage_is_closed_and_changes_nothing(
    make_client: Callable[..., TestClient], seeded: Seeded, session: Session
) -> None:
    """A service protected for a fleet (``ATTNFUZZ_WRITER_TOKEN``, no API token): triage is 401
    whatever is sent, the writer token included, and says that it needs ATTNFUZZ_API_TOKEN."""
    client = make_client(writer_token=WRITER)
    url = f"/api/buckets/{seeded.nan_bucket_id}"
    before = _stored_triage(session, seeded.nan_bucket_id)
    update = {"triage_state": "wontfix", "notes": "closed by anyone", "upstream_url": "https://example.org/x"}
    for headers in ({}, {"Authorization": f"Bearer {WRITER}"}, {"Authorization": "Bearer anything"}):
        response = client.patch(url, json=update, headers=headers)
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        detail = response.json()["detail"][0]["msg"]
        assert "triage needs ATTNFUZZ_API_TOKEN to be set on the service" in detail, detail
        assert "ATTNFUZZ_WRITER_TOKEN" in detail and WRITER not in detail
        assert _stored_triage(session, seeded.nan_bucket_id) == before
    assert client.get(url).status_code == 200, "reads stay open"


@pytest.mark.parametrize(
    ("tokens", "headers", "code"),
    [
        ({}, {}, 200),  # no token at all: open, as before
        ({"api_token": TOKEN}, {"Authorization": f"Bearer {TOKEN}"}, 200),
        ({"api_token": TOKEN, "writer_token": WRITER}, {"Authorization": f"Bearer {TOKEN}"}, 200),
        ({"api_token": TOKEN, "writer_token": WRITER}, {"Authorization": f"Bearer {WRITER}"}, 401),
        ({"api_token": TOKEN, "writer_token": WRITER}, {}, 401),
        ({"writer_token": WRITER}, {}, 401),
        ({"writer_token": WRITER}, {"Authorization": f"Bearer {WRITER}"}, 401),
    ],
    ids=["none-open", "api", "both-api", "both-writer", "both-none", "writer-alone-none", "writer-alone-writer"],
)
def test_triage_takes_the_api_token_only_and_is_open_only_without_any_token(
    make_client: Callable[..., TestClient], seeded: Seeded, session: Session, tokens: dict, headers: dict, code: int
) -> None:
    client = make_client(**tokens)
    before = _stored_triage(session, seeded.crash_bucket_id)
    response = client.patch(f"/api/buckets/{seeded.crash_bucket_id}", json={"triage_state": "confirmed", "notes": "n"}, headers=headers)
    assert response.status_code == code, response.text
    after = _stored_triage(session, seeded.crash_bucket_id)
    assert after == ((TriageState.confirmed, "n", None, None) if code == 200 else before)


def test_reads_need_the_token_when_read_requires_token(make_client: Callable[..., TestClient], seeded: Seeded) -> None:
    client = make_client(api_token=TOKEN, read_requires_token=True)
    for path in ("/api/overview", "/api/buckets", f"/buckets/{seeded.nan_bucket_id}", "/"):
        assert client.get(path).status_code == 401, path
    authorised = client.get("/api/overview", headers={"Authorization": f"Bearer {TOKEN}"})
    assert authorised.status_code == 200
    assert authorised.json()["case_count"] == 3


def test_triage_with_the_writer_token_says_that_it_never_triages(
    make_client: Callable[..., TestClient], seeded: Seeded
) -> None:
    """With both tokens set, the writer token on a triage write is named as such (not only "wrong")."""
    client = make_client(api_token=TOKEN, writer_token=WRITER)
    url = f"/api/buckets/{seeded.crash_bucket_id}"
    by_writer = client.patch(url, json={"notes": "n"}, headers={"Authorization": f"Bearer {WRITER}"})
    assert by_writer.status_code == 401
    detail = by_writer.json()["detail"][0]["msg"]
    assert "never triages" in detail and "ATTNFUZZ_API_TOKEN" in detail and WRITER not in detail, detail
    wrong = client.patch(url, json={"notes": "n"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "ATTNFUZZ_API_TOKEN" in wrong.json()["detail"][0]["msg"]
    assert "never triages" not in wrong.json()["detail"][0]["msg"]
