"""Bad input everywhere: malformed case JSON, cases that violate constraints, corpus files of an
older schema version, a database of an unknown (newer) schema revision, and the JSON API fuzzed
with schemathesis against its own OpenAPI schema. Each is refused with a message naming the file
and field, a non-zero exit, and nothing stored."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from datetime import UTC, datetime
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from sqlalchemy import text

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.db import migrations
from service.api.app import create_app
from service.db.engine import make_engine
from service.settings import Settings
from service.db.store import SqlStore
from tests.reliability.conftest import REPO, counts

pytestmark = pytest.mark.timeout(300)

GOOD = AttentionCase(seqlen_q=3, seqlen_k=5, head_dim=16, dtype="float32", causal=True)


def _write(path: Path, content: object) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param('{"seqlen_q": 3,', "case: ", id="truncated-json"),
        pytest.param("[1, 2]", "case: must be a JSON object, got list", id="not-an-object"),
        pytest.param({**GOOD.to_json(), "num_heads": 4, "num_heads_kv": 3}, "num_heads_kv", id="constraint"),
        pytest.param({**GOOD.to_json(), "seqlen_q": -1}, "seqlen_q", id="negative-length"),
        pytest.param({**GOOD.to_json(), "dtype": "float8"}, "dtype", id="unknown-dtype"),
        pytest.param({**GOOD.to_json(), "heads": 2}, "heads: unknown field", id="unknown-field"),
        pytest.param({**GOOD.to_json(), "schema_version": 0}, "schema_version: unsupported case schema version 0", id="old-schema"),
    ],
)
def test_cases_add_refuses_a_bad_case_file_and_stores_nothing(cli, sqlite_url, tmp_path, content, message) -> None:
    good = _write(tmp_path / "good.json", GOOD.to_json())
    bad = _write(tmp_path / "bad.json", content)
    before = counts(sqlite_url)
    run = cli("cases", "add", str(good), str(bad), "--db", sqlite_url)
    assert run.wait(120) == 2, run.output()
    output = " ".join(run.output().split())
    assert "bad.json" in output and message in output, output
    assert counts(sqlite_url) == before, "the good file before it was not stored either"

    ok = cli("cases", "add", str(good), "--db", sqlite_url)
    assert ok.wait(120) == 0, ok.output()
    assert counts(sqlite_url)["cases"] == before["cases"] + 1


def test_corpus_import_rejects_a_file_of_an_older_schema_version_and_stores_nothing(cli, sqlite_url, tmp_path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(REPO / "corpus", corpus, ignore=shutil.ignore_patterns("*.md"))
    files = sorted(corpus.rglob("*.json"))
    old = json.loads(files[-1].read_text())
    old["schema_version"] = 0
    files[-1].write_text(json.dumps(old))
    run = cli("corpus", "import", str(corpus), "--db", sqlite_url)
    assert run.wait(120) == 2, run.output()
    output = " ".join(run.output().split())
    assert files[-1].name in output and "schema_version 0 is not supported (allowed: 1)" in output, output
    assert counts(sqlite_url)["cases"] == 0

    old["schema_version"] = 1
    files[-1].write_text(json.dumps(old))
    ok = cli("corpus", "import", str(corpus), "--db", sqlite_url)
    assert ok.wait(120) == 0, ok.output()
    distinct = {json.loads(f.read_text())["case"]["seed"] for f in files} and {
        AttentionCase.from_json(json.loads(f.read_text())["case"]).case_id for f in files
    }
    assert counts(sqlite_url)["cases"] == len(distinct)


def test_a_database_of_an_unknown_newer_revision_is_refused_with_a_clear_error(cli, sqlite_url, tmp_path) -> None:
    engine = make_engine(sqlite_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    finally:
        engine.dispose()
    before = counts(sqlite_url)
    run = cli("fuzz", "--db", sqlite_url, "--max-cases", "1", "--quiet", "--spool-dir", str(tmp_path / "spool"),
              "--backend", "tests.fuzzer.standins:CorrectBackend")
    assert run.wait(120) == 5, run.output()
    output = " ".join(run.output().split())
    assert "cannot migrate" in output and "9999" in output, output
    assert counts(sqlite_url) == before


def test_migration_0002_upgrades_and_downgrades_keeping_the_data(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    migrations.upgrade(url, "0001")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:  # a bucket written by the 0001 schema
            connection.execute(text(
                "INSERT INTO builds (id, fingerprint_id, torch, cuda, cudnn, flash_attn_4, flash_attn, transformer_engine,"
                " nvidia_cutlass_dsl, triton, python, device_name, compute_capability, driver, first_seen)"
                " VALUES (1, 'f', '', '', '', '', '', '', '', '', '', 'cpu', '', '', '2026-11-29 00:00:00')"))
            connection.execute(text(
                "INSERT INTO cases (id, config, origin, created_at, dtype, head_dim, head_dim_v, seqlen_q, seqlen_k,"
                " batch_size, num_heads, num_heads_kv, qkv_format, causal, has_window, has_softcap, backward)"
                " VALUES (:id, :config, 'fuzz', '2026-11-29 00:00:00', 'float32', 16, 16, 3, 5, 1, 1, 1, 'bshd', 1, 0, 0, 1)"),
                {"id": GOOD.case_id, "config": json.dumps(GOOD.to_json())})
            connection.execute(text(
                "INSERT INTO buckets (backend, variant, signature, first_seen, last_seen, hit_count, first_case_id,"
                " minimise_note, first_build_id, last_build_id, triage_state, notes) VALUES ('standin-gate', 'buggy',"
                " 'out:all_zero', '2026-11-29 00:00:00', '2026-11-29 00:00:00', 1, :id, '', 1, 1, 'new', '')"),
                {"id": GOOD.case_id})
        engine.dispose()
        migrations.upgrade(url, "0002")
        assert migrations.current(url) == "0002"
        store = SqlStore(engine)
        worker = store.register_worker(1, "h", 1, "cpu", slot="slot-0")
        claim = store.claim_minimisation(worker, ["standin-gate"], 60.0)
        assert claim is not None and claim.attempt == 1, "a bucket from before the migration is picked up"
        engine.dispose()
        migrations.downgrade(url, "0001")
        assert migrations.current(url) == "0001"
        with engine.connect() as connection:
            columns = {r[1] for r in connection.exec_driver_sql("PRAGMA table_info(buckets)")}
            assert "minimise_owner_id" not in columns
            assert connection.scalar(text("SELECT COUNT(*) FROM buckets")) == 1
            assert connection.scalar(text("SELECT COUNT(*) FROM workers")) == 1
        engine.dispose()
        migrations.upgrade(url)
        assert migrations.current(url) == migrations.head()
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ the JSON API
def _seeded_app(url: str):
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        worker_id = store.register_worker(build_id, "host", 1, "cpu", slot="slot-0")
        for n in (1, 2, 3):
            case = AttentionCase(seqlen_q=n, seqlen_k=n + 2, head_dim=16, dtype="float32", causal=n != 2)
            store.record_case(case.to_json(), "fuzz")
            store.record_result(CaseResult(case.case_id, "standin-gate", "buggy", "fail", signature="out:all_zero",
                                           metrics={"out": {"error_ratio": 9.0}}, error_ratio=9.0), build_id, worker_id)
            store.record_result(CaseResult(case.case_id, "standin-gate", "native", "pass"), build_id, worker_id)
        with engine.begin() as connection:  # huge cases stored before the bounds (issue 17): pages must stay bounded
            from service.db.models import Case

            for case_id, config in HUGE_STORED.items():
                connection.execute(Case.__table__.insert().values(
                    id=case_id, config=config, origin="fuzz", created_at=datetime(2026, 12, 1, tzinfo=UTC), dtype="float32",
                    head_dim=8, head_dim_v=8, seqlen_q=4, seqlen_k=4, batch_size=1, num_heads=1, num_heads_kv=1,
                    qkv_format="bshd", causal=True, has_window=True, has_softcap=False, backward=True))
    finally:
        engine.dispose()
    return create_app(Settings(database_url=url, api_token=None, read_requires_token=False))


HUGE_STORED = {
    "00000000000000aa": {**GOOD.to_json(), "batch_size": 2**31 - 1, "seqlen_q": 2**31 - 1, "seqlen_k": 2**31 - 1,
                         "num_heads": 2**31 - 1, "num_heads_kv": 2**31 - 1, "head_dim": 1024, "head_dim_v": 1024},
    "00000000000000bb": {**GOOD.to_json(), "window_size_left": 10**40},
}


# Requests per operation and generation mode: 15 in the suite (CI's time budget); deeper runs with
# ATTNFUZZ_TEST_API_EXAMPLES=50 (docs/reliability.md).
API_EXAMPLES = int(os.environ.get("ATTNFUZZ_TEST_API_EXAMPLES", "15"))


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"),
                        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres)])
def api_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database for the fuzzed API: a SQLite file, or a schema of its own on the shared
    PostgreSQL test server (where NUL characters and 32-bit integers are refused)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'api.db'}"
        return
    server = request.getfixturevalue("postgres_server")
    url = server.new_schema_url()
    try:
        yield url
    finally:
        server.drop_schema_of(url)


def test_the_api_answers_fuzzed_requests_without_server_errors(api_database_url) -> None:
    """Every operation of the app's own OpenAPI schema, fuzzed by schemathesis with requests that
    fit the schema and requests that do not (writes open since no token is set): no 5xx answer."""
    app = _seeded_app(api_database_url)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 5, [op.label for op in operations]
    failures = {}
    try:
        for operation, mode in itertools.product(operations, (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)):

            @settings(
                max_examples=API_EXAMPLES,
                phases=[Phase.explicit, Phase.generate],  # no shrinking: the first failure is reported as is
                suppress_health_check=list(HealthCheck),
                deadline=None,
                database=None,
            )
            @given(operation.as_strategy(mode))
            def fuzz(case) -> None:
                case.call_and_validate(checks=[not_a_server_error])

            try:
                fuzz()
            except Exception as exc:  # collect every failing operation, then report them all
                failures[f"{operation.label} ({mode.value})"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
        from fastapi.testclient import TestClient

        client = TestClient(app)
        for case_id in HUGE_STORED:  # the pages no schema lists, and the API, on the huge stored cases
            for path in (f"/cases/{case_id}", f"/api/cases/{case_id}", f"/api/cases/{case_id}/repro.py"):
                answer = client.get(path)
                if answer.status_code >= 500:
                    failures[f"GET {path}"] = f"{answer.status_code}: {answer.text[:500]}"
    finally:
        app.state.engine.dispose()
    assert failures == {}, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
