"""The JSON API beyond buckets and cases: repro export (hostile stored values included), result
ingestion by remote workers, builds, workers, bucket filters, /metrics and the browser login."""

from __future__ import annotations

import ast
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.db.models import Bucket, Build, Case, Result, Worker, case_filter_columns
from service.db.store import SqlStore
from tests.service.conftest import Seeded

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WRITER = "writer-token-for-tests"


def _locs(response) -> list[list]:
    assert response.status_code == 422, response.text
    return [e["loc"] for e in response.json()["detail"]]


def _counts(session: Session) -> tuple[int, ...]:
    return tuple(
        session.scalar(select(func.count()).select_from(table)) for table in (Build, Worker, Case, Result, Bucket)
    )


# ------------------------------------------------------------------------------------ repro
def _stored_allowances(case: AttentionCase) -> dict:
    """Metrics carrying the allowances a worker stores with a failing verdict (the repro
    endpoints use stored figures only)."""
    from service.export.allowance import computed_allowance

    return {name: {"allowed_global": a.whole, "tile_allowed": a.tiles} for name, a in computed_allowance(case).items()}


def test_case_repro_is_a_python_attachment_for_the_failing_variant(client: TestClient, seeded: Seeded) -> None:
    response = client.get(f"/api/cases/{seeded.other_case.case_id}/repro.py", params={"backend": "fa4", "variant": "default"})
    assert response.status_code == 422, "fa4 has no variant 'default'"
    assert ["query", "variant"] in _locs(response)
    response = client.get(f"/api/cases/{seeded.minimised_case.case_id}/repro.py")
    assert response.status_code == 422 and ["query", "backend"] in _locs(response), "sdpa/default is not exportable"


def test_repro_of_an_exportable_failure_names_its_signature(
    client: TestClient, store: SqlStore, seeded: Seeded
) -> None:
    case = AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=2, head_dim=16, causal=True, dtype="float32")
    store.record_case(case.to_json(), "fuzz")
    store.record_result(
        CaseResult(case.case_id, "torch-cpu-math", "is_causal", "fail", signature="out:mismatch",
                   signatures=("out:mismatch",), metrics=_stored_allowances(case)),
        seeded.build_id, None,
    )
    response = client.get(f"/api/cases/{case.case_id}/repro.py")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/x-python")
    assert f'filename="test_attnfuzz_torch_cpu_math_is_causal_{case.case_id}.py"' in response.headers["content-disposition"]
    tree = ast.parse(response.text)
    constants = {t.targets[0].id: t.value for t in tree.body if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)}
    assert ast.literal_eval(constants["SIGNATURE"]) == "out:mismatch"
    assert ast.literal_eval(constants["SEQLEN_Q"]) == 4


def test_bucket_repro_uses_the_minimised_case(client: TestClient, store: SqlStore, seeded: Seeded) -> None:
    case = AttentionCase(seqlen_q=8, seqlen_k=8, num_heads=1, head_dim=8, causal=True, dtype="float32")
    small = case.replace(seqlen_q=2, seqlen_k=2)
    store.record_case(case.to_json(), "fuzz")
    update = store.record_result(
        CaseResult(case.case_id, "torch-cpu-flash", "aten_lse", "fail", signature="lse:mismatch"), seeded.build_id, None
    )
    store.record_minimised(update.bucket_id, small.to_json(), case.case_id, "shrunk")
    store.record_case(small.to_json(), "minimised")
    store.record_result(CaseResult(small.case_id, "torch-cpu-flash", "aten_lse", "fail", signature="lse:mismatch",
                                   metrics=_stored_allowances(small), phase="confirm"), seeded.build_id, None)
    response = client.get(f"/api/buckets/{update.bucket_id}/repro.py")
    assert response.status_code == 200, response.text
    assert f"CASE_ID = '{small.case_id}'" in response.text and "VARIANT = 'aten_lse'" in response.text
    assert client.get("/api/buckets/987654/repro.py").status_code == 404


def _insert_raw_case(session: Session, case_id: str, config: dict) -> None:
    columns = case_filter_columns(AttentionCase())
    session.execute(insert(Case).values(id=case_id, config=config, origin="fuzz", **columns))
    session.flush()


@pytest.mark.parametrize(
    ("field", "hostile"),
    [
        ("dtype", "float32'); __import__('os').system('touch /tmp/pwned'); ('"),
        ("seqlen_q", "4); __import__('os').system('touch /tmp/pwned'"),
        ("softmax_scale", "0.1 if __import__('os').system('touch /tmp/pwned') else 0.1"),
        ("qkv_format", "bshd\"\"\"\nimport os\n\"\"\""),
        ("window_size_left", [1, "__import__('os')"]),
    ],
)
def test_export_refuses_a_hostile_value_stored_in_a_case_field(
    client: TestClient, session: Session, seeded: Seeded, field: str, hostile: object
) -> None:
    config = {**AttentionCase(seqlen_q=4, seqlen_k=4, head_dim=16, dtype="float32").to_json(), field: hostile}
    case_id = "deadbeef00000001"
    _insert_raw_case(session, case_id, config)
    session.execute(
        insert(Result).values(case_id=case_id, build_id=seeded.build_id, backend="torch-cpu-math", variant="is_causal",
                              status="fail", signature="out:mismatch", signatures=[], metrics={}, phase="fuzz")
    )
    session.flush()
    before = _counts(session)
    response = client.get(f"/api/cases/{case_id}/repro.py")
    assert ["query", "case", field] in _locs(response)
    assert "__import__" not in response.text or response.headers["content-type"].startswith("application/json")
    assert _counts(session) == before


@pytest.mark.parametrize(
    ("column", "hostile", "field"),
    [
        ("signature", "out:all_zero\"\"\"; import os; os.system('x') #", "signature"),
        ("backend", "fa4'); import os; ('", "backend"),
        ("variant", "te_style\n__import__('os')", "variant"),
    ],
)
def test_export_refuses_hostile_names_stored_in_a_result(
    client: TestClient, session: Session, seeded: Seeded, column: str, hostile: str, field: str
) -> None:
    values = {"backend": "fa4", "variant": "te_style", "signature": "out:all_zero", column: hostile}
    session.execute(
        insert(Result).values(case_id=seeded.minimised_case.case_id, build_id=seeded.other_build_id, status="fail",
                              signatures=[], metrics={}, phase="replay", **values)
    )
    session.flush()
    response = client.get(f"/api/cases/{seeded.minimised_case.case_id}/repro.py",
                          params={"backend": values["backend"], "variant": values["variant"]}
                          if column != "signature" else {"backend": "fa4", "variant": "te_style"})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert [["query", field]] == _locs(response)


# -------------------------------------------------------------------------------- ingestion
def _ingest_case(client: TestClient, case: AttentionCase, **headers) -> str:
    response = client.post("/api/cases", json={"case": case.to_json(), "origin": "fuzz"}, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["case_id"]


def test_a_remote_worker_stores_results_through_the_api(make_client: Callable[..., TestClient], session: Session) -> None:
    client = make_client(api_token=TOKEN)
    build = client.post("/api/builds", json={"torch": "2.13.0", "device_name": "NVIDIA H200"}, headers=AUTH)
    assert build.status_code == 200, build.text
    build_id = build.json()["id"]
    assert client.post("/api/builds", json={"torch": "2.13.0", "device_name": "NVIDIA H200"}, headers=AUTH).json() == {"id": build_id}
    worker = client.post("/api/workers", json={"build_id": build_id, "hostname": "remote-1", "pid": 7, "device": "cuda:0"}, headers=AUTH)
    assert worker.status_code == 201, worker.text
    worker_id = worker.json()["id"]
    case = AttentionCase(seqlen_q=3, seqlen_k=3, causal=True)
    assert _ingest_case(client, case, **AUTH) == case.case_id
    fail = {"case_id": case.case_id, "backend": "fa4", "variant": "te_style", "status": "fail",
            "signature": "out:all_zero", "signatures": ["out:all_zero", "lse:neginf"], "error_ratio": 1e300}
    ok = {"case_id": case.case_id, "backend": "fa4", "variant": "native", "status": "pass"}
    body = {"build_id": build_id, "worker_id": worker_id, "results": [fail, ok]}
    response = client.post("/api/results", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    updates = response.json()["updates"]
    assert updates[1] is None and updates[0]["is_new"] is True
    again = client.post("/api/results", json=body, headers=AUTH).json()["updates"]
    assert again[0] == {"bucket_id": updates[0]["bucket_id"], "is_new": False}, "idempotent"
    assert client.post(f"/api/workers/{worker_id}/heartbeat", json={"cases_run": 12}, headers=AUTH).status_code == 204
    bucket = client.get(f"/api/buckets/{updates[0]['bucket_id']}").json()
    assert (bucket["backend"], bucket["signature"], bucket["hit_count"]) == ("fa4", "out:all_zero", 1)
    small = case.replace(seqlen_q=1, seqlen_k=1)
    minimised = {"case": small.to_json(), "original_case_id": case.case_id, "note": "shrunk remotely"}
    assert client.post(f"/api/buckets/{updates[0]['bucket_id']}/minimised", json=minimised, headers=AUTH).status_code == 204
    known = client.get("/api/known-failures", params={"backend": ["fa4", "te-fa4"]}).json()
    assert known == [{"backend": "fa4", "variant": "te_style", "signature": "out:all_zero", "case": small.to_json()}]
    workers = client.get("/api/workers", params={"live": True}).json()
    assert [(w["hostname"], w["cases_run"]) for w in workers["items"]] == [("remote-1", 12)]


@pytest.mark.parametrize(
    "path", ["/api/builds", "/api/workers", "/api/cases", "/api/results", "/api/workers/1/heartbeat", "/api/buckets/1/minimised"]
)
def test_every_write_endpoint_needs_the_token(make_client: Callable[..., TestClient], session: Session, path: str) -> None:
    client = make_client(api_token=TOKEN)
    before = _counts(session)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = client.post(path, json={}, headers=headers)
        assert response.status_code == 401, (path, response.text)
    assert _counts(session) == before


def _batch(seeded: Seeded, **result) -> dict:
    base = {"case_id": seeded.case.case_id, "backend": "fa4", "variant": "te_style", "status": "fail", "signature": "out:nan"}
    return {"build_id": seeded.build_id, "results": [{**base, **result}]}


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"status": "exploded"}, ["body", "results", 0, "status"]),
        ({"signature": None}, ["body", "results", 0, "signature"]),
        ({"status": "pass"}, ["body", "results", 0, "signature"]),
        ({"signature": "out:nan'); import os"}, ["body", "results", 0, "signature"]),
        ({"backend": "fa4 --evil"}, ["body", "results", 0, "backend"]),
        ({"case_id": "0123456789abcdef"}, ["body", "results", 0, "case_id"]),
        ({"phase": "later"}, ["body", "results", 0, "phase"]),
        ({"colour": "red"}, ["body", "results", 0, "colour"]),
    ],
)
def test_a_bad_result_is_422_naming_the_field_and_stores_nothing(
    client: TestClient, session: Session, seeded: Seeded, change: dict, loc: list
) -> None:
    body = _batch(seeded, **change)
    body["results"].insert(0, dict(body["results"][0], **{"backend": "fa2", "status": "fail", "signature": "crash",
                                                           "case_id": seeded.case.case_id, "variant": "good"}))
    for key in ("phase", "colour"):
        body["results"][0].pop(key, None)
    body["results"][0]["backend"] = "fa2"
    body["results"][0]["status"] = "fail"
    body["results"][0]["signature"] = "crash"
    body["results"].reverse()  # the bad one first: index 0
    before = _counts(session)
    hits = session.scalar(select(func.sum(Bucket.hit_count)))
    assert loc in _locs(client.post("/api/results", json=body))
    assert _counts(session) == before, "the good result of the batch was not stored either"
    assert session.scalar(select(func.sum(Bucket.hit_count))) == hits


def test_unknown_build_or_worker_is_422_naming_the_field(client: TestClient, session: Session, seeded: Seeded) -> None:
    before = _counts(session)
    assert ["body", "build_id"] in _locs(client.post("/api/results", json={**_batch(seeded), "build_id": 99999}))
    assert ["body", "worker_id"] in _locs(client.post("/api/results", json={**_batch(seeded), "worker_id": 99999}))
    worker = {"build_id": 99999, "hostname": "h", "pid": 1, "device": "cuda:0"}
    assert ["body", "build_id"] in _locs(client.post("/api/workers", json=worker))
    assert _counts(session) == before


def test_an_invalid_case_is_422_naming_the_case_field(client: TestClient, session: Session) -> None:
    before = _counts(session)
    bad = {**AttentionCase().to_json(), "num_heads_kv": 3, "num_heads": 4}
    assert ["body", "case", "num_heads_kv"] in _locs(client.post("/api/cases", json={"case": bad}))
    assert ["body", "origin"] in _locs(client.post("/api/cases", json={"case": AttentionCase().to_json(), "origin": "x"}))
    assert _counts(session) == before


def test_a_batch_over_1000_results_is_refused(client: TestClient, seeded: Seeded) -> None:
    body = _batch(seeded)
    body["results"] = body["results"] * 1001
    assert ["body", "results"] in _locs(client.post("/api/results", json=body))


# ------------------------------------------------------------------------- lists and filters
def test_bucket_list_filters_by_dtype_head_dim_mask_and_build(client: TestClient, seeded: Seeded) -> None:
    def ids(**params) -> set[int]:
        response = client.get("/api/buckets", params=params)
        assert response.status_code == 200, response.text
        return {b["id"] for b in response.json()["items"]}

    everything = {seeded.nan_bucket_id, seeded.crash_bucket_id, seeded.fa4_bucket_id}
    assert ids(dtype="float16") == {seeded.nan_bucket_id, seeded.fa4_bucket_id}  # other_case is fp16
    assert ids(dtype="float32") == set()
    assert ids(head_dim=128) == {seeded.nan_bucket_id, seeded.fa4_bucket_id}
    assert ids(mask="causal") == {seeded.nan_bucket_id, seeded.crash_bucket_id}
    assert ids(mask="window") == {seeded.nan_bucket_id, seeded.fa4_bucket_id}
    assert ids(mask="none") == set()
    assert ids(build_id=seeded.other_build_id) == {seeded.nan_bucket_id}
    assert ids(build_id=seeded.build_id) == everything
    assert ids(dtype="float16", backend="fa4") == {seeded.fa4_bucket_id}
    row = client.get("/api/buckets", params={"backend": "fa2"}).json()["items"][0]
    assert row["first_build"]["torch"] == "2.13.0" and row["last_build"]["id"] == seeded.build_id


@pytest.mark.parametrize(
    ("params", "field"),
    [({"dtype": "int8"}, "dtype"), ({"head_dim": 0}, "head_dim"), ({"mask": "diagonal"}, "mask"), ({"build_id": "x"}, "build_id")],
)
def test_bucket_filters_reject_bad_values_naming_them(client: TestClient, params: dict, field: str) -> None:
    assert ["query", field] in _locs(client.get("/api/buckets", params=params))


def test_bucket_results_are_paginated_newest_first(client: TestClient, seeded: Seeded) -> None:
    first = client.get(f"/api/buckets/{seeded.nan_bucket_id}/results", params={"limit": 2}).json()
    second = client.get(f"/api/buckets/{seeded.nan_bucket_id}/results", params={"limit": 2, "offset": 2}).json()
    assert (first["total"], len(first["items"]), len(second["items"])) == (3, 2, 1)
    ids = [r["id"] for r in first["items"] + second["items"]]
    assert len(set(ids)) == 3 and all(r["bucket_id"] == seeded.nan_bucket_id for r in first["items"])
    assert ["query", "limit"] in _locs(client.get(f"/api/buckets/{seeded.nan_bucket_id}/results", params={"limit": 0}))
    assert client.get("/api/buckets/987654/results").status_code == 404


def test_builds_and_workers_are_listed_with_paging(client: TestClient, seeded: Seeded) -> None:
    builds = client.get("/api/builds", params={"limit": 1}).json()
    assert builds["total"] == 2 and len(builds["items"]) == 1
    assert client.get(f"/api/builds/{seeded.build_id}").json()["cuda"] == "13.0"
    assert client.get("/api/builds/99999").status_code == 404
    only_h200 = client.get("/api/builds", params={"device_name": "cpu"}).json()
    assert only_h200["total"] == 0
    workers = client.get("/api/workers").json()
    assert [w["id"] for w in workers["items"]] == [seeded.worker_id]
    assert workers["items"][0]["cases_per_s"] == 0.0


def test_overview_reports_failures_by_backend_and_signature(client: TestClient, seeded: Seeded) -> None:
    body = client.get("/api/overview").json()
    assert body["failures_by_backend"] == {"sdpa": 3, "fa2": 1, "fa4": 1}
    assert body["failures_by_signature"] == {"out:nan": 3, "crash": 1, "lse:mismatch": 1}


def test_openapi_documents_the_endpoints(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/api/results", "/api/cases/{case_id}/repro.py", "/api/buckets/{bucket_id}/results", "/api/builds",
                 "/api/workers", "/api/known-failures", "/metrics"):
        assert path in paths, path


# ----------------------------------------------------------------------------------- metrics
def test_metrics_are_prometheus_text_with_counts_from_the_database(client: TestClient, seeded: Seeded) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert "attnfuzz_cases 3.0" in text
    assert 'attnfuzz_results_total{backend="sdpa",status="fail"} 3.0' in text
    assert 'attnfuzz_failures_total{backend="fa2",signature="crash",variant="default"} 1.0' in text or (
        'attnfuzz_failures_total{backend="fa2",variant="default",signature="crash"} 1.0' in text
    )
    assert 'attnfuzz_buckets{backend="fa4",triage_state="new"} 1.0' in text
    assert "attnfuzz_workers_live 1.0" in text
    assert f'attnfuzz_worker_last_heartbeat_timestamp_seconds{{device="cuda:0",hostname="gpu-host-1",worker_id="{seeded.worker_id}"}}' in text or (
        f'worker_id="{seeded.worker_id}",hostname="gpu-host-1",device="cuda:0"' in text
    )


def test_metrics_follow_the_read_token(make_client: Callable[..., TestClient], seeded: Seeded) -> None:
    client = make_client(api_token=TOKEN, read_requires_token=True)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=AUTH).status_code == 200


# ------------------------------------------------------------------------------ login, form
def test_login_sets_a_strict_httponly_cookie_that_opens_pages(make_client: Callable[..., TestClient], seeded: Seeded) -> None:
    client = make_client(api_token=TOKEN, read_requires_token=True)
    assert client.get("/buckets").status_code == 401
    wrong = client.post("/login", data={"token": "nope", "next": "/buckets"}, follow_redirects=False)
    assert wrong.status_code == 401 and "attnfuzz_token" not in wrong.headers.get("set-cookie", "")
    ok = client.post("/login", data={"token": TOKEN, "next": "/buckets"}, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/buckets"
    cookie = ok.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert client.get("/buckets").status_code == 200
    assert client.get("/api/overview").status_code == 200
    client.post("/logout")
    assert client.get("/buckets").status_code == 401


def test_login_never_redirects_off_site(make_client: Callable[..., TestClient]) -> None:
    client = make_client(api_token=TOKEN)
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        response = client.post("/login", data={"token": TOKEN, "next": target}, follow_redirects=False)
        assert response.headers["location"] == "/", target


def test_the_triage_form_changes_state_with_the_login_cookie(make_client: Callable[..., TestClient], seeded: Seeded) -> None:
    client = make_client(api_token=TOKEN)
    url = f"/buckets/{seeded.crash_bucket_id}/triage"
    form = {"triage_state": "reported", "upstream_url": "https://github.com/Dao-AILab/flash-attention/issues/1",
            "notes": "segfault", "duplicate_of_id": ""}
    assert client.post(url, data=form, follow_redirects=False).status_code == 401
    client.post("/login", data={"token": TOKEN})
    foreign = client.post(url, data=form, headers={"Origin": "https://evil.example"}, follow_redirects=False)
    assert foreign.status_code == 403
    assert client.get(f"/api/buckets/{seeded.crash_bucket_id}").json()["triage_state"] == "new"
    response = client.post(url, data=form, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"].endswith("?updated=1")
    stored = client.get(f"/api/buckets/{seeded.crash_bucket_id}").json()
    assert (stored["triage_state"], stored["notes"], stored["upstream_url"]) == ("reported", "segfault", form["upstream_url"])


def test_with_the_writer_token_alone_the_triage_form_is_401_and_changes_nothing(
    make_client: Callable[..., TestClient], seeded: Seeded
) -> None:
    """``ATTNFUZZ_WRITER_TOKEN`` without ``ATTNFUZZ_API_TOKEN``: the form is refused without a token,
    with the writer token as header, and with any cookie (no login exists), and nothing changes."""
    client = make_client(writer_token=WRITER)
    url = f"/buckets/{seeded.crash_bucket_id}/triage"
    form = {"triage_state": "wontfix", "notes": "closed by anyone", "upstream_url": "", "duplicate_of_id": ""}
    attempts = [{}, {"headers": {"Authorization": f"Bearer {WRITER}"}}, {"cookies": {"attnfuzz_token": WRITER}}]
    for attempt in attempts:
        client.cookies.clear()
        client.cookies.update(attempt.get("cookies", {}))
        response = client.post(url, data=form, headers=attempt.get("headers"), follow_redirects=False)
        assert response.status_code == 401, (attempt, response.text)
        assert "triage needs ATTNFUZZ_API_TOKEN to be set on the service" in response.json()["detail"][0]["msg"]
    client.cookies.clear()
    stored = client.get(f"/api/buckets/{seeded.crash_bucket_id}").json()
    assert (stored["triage_state"], stored["notes"]) == ("new", "")


def test_with_the_writer_token_alone_the_bucket_page_offers_no_triage_form(
    make_client: Callable[..., TestClient], seeded: Seeded
) -> None:
    closed = make_client(writer_token=WRITER).get(f"/buckets/{seeded.crash_bucket_id}")
    assert closed.status_code == 200
    assert f'action="/buckets/{seeded.crash_bucket_id}/triage"' not in closed.text and 'id="save-triage"' not in closed.text
    assert 'id="triage-closed"' in closed.text
    assert "Triage is closed until <code>ATTNFUZZ_API_TOKEN</code> is set on the service" in closed.text
    for tokens, login_note in (({}, False), ({"api_token": TOKEN}, True), ({"api_token": TOKEN, "writer_token": WRITER}, True)):
        page = make_client(**tokens).get(f"/buckets/{seeded.crash_bucket_id}")
        assert 'id="save-triage"' in page.text and 'id="triage-closed"' not in page.text, tokens
        assert ('id="triage-login"' in page.text) == login_note, tokens


def test_with_the_writer_token_alone_login_logs_nobody_in_and_says_why(
    make_client: Callable[..., TestClient], seeded: Seeded
) -> None:
    client = make_client(writer_token=WRITER)
    page = client.get("/login")
    assert page.status_code == 200
    assert "reading and triage are open" not in page.text and 'id="login-submit"' not in page.text
    assert 'id="triage-closed"' in page.text and "ATTNFUZZ_API_TOKEN" in page.text
    for token in (WRITER, "", "anything"):
        response = client.post("/login", data={"token": token, "next": "/buckets"}, follow_redirects=False)
        assert response.status_code == 401, token
        assert "attnfuzz_token" not in response.headers.get("set-cookie", "")
        assert "triage is closed until ATTNFUZZ_API_TOKEN is set on the service" in response.text
    open_page = make_client().get("/login")  # no token at all: open, as before
    assert "reading and triage are open" in open_page.text and 'id="triage-closed"' not in open_page.text


def test_a_bad_triage_form_shows_the_error_and_changes_nothing(client: TestClient, seeded: Seeded) -> None:
    url = f"/buckets/{seeded.crash_bucket_id}/triage"
    response = client.post(url, data={"triage_state": "duplicate", "duplicate_of_id": "", "notes": "changed"})
    assert response.status_code == 422
    assert "duplicate_of_id" in response.text
    stored = client.get(f"/api/buckets/{seeded.crash_bucket_id}").json()
    assert (stored["triage_state"], stored["notes"]) == ("new", "")
    response = client.post(url, data={"upstream_url": "javascript:alert(1)"})
    assert response.status_code == 422 and "upstream_url" in response.text


def test_a_transient_database_conflict_is_503_with_retry_after(client: TestClient, monkeypatch, seeded: Seeded) -> None:
    from sqlalchemy.exc import OperationalError

    from service.db import repository
    def busy(*args, **kwargs):
        raise OperationalError("UPDATE buckets ...", {}, Exception("database is locked"))

    monkeypatch.setattr(repository, "update_triage", busy)
    response = client.patch(f"/api/buckets/{seeded.crash_bucket_id}", json={"notes": "x"})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"


def test_an_unavailable_store_is_503_with_retry_after(client: TestClient, monkeypatch, seeded: Seeded) -> None:
    from service.db import ingest
    from service.db import engine as store
    if not hasattr(store, "StoreUnavailableError"):
        pytest.skip("this store has no StoreUnavailableError")

    def unavailable(*args, **kwargs):
        raise store.StoreUnavailableError("database unavailable: connection refused")

    monkeypatch.setattr(ingest, "ingest_case", unavailable)
    response = client.post("/api/cases", json={"case": AttentionCase().to_json()})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert "connection refused" in response.json()["detail"][0]["msg"]  # the one error shape
