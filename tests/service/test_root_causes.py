"""Root-cause groups and severity in storage, the API, the pages and ``attnfuzz report`` (issue 14
items 4-5): sibling leases, attached buckets, one defect per (backend, minimised case), severity
from the signature and the largest error ratio, and severity ordering everywhere."""

from __future__ import annotations

import json
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from fuzzer.results import BuildFingerprint, CaseResult
from fuzzer.severity import severity
from oracle.config import AttentionCase
from service.db.models import Bucket, Defect, Result, UTCDateTime, utcnow
from service.db.store import SqlStore

CASE = AttentionCase(batch_size=2, seqlen_q=33, seqlen_k=65, num_heads=2, causal=True)
OTHER = AttentionCase(batch_size=1, seqlen_q=17, seqlen_k=19, num_heads=2, causal=True)
MINIMAL = AttentionCase(seqlen_q=1, seqlen_k=2, causal=True)


def _fail(case: AttentionCase, variant: str, signature: str, backend: str = "fa4", ratio: float | None = None) -> CaseResult:
    status = "crash" if signature == "crash" else "error" if signature.startswith("error:") else "fail"
    return CaseResult(case.case_id, backend, variant, status, signature=signature, error_ratio=ratio)


def _record(store: SqlStore, build_id: int, *results: CaseResult) -> list[int]:
    ids = []
    for r in results:
        store.record_case(CASE.to_json() if r.case_id == CASE.case_id else OTHER.to_json(), "fuzz")
        ids.append(store.record_result(r, build_id, None).bucket_id)
    return ids


def test_severity_rule() -> None:
    assert severity("out:all_zero") == severity("lse:neginf") == severity("dq:nan") == "wrong"
    assert severity("out:mismatch", 1.5) == severity("dk:tile_mismatch", 9.99) == "imprecise"
    assert severity("out:mismatch", 10.0) == severity("out:mismatch", float("nan")) == "wrong"
    assert severity("crash") == severity("timeout") == severity("oom") == "crash"
    assert severity("error:RuntimeError") == severity("error:declaration_gap") == "error"


def test_a_claim_leases_the_same_failure_of_the_same_case_through_other_variants(store: SqlStore, session: Session) -> None:
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    a, b, c, other = _record(
        store, build_id,
        _fail(CASE, "a", "out:all_zero"), _fail(CASE, "b", "out:all_zero"), _fail(CASE, "c", "out:mismatch", ratio=50.0),
        _fail(OTHER, "b2", "out:all_zero"),
    )
    one = store.register_worker(build_id, "h", 1, "cpu")
    two = store.register_worker(build_id, "h", 2, "cpu")
    claim = store.claim_minimisation(one, ["fa4"], lease_s=60.0)
    assert claim.bucket_id == a and claim.siblings == ((b, ("fa4", "b", "out:all_zero")),)
    # another worker gets neither a nor its sibling b: the other signature and the other case
    assert store.claim_minimisation(two, ["fa4"], lease_s=60.0).bucket_id == c
    assert store.claim_minimisation(two, ["fa4"], lease_s=60.0).bucket_id == other
    assert store.claim_minimisation(two, ["fa4"], lease_s=60.0) is None

    # renewing the claim renews the sibling; an expired pair is taken over together
    later = utcnow() + timedelta(seconds=50)
    assert store.renew_minimisation(a, one, lease_s=60.0, now=later)
    session.expire_all()
    assert session.get(Bucket, b).minimise_lease_expires_at == session.get(Bucket, a).minimise_lease_expires_at

    attached = store.record_minimised(
        a, MINIMAL.to_json(), CASE.case_id, "minimised: test", worker_id=one,
        attach=[("b", "out:all_zero"), ("c", "out:mismatch"), ("a", "out:all_zero"), ("zz", "out:nan")],
    )
    # c is held by worker two (a live lease): not attached; unknown keys are ignored
    assert attached == [b]
    session.expire_all()
    ba, bb, bc = (session.get(Bucket, i) for i in (a, b, c))
    assert ba.minimised_case_id == bb.minimised_case_id == MINIMAL.case_id
    assert bb.minimise_note.startswith("attached") and f"bucket {a}" in bb.minimise_note
    assert (bb.minimise_owner_id, ba.minimise_owner_id) == (None, None)
    assert ba.defect_id is not None and ba.defect_id == bb.defect_id
    assert bc.minimised_case_id is None and bc.minimise_owner_id == two and bc.defect_id is None

    # worker two minimises c to the same case on its own: same backend, same case, same defect
    store.record_minimised(c, MINIMAL.to_json(), CASE.case_id, "minimised: test", worker_id=two)
    session.expire_all()
    assert session.get(Bucket, c).defect_id == ba.defect_id
    defects = session.scalars(select(Defect)).all()
    assert [(d.backend, d.case_id) for d in defects] == [("fa4", MINIMAL.case_id)]


def test_an_attached_bucket_leased_by_a_dead_worker_is_attached_and_siblings_not_attached_are_released(
    store: SqlStore, session: Session
) -> None:
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    a, b, c = _record(store, build_id, *(_fail(CASE, v, "out:all_zero") for v in ("a", "b", "c")))
    one = store.register_worker(build_id, "h", 1, "cpu")
    claim = store.claim_minimisation(one, ["fa4"], lease_s=60.0)
    assert [i for i, _ in claim.siblings] == [b, c]
    store.record_minimised(a, MINIMAL.to_json(), CASE.case_id, "minimised: t", worker_id=one, attach=[("b", "out:all_zero")])
    session.expire_all()
    assert session.get(Bucket, b).minimised_case_id == MINIMAL.case_id
    released = session.get(Bucket, c)
    assert (released.minimised_case_id, released.minimise_owner_id) == (None, None), "c goes back to the queue"
    two = store.register_worker(build_id, "h", 2, "cpu")
    assert store.claim_minimisation(two, ["fa4"], lease_s=60.0).bucket_id == c


def test_releasing_a_claim_releases_its_siblings(store: SqlStore, session: Session) -> None:
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    a, b = _record(store, build_id, _fail(CASE, "a", "crash"), _fail(CASE, "b", "crash"))
    one = store.register_worker(build_id, "h", 1, "cpu")
    assert store.claim_minimisation(one, ["fa4"], lease_s=60.0).siblings == ((b, ("fa4", "b", "crash")),)
    store.release_minimisation(a, one, "not minimised: gave up")
    session.expire_all()
    assert session.get(Bucket, b).minimise_owner_id is None and session.get(Bucket, b).minimise_note == ""
    assert session.get(Bucket, a).minimise_note == "not minimised: gave up"


def test_a_bucket_severity_follows_its_largest_error_ratio(store: SqlStore, session: Session) -> None:
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    (bucket_id,) = _record(store, build_id, _fail(CASE, "a", "out:mismatch", ratio=2.5))
    bucket = session.get(Bucket, bucket_id)
    assert (bucket.severity, bucket.max_error_ratio) == ("imprecise", 2.5)
    store.record_case(OTHER.to_json(), "fuzz")
    store.record_result(_fail(OTHER, "a", "out:mismatch", ratio=1.2), build_id, None)
    session.expire_all()
    assert (session.get(Bucket, bucket_id).severity, session.get(Bucket, bucket_id).max_error_ratio) == ("imprecise", 2.5)
    store.record_case(MINIMAL.to_json(), "fuzz")
    store.record_result(_fail(MINIMAL, "a", "out:mismatch", ratio=40.0), build_id, None)
    session.expire_all()
    assert (session.get(Bucket, bucket_id).severity, session.get(Bucket, bucket_id).max_error_ratio) == ("wrong", 40.0)


def _severity_mix(store: SqlStore) -> dict[str, int]:
    """Buckets of every severity, recorded least severe first (so newest-first would be wrong)."""
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    ids = _record(
        store, build_id,
        _fail(CASE, "v1", "error:RuntimeError"),
        _fail(CASE, "v2", "out:mismatch", ratio=3.0),
        _fail(CASE, "v3", "crash"),
        _fail(CASE, "v4", "dq:mismatch", ratio=12.0),
        _fail(CASE, "v5", "out:all_zero"),
    )
    return dict(zip(("error", "imprecise", "crash", "wrong-ratio", "wrong-zero"), ids))


def test_the_api_and_the_bucket_list_sort_by_severity_by_default(client: TestClient, store: SqlStore) -> None:
    ids = _severity_mix(store)
    items = client.get("/api/buckets").json()["items"]
    assert [b["severity"] for b in items] == ["wrong", "wrong", "crash", "imprecise", "error"]
    assert [b["id"] for b in items[:2]] == [ids["wrong-zero"], ids["wrong-ratio"]], "one severity: newest first"
    assert items[1]["max_error_ratio"] == 12.0
    ascending = client.get("/api/buckets", params={"sort": "severity"}).json()["items"]
    assert [b["severity"] for b in ascending] == ["error", "imprecise", "crash", "wrong", "wrong"]
    page = client.get("/buckets").text
    positions = [page.index(f'data-bucket-id="{ids[k]}"') for k in ("wrong-zero", "wrong-ratio", "crash", "imprecise", "error")]
    assert positions == sorted(positions)
    assert 'class="severity severity-wrong"' in page


def test_the_bucket_page_and_api_show_the_other_symptoms_of_its_defect(client: TestClient, store: SqlStore) -> None:
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    a, b = _record(store, build_id, _fail(CASE, "a", "out:all_zero"), _fail(CASE, "b", "out:mismatch", ratio=30.0))
    store.record_minimised(a, MINIMAL.to_json(), CASE.case_id, "minimised: t", attach=[("b", "out:mismatch")])
    detail = client.get(f"/api/buckets/{a}").json()
    assert detail["defect_id"] is not None
    assert [(g["id"], g["signature"], g["defect_id"]) for g in detail["group"]] == [(b, "out:mismatch", detail["defect_id"])]
    grouped = client.get("/api/buckets", params={"defect_id": detail["defect_id"]}).json()["items"]
    assert sorted(x["id"] for x in grouped) == [a, b]
    page = client.get(f"/buckets/{a}").text
    assert f'href="/buckets/{b}"' in page and f"defect {detail['defect_id']}" in page


def test_report_lists_buckets_most_severe_first_with_their_groups(tmp_path) -> None:
    from typer.testing import CliRunner

    from service.db import migrations
    from service.cli.main import app
    from service.db.engine import make_engine

    url = f"sqlite:///{tmp_path / 'r.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        store = SqlStore(engine)
        ids = _severity_mix(store)
        store.record_minimised(
            ids["wrong-zero"], MINIMAL.to_json(), CASE.case_id, "minimised: t", attach=[("v4", "dq:mismatch")]
        )
    finally:
        engine.dispose()
    result = CliRunner().invoke(app, ["report", "--db", url, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [b["severity"] for b in data["buckets"]] == ["wrong", "wrong", "crash", "imprecise", "error"]
    (defect,) = data["defects"]
    assert sorted(defect["bucket_ids"]) == sorted([ids["wrong-zero"], ids["wrong-ratio"]])
    assert sorted(defect["symptoms"]) == [["v4", "dq:mismatch"], ["v5", "out:all_zero"]]
    text = CliRunner().invoke(app, ["report", "--db", url])
    assert text.exit_code == 0, text.output
    lines = [line for line in text.output.splitlines() if "fa4 / v" in line]
    assert [line.split()[0] for line in lines] == ["wrong", "wrong", "crash", "imprecise", "error"]
    # the severities and groups are explained above the buckets (a new-user trial found them unexplained)
    output = " ".join(text.output.split())
    assert "5 bucket(s), most severe first: wrong (all-zero" in output and "defect N:" in output
    assert f"[bucket {ids['wrong-zero']}]" in output  # the id report --bucket and buckets show take
    assert "[bucket ID]: for report --bucket ID" in output
    assert "no buckets" not in output


def test_report_of_a_database_without_buckets_says_so(tmp_path) -> None:
    """An empty database's report ends with a line saying there is no bucket, not with nothing
    (a new-user trial could not tell "none" from "not shown")."""
    from typer.testing import CliRunner

    from service.cli.main import app
    from service.db import migrations

    url = f"sqlite:///{tmp_path / 'e.db'}"
    migrations.upgrade(url)
    result = CliRunner().invoke(app, ["report", "--db", url])
    assert result.exit_code == 0, result.output
    assert "no buckets: no failing result is stored" in result.output
    assert "most severe first" not in result.output
    listed = CliRunner().invoke(app, ["buckets", "list", "--db", url], env={"COLUMNS": "250"})
    assert listed.exit_code == 0 and f"no buckets in {url}: no failing result is stored" in listed.output, listed.output


def test_migration_0005_backfills_severity_ratios_and_defects(fresh_database_url: str) -> None:
    """Buckets stored before 0005 get their severity from their results' largest error ratio, and
    those with a minimised case their defect (one per backend and minimised case)."""
    import sqlalchemy as sa

    from service.db import migrations
    from service.db.engine import make_engine

    url = fresh_database_url
    migrations.upgrade(url, "0004")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            old = SqlStore(connection)
            build_id = old.register_build(BuildFingerprint(torch="2.13.0"))
            for c in (CASE, MINIMAL):
                old.record_case(c.to_json(), "fuzz")
            now = utcnow()
            times = {n: sa.column(n, UTCDateTime()) for n in ("first_seen", "last_seen")}
            buckets = sa.table(
                "buckets", *times.values(), *(sa.column(n) for n in (
                    "backend", "variant", "signature", "hit_count", "first_case_id", "minimised_case_id",
                    "minimise_note", "first_build_id", "last_build_id", "triage_state", "notes",
                )),
            )
            rows = [("a", "out:mismatch", MINIMAL.case_id, [2.0, 14.0]), ("b", "out:mismatch", None, [3.0]),
                    ("c", "out:all_zero", MINIMAL.case_id, [None]), ("d", "crash", None, [None])]
            for variant, signature, minimised, ratios in rows:
                connection.execute(buckets.insert().values(
                    backend="fa4", variant=variant, signature=signature, first_seen=now, last_seen=now,
                    hit_count=len(ratios), first_case_id=CASE.case_id, minimised_case_id=minimised, minimise_note="",
                    first_build_id=build_id, last_build_id=build_id, triage_state="new", notes="",
                ))
                for phase, ratio in zip(("fuzz", "replay"), ratios):  # results are unchanged by 0005
                    connection.execute(Result.__table__.insert().values(
                        case_id=CASE.case_id, build_id=build_id, backend="fa4", variant=variant,
                        status="crash" if signature == "crash" else "fail", signature=signature, signatures=[signature],
                        metrics={}, error_ratio=ratio, run_ms=0.0, compile_ms=0.0, oracle_ms=0.0, detail="",
                        backend_version="", phase=phase, created_at=now,
                    ))
        migrations.upgrade(url)
        with Session(engine) as session:
            got = {b.variant: (b.severity, b.max_error_ratio, b.defect_id) for b in session.scalars(select(Bucket))}
            defects = session.scalars(select(Defect)).all()
        assert [(d.backend, d.case_id) for d in defects] == [("fa4", MINIMAL.case_id)]
        assert got == {
            "a": ("wrong", 14.0, defects[0].id),
            "b": ("imprecise", 3.0, None),
            "c": ("wrong", None, defects[0].id),
            "d": ("crash", None, None),
        }
    finally:
        engine.dispose()
