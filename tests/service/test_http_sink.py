"""Workers without database credentials: `fuzzer.http_sink.HttpSink` against the real app
(``POST /api/case-results`` and the lease endpoints, `service.db.batch`), the writer token, the
spool while the service is away, and ``attnfuzz fuzz --server`` (the hints of its summary too). SQLite and
PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fuzzer.http_sink import HttpSink, ServiceRejectedError, writer_token_from_env
from fuzzer.results import BuildFingerprint, CaseResult, LeaseLostError, SinkFatalError, SinkUnavailableError
from fuzzer.spool import Spool, SpoolingSink
from oracle.config import AttentionCase
from service.api.app import create_app
from service.db import migrations
from service.db.engine import make_engine
from service.db.models import Bucket, Case, Result, Worker
from service.db.store import SqlStore
from service.settings import Settings

TOKEN = "writer-token-for-tests"
WAIT_S = 120.0
PLANTED = "tests.fuzzer.standins:PlantedWindowBackend"


def _case(seed: int) -> AttentionCase:
    return AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=2, head_dim=8, dtype="float32", seed=seed)


def _results(case: AttentionCase, signature: str | None = "out:mismatch") -> list[CaseResult]:
    passing = CaseResult(case.case_id, "sdpa", "fwd", "pass", metrics={"out": {"max_abs": 0.01, "passed": True}})
    unsupported = CaseResult(case.case_id, "fa2", "fwd", "unsupported", detail="head_dim 8 not in (64, 128)")
    if signature is None:
        return [passing, unsupported]
    failing = CaseResult(case.case_id, "eager", "fwd", "fail", signature=signature, error_ratio=5.0,
                         metrics={"out": {"max_abs": 3.0, "passed": False}})
    return [passing, unsupported, failing]


def _payload(case: AttentionCase, results: list[CaseResult], build_id: int, worker_id: int | None) -> dict:
    return {"case_json": case.to_json(), "origin": "fuzz", "results": [r.to_json() for r in results],
            "build_id": build_id, "worker_id": worker_id}


@pytest.fixture
def sink_of(make_client: Callable[..., TestClient]) -> Callable[..., HttpSink]:
    """``sink_of(token)``: an HttpSink on an app with the writer token set, in the test's transaction."""
    client = make_client(writer_token=TOKEN)
    return lambda token=TOKEN: HttpSink("http://testserver", token, client=client)


def _count(session: Session, model: type) -> int:
    return session.scalar(select(func.count()).select_from(model))


def test_a_batch_is_stored_all_or_none_and_once_when_retried(
    sink_of: Callable[..., HttpSink], session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = sink_of()
    build_id = sink.register_build(BuildFingerprint(torch="2.13.0"))
    worker_id = sink.register_worker(build_id, "node-1", 11, "cpu", "slot-0")
    cases = [_case(seed) for seed in range(3)]
    good = [_payload(c, _results(c), build_id, worker_id) for c in cases]

    bad = [dict(p) for p in good]  # the second case's failing result names another case: refused
    bad[1] = {**bad[1], "results": [*bad[1]["results"][:2], {**bad[1]["results"][2], "case_id": cases[0].case_id}]}
    with pytest.raises(ServiceRejectedError) as refused:
        sink.record_batch(bad)
    assert refused.value.status == 422 and refused.value.detail[0]["loc"] == ["body", "cases", 1, "results", 2, "case_id"]
    assert _count(session, Result) == 0 and _count(session, Case) == 0 and _count(session, Bucket) == 0

    from service.db import batch

    def fault(*args: object) -> None:  # the database fails after the cases and results were written
        raise RuntimeError("fault injected after the inserts")

    with monkeypatch.context() as patched:
        patched.setattr(batch, "_count_all", fault)
        with pytest.raises(RuntimeError, match="fault injected"):
            sink.record_batch(good)
    assert _count(session, Result) == 0 and _count(session, Case) == 0 and _count(session, Bucket) == 0

    answers = sink.record_batch(good)
    assert [[u is not None for u in a] for a in answers] == [[False, False, True]] * 3
    assert answers[0][2].is_new and not answers[1][2].is_new and answers[1][2].bucket_id == answers[0][2].bucket_id
    assert _count(session, Result) == 9 and _count(session, Case) == 3
    assert session.scalar(select(Bucket.hit_count)) == 3

    retried = sink.record_batch(good)  # the answer was lost: the worker sends it again
    assert _count(session, Result) == 9 and session.scalar(select(Bucket.hit_count)) == 3
    assert [a[2].bucket_id for a in retried] == [answers[0][2].bucket_id] * 3 and not any(a[2].is_new for a in retried)


def test_a_write_without_the_writer_token_is_401_and_stores_nothing(
    make_client: Callable[..., TestClient], sink_of: Callable[..., HttpSink], session: Session
) -> None:
    build_id = sink_of().register_build(BuildFingerprint(torch="2.13.0"))
    case = _case(7)
    for token in (None, "not-the-token"):
        with pytest.raises(SinkFatalError, match="401") as refused:
            sink_of(token).record_batch([_payload(case, _results(case), build_id, None)])
        assert "not-the-token" not in str(refused.value)  # a token is never part of a message
    raw = make_client(writer_token=TOKEN)
    body = {"build_id": build_id, "cases": [{"case": case.to_json(), "results": [r.to_json() for r in _results(case)]}]}
    assert raw.post("/api/case-results", json=body).status_code == 401
    assert raw.post("/api/builds", json={"torch": "other"}).status_code == 401
    assert _count(session, Result) == 0 and _count(session, Case) == 0
    assert raw.get("/api/known-buckets").status_code == 200  # reads stay as they were
    assert raw.post("/api/case-results", json=body, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert _count(session, Result) == 3


def test_two_workers_through_http_cannot_both_hold_a_buckets_minimisation_lease(
    sink_of: Callable[..., HttpSink],
) -> None:
    a, b = sink_of(), sink_of()
    build_id = a.register_build(BuildFingerprint(torch="2.13.0"))
    worker_a, worker_b = a.register_worker(build_id, "node-1", 1, "cpu"), b.register_worker(build_id, "node-2", 2, "cpu")
    case = _case(3)
    a.record_case_results(case.to_json(), "fuzz", _results(case), build_id, worker_a)

    claim = a.claim_minimisation(worker_a, ["eager"], 600.0)
    assert claim is not None and claim.key == ("eager", "fwd", "out:mismatch") and claim.attempt == 1
    assert AttentionCase.from_json(claim.case_json).case_id == case.case_id
    assert b.claim_minimisation(worker_b, ["eager"], 600.0) is None  # held by a
    assert a.renew_minimisation(claim.bucket_id, worker_a, 600.0) is True
    assert b.renew_minimisation(claim.bucket_id, worker_b, 600.0) is False

    a.release_minimisation(claim.bucket_id, worker_a, "gave up: deadline")
    second = b.claim_minimisation(worker_b, ["eager"], 600.0)
    assert second is not None and second.bucket_id == claim.bucket_id and second.attempt == 2
    with pytest.raises(LeaseLostError):  # a's old lease is fenced out: nothing stored
        a.record_minimised(claim.bucket_id, case.to_json(), case.case_id, "shrunk", worker_id=worker_a, lease=claim.attempt)
    assert b.record_minimised(second.bucket_id, case.to_json(), case.case_id, "shrunk", worker_id=worker_b,
                              lease=second.attempt) == []
    assert a.known_failures(["eager"]) == [(claim.key, case.to_json())]
    assert a.mark_worker_lost(worker_a) is True and a.mark_worker_lost(10**6) is False


def test_the_spool_batches_passing_cases_and_sends_them_in_one_request(
    sink_of: Callable[..., HttpSink], session: Session, tmp_path: Path
) -> None:
    inner = sink_of()
    build_id = inner.register_build(BuildFingerprint(torch="2.13.0"))
    worker_id = inner.register_worker(build_id, "node-1", 1, "cpu")
    with Spool(tmp_path / "slot-0") as spool:
        sink = SpoolingSink(inner, spool, batch_cases=3, batch_age_s=3600.0)
        before = inner.requests
        for seed in range(2):
            case = _case(seed)
            assert sink.record_case_results(case.to_json(), "fuzz", _results(case, None), build_id, worker_id) == [None, None]
        assert inner.requests == before and len(spool) == 2 and _count(session, Result) == 0  # on disk, not sent
        case = _case(2)
        sink.record_case_results(case.to_json(), "fuzz", _results(case, None), build_id, worker_id)
        assert inner.requests == before + 1 and len(spool) == 0  # the full batch: one request
        assert _count(session, Result) == 6 and _count(session, Case) == 3
        failing = _case(3)  # a failure on a bucket not answered yet is written at once, with its answer
        updates = sink.record_case_results(failing.to_json(), "fuzz", _results(failing), build_id, worker_id)
        assert updates[2] is not None and updates[2].is_new and len(spool) == 0
        again = _case(4)  # a failure on that bucket, answered just now: batched like a passing case
        assert sink.record_case_results(again.to_json(), "fuzz", _results(again), build_id, worker_id) == [None] * 3
        assert len(spool) == 1
        assert sink.close() == 0 and session.scalar(select(Bucket.hit_count)) == 2


@contextlib.contextmanager
def served(url: str, port: int = 0, **settings: object) -> Iterator[str]:
    """``create_app`` on ``url`` under uvicorn on 127.0.0.1 (``port`` 0: a free one), in a thread."""
    server = uvicorn.Server(uvicorn.Config(create_app(Settings(database_url=url, **settings)), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started:  # uvicorn sets `started` once it listens
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=WAIT_S)


def test_the_spool_takes_results_while_the_service_is_down_and_flushes_them_after(
    fresh_database_url: str, tmp_path: Path
) -> None:
    migrations.upgrade(fresh_database_url)
    with served(fresh_database_url, writer_token=TOKEN) as base:
        inner = HttpSink(base, TOKEN, timeout_s=10)
        build_id = inner.register_build(BuildFingerprint(torch="2.13.0"))
        worker_id = inner.register_worker(build_id, "node-1", 1, "cpu")
    port = int(base.rsplit(":", 1)[1])
    cases = [_case(seed) for seed in range(4)]
    with Spool(tmp_path / "slot-0") as spool:
        sink = SpoolingSink(inner, spool, batch_cases=2, batch_age_s=0.0, log=lambda line: None)
        for case in cases:  # the service is down: every write is kept
            sink.record_case_results(case.to_json(), "fuzz", _results(case), build_id, worker_id)
        assert len(spool) == 4 and sink.outages >= 1
        with pytest.raises(SinkUnavailableError):
            inner.known_bucket_keys()
        with served(fresh_database_url, port=port, writer_token=TOKEN):
            assert sink.close() == 0  # flushed, nothing left
            assert inner.known_bucket_keys() == {("eager", "fwd", "out:mismatch")}
    engine = make_engine(fresh_database_url)
    try:
        with Session(engine) as session:
            assert _count(session, Result) == 12 and _count(session, Case) == 4
            assert session.scalar(select(Bucket.hit_count)) == 4
    finally:
        engine.dispose()


def test_fuzz_with_server_and_no_database_url_stores_its_results(fresh_database_url: str, tmp_path: Path) -> None:
    migrations.upgrade(fresh_database_url)
    with served(fresh_database_url, writer_token=TOKEN) as base:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNFUZZ_")}
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        env.update({"ATTNFUZZ_WRITER_TOKEN_FILE": str(token_file), "COLUMNS": "200"})
        run = subprocess.run(
            [sys.executable, "-m", "attnfuzz", "fuzz", "--server", base, "--max-cases", "6", "--workers", "1", "--json",
             "--no-shrink", "--corpus", "", "--backend", PLANTED, "--max-seqlen", "16", "--spool-dir", str(tmp_path / "spool")],
            cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, env=env, timeout=600,
        )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert TOKEN not in run.stdout + run.stderr
    summary = json.loads(run.stdout)
    assert summary["cases"] >= 1
    engine = make_engine(fresh_database_url)
    try:
        with Session(engine) as session:
            assert _count(session, Result) >= summary["cases"]
            assert session.scalar(select(Worker.status)) == "stopped"
    finally:
        engine.dispose()


def test_the_writer_token_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert writer_token_from_env({"ATTNFUZZ_WRITER_TOKEN": " abc \n"}) == "abc"
    secret = tmp_path / "token"
    secret.write_text("from-file\n")
    assert writer_token_from_env({"ATTNFUZZ_WRITER_TOKEN_FILE": str(secret)}) == "from-file"
    assert writer_token_from_env({}) is None
    with pytest.raises(SinkFatalError, match="empty"):
        secret.write_text("\n")
        writer_token_from_env({"ATTNFUZZ_WRITER_TOKEN_FILE": str(secret)})


def test_a_batch_that_runs_past_its_lock_timeout_is_503_for_the_worker_to_retry(
    sink_of: Callable[..., HttpSink], session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's lock_not_available (55P03, a row held past ``SET LOCAL lock_timeout``) is a
    fault, not a bug: 503 with Retry-After, so the spool keeps the batch (it was a 500)."""
    from sqlalchemy.exc import OperationalError

    from service.db import batch

    class LockNotAvailable(Exception):
        sqlstate = "55P03"

    def held(*args: object, **kwargs: object) -> None:
        raise OperationalError("INSERT INTO results ...", {}, LockNotAvailable("canceling statement due to lock timeout"))

    sink = sink_of()
    build_id = sink.register_build(BuildFingerprint(torch="2.13.0"))
    monkeypatch.setattr(batch, "ingest_case_batch", held)
    case = _case(9)
    with pytest.raises(SinkUnavailableError, match="503"):
        sink.record_batch([_payload(case, _results(case), build_id, None)])
    assert _count(session, Result) == 0


def _stored_allowances(case: AttentionCase) -> dict:
    """Metrics carrying the allowances a worker stores with a verdict (the repro download uses
    stored figures only)."""
    from service.export.allowance import computed_allowance

    return {name: {"allowed_global": a.whole, "tile_allowed": a.tiles} for name, a in computed_allowance(case).items()}


def _summary(stats: object, base: str, **kwargs: object) -> str:
    """`print_summary` of ``stats`` after ``fuzz --server base``, as one line of words."""
    from service.cli.common import out
    from service.cli.fuzz_display import print_summary

    with out.capture() as captured:
        print_summary(stats, base, server=True, **kwargs)
    return " ".join(captured.get().split())


def test_after_fuzz_server_the_hints_name_the_service_and_its_download_never_a_database(
    client: TestClient, store: SqlStore
) -> None:
    """A new-user trial: after ``fuzz --server URL`` the summary said ``report --db URL``, ``serve
    --db URL``, ``export CASE --db URL`` and ``fuzz --max-cases 0 --db URL`` with the service's
    http URL, and each failed (those options take a database URL). Now: the dashboard's pages, the
    service's repro download (which answers the file), ``fuzz --max-cases 0 --server URL``, and
    for a plugin the service cannot import, ``export`` with its spec on the service's database."""
    from fuzzer.minimise import MinimiseOutcome
    from fuzzer.worker import WorkerStats

    base = "http://testserver"
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    case = AttentionCase(seqlen_q=4, seqlen_k=4, num_heads=2, head_dim=16, causal=True, dtype="float32")
    store.record_case(case.to_json(), "fuzz")
    store.record_result(CaseResult(case.case_id, "torch-cpu-math", "is_causal", "fail", signature="out:mismatch",
                                   metrics=_stored_allowances(case)), build_id, None)
    found, plugin = ("torch-cpu-math", "is_causal", "out:mismatch"), ("planted-fa4", "te_window", "out:all_zero")
    stats = WorkerStats(cases=2, wall_s=1.0, shrink_s=0.5)
    stats.results.update({"fail": 2})
    stats.new_buckets = [found, plugin]
    stats.first_cases = {found: case.case_id, plugin: "cccc000011112222"}
    text = _summary(stats, base, specs={"planted-fa4": PLANTED})
    assert "--db" not in text, text
    assert f"stored through the service at {base}; see them on its dashboard: {base}/buckets" in text, text
    assert f"a case's page: {base}/cases/{case.case_id})" in text, text  # a real case, not a placeholder
    assert f"only shrinking: attnfuzz fuzz --max-cases 0 --server {base} --backend {PLANTED}," in text, text
    download = text.split("a standalone pytest repro of the first bucket's case: ", 1)[1].split(" ", 1)[0]
    assert download == f"{base}/api/cases/{case.case_id}/repro.py?backend=torch-cpu-math&variant=is_causal", text
    response = client.get(download.removeprefix(base))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/x-python") and "VARIANT = 'is_causal'" in response.text
    assert client.get(f"/cases/{case.case_id}").status_code == client.get("/buckets").status_code == 200
    # a plugin's minimised case: no download there (the service knows no module:attr), export with the spec
    minimal = AttentionCase(seqlen_q=1, seqlen_k=1, num_heads=1, head_dim=8, causal=True)
    stats.minimised = [(plugin, MinimiseOutcome(status="minimised", case=minimal, original=minimal, attempts=1,
                                                elapsed_s=0.1, note=""))]
    text = _summary(stats, base, specs={"planted-fa4": PLANTED})
    assert f"export {minimal.case_id} --backend {PLANTED} --variant te_window --db DATABASE_URL" in text, text
    assert "--db http" not in text and "repro.py" not in text, text
    stats.new_buckets, stats.minimised = [], []  # failures in known buckets only: the service's list, not buckets list
    assert f"see the service's {base}/buckets" in _summary(stats, base)


def test_a_shrink_only_run_through_the_service_runs_as_the_summary_prints_it(fresh_database_url: str, tmp_path: Path) -> None:
    """The hint ``fuzz --max-cases 0 --server URL --backend SPEC`` of a bucket not shrunk, run as
    printed (plus test-only speed options), claims the bucket's minimisation through the service
    and stores its minimised case; that run's summary names the dashboard and no ``--db``."""
    import shlex

    import httpx

    from fuzzer.worker import WorkerStats

    migrations.upgrade(fresh_database_url)
    causal = AttentionCase(seqlen_q=6, seqlen_k=6, num_heads=2, head_dim=16, dtype="float32", causal=True, backward=False)
    key = ("planted-fa4", "te_window", "out:all_zero")  # the planted bug: fails on every causal case
    engine = make_engine(fresh_database_url)
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        store.record_case(causal.to_json(), "fuzz")
        store.record_result(CaseResult(causal.case_id, *key[:2], "fail", signature=key[2]), build_id, None)
    finally:
        engine.dispose()
    stats = WorkerStats(cases=1, wall_s=1.0, shrink_s=0.5)
    stats.results.update({"fail": 1})
    stats.new_buckets, stats.first_cases = [key], {key: causal.case_id}
    with served(fresh_database_url, writer_token=TOKEN) as base:
        text = _summary(stats, base, specs={"planted-fa4": PLANTED})
        printed = text.split("only shrinking: ", 1)[1].split(", with this run's", 1)[0]
        assert printed == f"attnfuzz fuzz --max-cases 0 --server {base} --backend {PLANTED}", text
        env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNFUZZ_")}
        env.update({"ATTNFUZZ_WRITER_TOKEN": TOKEN, "COLUMNS": "400"})
        run = subprocess.run(
            [sys.executable, "-m", "attnfuzz", *shlex.split(printed)[1:], "--isolation", "none", "--shrink-deadline", "60",
             "--spool-dir", str(tmp_path / "spool")],
            cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, env=env, timeout=600,
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        said = " ".join(run.stdout.split())
        assert f"1 bucket(s) found earlier, shrunk in this run: {' / '.join(key)}" in said, said
        assert "--db" not in said and f"see them on its dashboard: {base}/buckets" in said, said
        assert httpx.get(f"{base}/buckets", timeout=30).status_code == 200
    engine = make_engine(fresh_database_url)
    try:
        with Session(engine) as session:
            bucket = session.scalar(select(Bucket).where(Bucket.backend == key[0]))
            assert bucket.minimised_case_id is not None, bucket.minimise_note
            assert session.get(Case, bucket.minimised_case_id).seqlen_q <= causal.seqlen_q
    finally:
        engine.dispose()
