"""The API's published contract (issue 18): explicit operation ids, declared errors in one shape,
the case JSON Schema for ``POST /api/cases``, ``GET /api/cases``, pagination of the list
endpoints, ``/docs`` from local assets, and the Prometheus names and types of ``/metrics``."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import DTYPES, AttentionCase
from service.db import migrations
from service.api.app import create_app
from service.db.engine import make_engine
from service.settings import Settings
from service.db.store import SqlStore

TOKEN = "s3cret"
FAILING = AttentionCase(seqlen_q=5, seqlen_k=5, num_heads=1, head_dim=8, causal=True, dtype="float32")
PASSING = AttentionCase(seqlen_q=3, seqlen_k=3, num_heads=1, head_dim=8, dtype="float32")


@pytest.fixture
def client(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'api.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    worker_id = store.register_worker(build_id, "host-a", 123, "cpu")
    store.heartbeat(worker_id, 7)
    for case, status in ((PASSING, "pass"), (FAILING, "fail")):
        store.record_case(case.to_json(), "fuzz")
        store.record_result(CaseResult(case.case_id, "torch-cpu-math", "bool_mask", status,
                                       signature="out:mismatch" if status == "fail" else None), build_id, worker_id)
    engine.dispose()
    with TestClient(create_app(Settings(database_url=url, api_token=TOKEN))) as test_client:
        yield test_client


def _error_shape(body: dict) -> None:
    assert set(body) == {"detail"} and isinstance(body["detail"], list) and body["detail"]
    for item in body["detail"]:
        assert set(item) >= {"loc", "msg", "type"} and isinstance(item["loc"], list) and item["msg"]


def test_operation_ids_are_the_function_names_and_unique(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    ids = [op["operationId"] for ops in schema["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    assert "list_buckets" in ids and "get_case" in ids and "record_case" in ids and "list_cases" in ids
    assert not [i for i in ids if "_api_" in i or i.endswith(("_get", "_post", "_patch"))]


def test_every_api_operation_declares_its_errors_in_one_shape(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "ErrorResponse" in schema["components"]["schemas"]
    assert "HTTPValidationError" not in schema["components"]["schemas"]  # one shape, not two
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert {"401", "503"} <= codes, (method, path)
            if "{" in path:
                assert "404" in codes, (method, path)
            for code in codes - {"200", "201", "204"}:
                ref = op["responses"][code]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorResponse"), (method, path, code)


def test_errors_answer_that_shape(client: TestClient) -> None:
    missing = client.get("/api/cases/0123456789abcdef")
    assert missing.status_code == 404
    _error_shape(missing.json())
    missing_bucket = client.get("/api/buckets/999")
    assert missing_bucket.status_code == 404
    _error_shape(missing_bucket.json())
    bad = client.get("/api/buckets", params={"limit": 0})
    assert bad.status_code == 422
    _error_shape(bad.json())
    unauthorised = client.patch("/api/buckets/1", json={"triage_state": "confirmed"})
    assert unauthorised.status_code == 401 and unauthorised.headers["WWW-Authenticate"] == "Bearer"
    _error_shape(unauthorised.json())
    assert unauthorised.json()["detail"][0]["type"] == "unauthorized"


def test_post_cases_publishes_the_case_json_schema_and_get_lists_cases(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    body_ref = schema["paths"]["/api/cases"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    case_schema = schema["components"]["schemas"][body_ref.rsplit("/", 1)[1]]["properties"]["case"]
    assert case_schema["additionalProperties"] is False
    assert case_schema["properties"]["dtype"]["enum"] == list(DTYPES)
    assert set(FAILING.to_json()) <= set(case_schema["properties"])  # every field a case has is documented
    listed = client.get("/api/cases", params={"failing": True})
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert body["total"] == 1 and [c["case_id"] for c in body["items"]] == [FAILING.case_id]
    assert body["items"][0]["statuses"] == {"fail": 1}


# The enums `service.api.openapi.case_json_schema` patched into the schema by hand before the
# choice fields of `AttentionCase` were typed ``Literal`` (2026-12-05): the published document
# must name the same values, now read from the types.
PATCHED_ENUMS = {
    "dtype": ["bfloat16", "float16", "float32"],
    "qkv_format": ["bshd", "sbhd", "thd"],
    "causal_alignment": ["top_left", "bottom_right"],
    "input_distribution": ["normal", "large_logits", "outliers", "near_constant"],
    "dout_distribution": ["normal", "tiny", "large", "sparse"],
    "score_offset_mode": ["head", "row"],
    "cp_comm_type": ["p2p", "all_gather", "a2a", "a2a+p2p"],
}


def _enums(schema: dict) -> dict[str, list]:
    """Every property's enum (inside an ``anyOf`` too, as for a nullable field)."""
    found = {}
    for name, prop in schema["properties"].items():
        for option in [prop, *prop.get("anyOf", [])]:
            if "enum" in option:
                found[name] = option["enum"]
    return found


def test_the_case_schema_carries_the_enums_of_the_literal_fields(client: TestClient) -> None:
    from oracle import config

    schema = client.get("/openapi.json").json()
    body_ref = schema["paths"]["/api/cases"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    case_schema = schema["components"]["schemas"][body_ref.rsplit("/", 1)[1]]["properties"]["case"]
    assert _enums(case_schema) == PATCHED_ENUMS
    cp = case_schema["properties"]["cp_comm_type"]
    assert {"type": "null"} in cp["anyOf"]  # nullable, as before
    assert [case_schema["properties"][name]["default"] for name in ("dtype", "qkv_format")] == ["bfloat16", "bshd"]
    # the checks read the same declaration: a value outside the Literal is refused, naming the field
    assert config.DTYPES == tuple(PATCHED_ENUMS["dtype"]) and config.CP_COMM_TYPES == tuple(PATCHED_ENUMS["cp_comm_type"])
    with pytest.raises(config.CaseValidationError, match="qkv_format: unknown value 'bhsd' .allowed: bshd, sbhd, thd"):
        config.AttentionCase(qkv_format="bhsd")


def test_list_endpoints_that_answer_arrays_are_paginated(client: TestClient) -> None:
    page = client.get("/api/known-failures", params={"backend": "torch-cpu-math", "limit": 1})
    assert page.status_code == 200
    assert page.headers["X-Total-Count"] == "1" and len(page.json()) == 1 and "Link" not in page.headers
    empty = client.get("/api/known-failures", params={"backend": "torch-cpu-math", "offset": 1})
    assert empty.json() == [] and empty.headers["X-Total-Count"] == "1"
    lines = client.get("/api/matrix/lines", params={"limit": 1})
    assert lines.status_code == 200 and "X-Total-Count" in lines.headers
    schema = client.get("/openapi.json").json()
    for path in ("/api/known-failures", "/api/matrix/lines", "/api/matrix/builds", "/api/matrix/regressions",
                 "/api/matrix/bisections"):
        names = {p["name"] for p in schema["paths"][path]["get"]["parameters"]}
        assert {"limit", "offset"} <= names, path


def test_docs_are_served_from_local_assets(client: TestClient) -> None:
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "cdn.jsdelivr.net" not in docs.text and "unpkg" not in docs.text
    for asset in ("/static/swagger-ui/swagger-ui-bundle.js", "/static/swagger-ui/swagger-ui.css"):
        assert asset in docs.text
        fetched = client.get(asset)
        assert fetched.status_code == 200 and len(fetched.content) > 100_000
    assert client.get("/static/swagger-ui/LICENSE").status_code == 200
    assert client.get("/redoc").status_code == 404  # CDN-only: off


def test_metrics_follow_prometheus_conventions(client: TestClient) -> None:
    scraped = client.get("/metrics")
    assert scraped.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
    types = {name: f.type for name, f in families.items()}
    # cumulative counts are counters (exposed as <name>_total), levels are gauges
    assert types["attnfuzz_results"] == "counter"
    assert types["attnfuzz_failures"] == "counter"
    assert types["attnfuzz_worker_cases"] == "counter"
    assert types["attnfuzz_cases"] == "gauge" and types["attnfuzz_workers_live"] == "gauge"
    assert types["attnfuzz_worker_last_heartbeat_timestamp_seconds"] == "gauge"
    assert "attnfuzz_worker_cases_run" not in types and "attnfuzz_worker_heartbeat_age_seconds" not in types
    assert types["attnfuzz_build_info"] == "gauge"  # an info family: value 1, the version as a label
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("attnfuzz_results_total", (("backend", "torch-cpu-math"), ("status", "fail")))] == 1
    (cases_run,) = [v for (name, _), v in samples.items() if name == "attnfuzz_worker_cases_total"]
    assert cases_run == 7
    (beat,) = [v for (name, _), v in samples.items() if name == "attnfuzz_worker_last_heartbeat_timestamp_seconds"]
    assert beat > 1.7e9  # a Unix time, not an age
    (info,) = [s for s in families["attnfuzz_build_info"].samples]
    assert info.value == 1 and info.labels["version"]
    for name in types:
        assert name.startswith("attnfuzz_") and name == name.lower()
