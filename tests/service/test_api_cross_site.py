"""Cross-site writes to ``serve`` are refused, with or without an API token (issue 38, red team:
a form POST with ``Origin: null`` to ``/buckets/1/triage`` on a default ``serve`` answered 303
and changed the bucket). Same-origin forms and clients that are not browsers (no ``Origin``:
httpx, curl, the workers) keep working."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from service.api.hardening import cross_site_reason
from service.db.models import Bucket

FORM = {"triage_state": "wontfix", "notes": "changed by another site"}
CROSS_SITE = [
    {"origin": "null"},
    {"origin": "https://attacker.example"},
    {"origin": "http://testserver:9999"},  # another port of this host: another site
    {"origin": "http://attacker.example", "referer": "http://testserver/buckets/1"},
    {"referer": "https://attacker.example/page.html"},
    {"sec-fetch-site": "cross-site"},
]


def _state(session: Session, bucket_id: int) -> tuple[str, str]:
    session.expire_all()
    bucket = session.get(Bucket, bucket_id)
    return bucket.triage_state.value, bucket.notes


@pytest.mark.parametrize("headers", CROSS_SITE, ids=lambda h: ",".join(f"{k}={v}" for k, v in h.items()))
@pytest.mark.parametrize("token", [None, "s3cret"], ids=["no-token", "token"])
def test_a_cross_site_triage_form_is_refused_with_403_and_changes_nothing(make_client, seeded, session, headers, token) -> None:
    client = make_client(api_token=token)
    before = _state(session, seeded.nan_bucket_id)
    auth = {} if token is None else {"authorization": f"Bearer {token}"}
    answer = client.post(f"/buckets/{seeded.nan_bucket_id}/triage", data=FORM, headers={**headers, **auth},
                         follow_redirects=False)
    assert answer.status_code == 403, (answer.status_code, answer.text)
    assert "cross-site request refused" in answer.text
    assert _state(session, seeded.nan_bucket_id) == before


@pytest.mark.parametrize("headers", CROSS_SITE[:2], ids=["null", "foreign"])
def test_cross_site_json_writes_and_logins_are_refused_too(make_client, seeded, session, headers) -> None:
    client = make_client()
    before = _state(session, seeded.nan_bucket_id)
    patched = client.patch(f"/api/buckets/{seeded.nan_bucket_id}", json={"triage_state": "wontfix"}, headers=headers)
    assert patched.status_code == 403, patched.text
    assert client.post("/login", data={"token": "x", "next": "/"}, headers=headers).status_code == 403
    assert _state(session, seeded.nan_bucket_id) == before
    assert client.get("/buckets", headers=headers).status_code == 200  # reads are not writes


@pytest.mark.parametrize(
    "headers",
    [
        {},  # httpx, curl: not a browser
        {"origin": "http://testserver"},
        {"origin": "http://testserver:80"},
        {"referer": "http://testserver/buckets/1"},
        {"sec-fetch-site": "same-origin", "origin": "http://testserver"},
    ],
    ids=["no-origin", "origin", "origin-default-port", "referer", "fetch-metadata"],
)
def test_same_origin_forms_and_non_browser_clients_still_triage(make_client, seeded, session, headers) -> None:
    client = make_client()
    answer = client.post(f"/buckets/{seeded.nan_bucket_id}/triage", data=FORM, headers=headers, follow_redirects=False)
    assert answer.status_code == 303, (answer.status_code, answer.text)
    assert _state(session, seeded.nan_bucket_id) == ("wontfix", "changed by another site")


def test_a_token_still_guards_writes_from_clients_without_an_origin(make_client, seeded, session) -> None:
    client = make_client(api_token="s3cret")
    assert client.patch(f"/api/buckets/{seeded.nan_bucket_id}", json={"notes": "x"}).status_code == 401
    ok = client.patch(f"/api/buckets/{seeded.nan_bucket_id}", json={"notes": "with the token"},
                      headers={"authorization": "Bearer s3cret"})
    assert ok.status_code == 200, ok.text
    assert _state(session, seeded.nan_bucket_id)[1] == "with the token"


def test_pages_ask_browsers_to_keep_the_origin_of_this_sites_forms(client) -> None:
    """Under ``Referrer-Policy: no-referrer`` browsers send a same-origin form's ``Origin`` as
    ``null``, which must be refused (a sandboxed frame of another site sends it too)."""
    assert client.get("/").headers["referrer-policy"] == "same-origin"


def test_allowed_origins_admits_the_origin_of_a_proxy(make_client, seeded, session) -> None:
    client = make_client(allowed_origins="https://dash.example, https://other.example/")
    headers = {"origin": "https://dash.example"}
    answer = client.post(f"/buckets/{seeded.nan_bucket_id}/triage", data=FORM, headers=headers, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    assert cross_site_reason("POST", {"host": "x", "origin": "https://other.example"}, "http",
                             frozenset({"https://other.example"})) is None


@pytest.mark.parametrize(
    ("headers", "scheme", "refused"),
    [
        ({"host": "127.0.0.1:8000", "origin": "http://127.0.0.1:8000"}, "http", False),
        ({"host": "LOCALHOST:8000", "origin": "http://localhost:8000"}, "http", False),
        ({"host": "dash.example", "origin": "https://dash.example"}, "http", False),  # TLS ended by a proxy
        ({"host": "127.0.0.1:8000", "origin": "http://127.0.0.1:8001"}, "http", True),
        ({"host": "127.0.0.1:8000", "origin": "http://127.0.0.1.attacker.example:8000"}, "http", True),
        ({"host": "127.0.0.1:8000", "origin": "file://"}, "http", True),
        ({"host": "127.0.0.1:8000", "origin": "garbage"}, "http", True),
        ({"host": "127.0.0.1:8000", "sec-fetch-site": "same-site"}, "http", True),
        ({"host": "127.0.0.1:8000", "sec-fetch-site": "none"}, "http", False),  # typed in the address bar
    ],
)
def test_cross_site_reason_compares_host_and_port(headers: dict, scheme: str, refused: bool) -> None:
    assert (cross_site_reason("POST", headers, scheme) is not None) is refused
    assert cross_site_reason("GET", headers, scheme) is None
