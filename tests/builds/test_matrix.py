"""service/matrix/grid.py on a database built by the migrations (SQLite, and PostgreSQL when
reachable): builds with package versions, line order, replays and skips, the matrix, regressions
and fixes per device, bisections, corpus export and import; and the /matrix pages and API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from fuzzer.builds.bisect import bisect_builds
from fuzzer.builds.versions import build_packages
from fuzzer.results import BuildFingerprint, CaseResult, ReplayOutcome, ReplayTask, Skip, Verdict
from oracle.config import AttentionCase
from service.matrix import bisection_rows, corpus_rows, grid, lines, replay_rows
from service.db import migrations
from service.api.deps import get_session
from service.api.routes import matrix as matrix_routes
from service.api.app import create_app
from service.db.engine import make_engine
from service.errors import FieldValidationError, NotFoundError
from service.db.models import BuildPackage, ReplayRun, Result
from service.settings import Settings
from service.db.build_rows import register_build
from service.db.store import SqlStore

CASE = AttentionCase(batch_size=2, seqlen_q=1024, seqlen_k=1024, num_heads=8, head_dim=128, causal=True)
TE_STYLE = ReplayTask(CASE, "fa4", "te_style", "corpus:fa4/te_style-x.json", "fail", "out:all_zero")
NATIVE = ReplayTask(CASE, "fa4", "native", "corpus:fa4/native-x.json", "pass", None)
B200 = ("NVIDIA B200", "10.0")
H200 = ("NVIDIA H200", "9.0")


def fingerprint(fa4: str, device=B200, torch="2.11.0") -> BuildFingerprint:
    return BuildFingerprint(torch=torch, cuda="13.0", flash_attn_4=fa4, device_name=device[0], compute_capability=device[1])


def result(task: ReplayTask, status: str, signature: str | None = None) -> CaseResult:
    return CaseResult(
        task.case.case_id, task.backend, task.variant, status, signature=signature,
        signatures=(signature,) if signature else (), phase="replay",
    )


def outcome(fa4: str, te_style: tuple[str, str | None] | None, device=B200, torch="2.11.0") -> ReplayOutcome:
    """A replay of the seed case on an FA4 build: ``te_style`` is ``(status, signature)``, or
    None for a build that cannot import (both tasks skipped)."""
    fp = fingerprint(fa4, device, torch)
    packages = build_packages(fp, {"flash-attn-4": fa4, "nvidia-cutlass-dsl": "4.8.1"})
    if te_style is None:
        skips = tuple(Skip(CASE.case_id, t.backend, t.variant, "cannot import flash_attn.cute.interface") for t in (TE_STYLE, NATIVE))
        return ReplayOutcome((TE_STYLE, NATIVE), fp, packages, (), skips)
    results = (result(TE_STYLE, *te_style), result(NATIVE, "pass"))
    return ReplayOutcome((TE_STYLE, NATIVE), fp, packages, results, ())


@pytest.fixture
def fa4_line(connection) -> dict[str, int]:
    """The seed case replayed on FA4 builds of a B200 (b9 and b11 good, b29 broken, b30/b31 all
    zeros, b36 fixed) and on an H200 (b30 passes there); build ids by label."""
    ids = {}
    for fa4, te_style in [
        ("4.0.0b30", ("fail", "out:all_zero")),
        ("4.0.0b11", ("pass", None)),
        ("4.0.0b9", ("pass", None)),
        ("4.0.0b29", None),
        ("4.0.0b31", ("fail", "out:all_zero")),
        ("4.0.0b36", ("pass", None)),
    ]:
        record = replay_rows.record_replay(connection, outcome(fa4, te_style), trigger="builds")
        ids[fa4] = record.build.build_id
    ids["h200"] = replay_rows.record_replay(connection, outcome("4.0.0b30", ("pass", None), H200), trigger="builds").build.build_id
    return ids


def test_a_build_registers_once_with_its_package_versions(connection):
    fp = fingerprint("4.0.0b30")
    first = register_build(connection, fp, {"nvidia-cutlass-dsl": "4.8.1", "quack-kernels": "0.6.5"})
    again = register_build(connection, fp, {"Quack_Kernels": "0.6.5", "nvidia-cutlass-dsl": "4.8.1"})
    assert first.is_new and not again.is_new and first.build_id == again.build_id
    assert first.build_key != fp.fingerprint_id, "packages beyond the fingerprint's lines are part of the identity"
    assert register_build(connection, fp).build_key == fp.fingerprint_id, "the fingerprint alone: the worker's identity"
    rows = dict(connection.execute(select(BuildPackage.package, BuildPackage.version).where(BuildPackage.build_id == first.build_id)).all())
    assert rows == {"cuda": "13.0", "flash-attn-4": "4.0.0b30", "nvidia-cutlass-dsl": "4.8.1", "quack-kernels": "0.6.5", "torch": "2.11.0"}


def test_builds_differing_only_in_a_plugin_package_are_different_builds(connection):
    fp = BuildFingerprint(torch="2.13.0")
    one = register_build(connection, fp, {"attnfuzz-fakekernel": "1.0"})
    two = register_build(connection, fp, {"attnfuzz-fakekernel": "1.1"})
    assert one.build_id != two.build_id and one.is_new and two.is_new
    assert [b.version for b in lines.line_builds(connection, "attnfuzz-fakekernel")] == ["1.0", "1.1"]


def test_a_line_orders_builds_by_pep440_version_then_first_seen(connection, fa4_line):
    extra = replay_rows.record_replay(connection, outcome("4.0.0b30", ("fail", "out:all_zero"), torch="2.12.0"), trigger="cli")
    builds = lines.line_builds(connection, "flash-attn-4")
    order = [(b.version, b.build_id) for b in builds if b.device_name == B200[0]]
    assert [v for v, _ in order] == ["4.0.0b9", "4.0.0b11", "4.0.0b29", "4.0.0b30", "4.0.0b30", "4.0.0b31", "4.0.0b36"]
    assert [i for v, i in order if v == "4.0.0b30"] == [fa4_line["4.0.0b30"], extra.build.build_id]
    assert [b.version for b in lines.line_builds(connection, "flash-attn-4", device_name="NVIDIA H200")] == ["4.0.0b30"]
    assert ("flash-attn-4", 8) in lines.package_lines(connection)


def test_the_matrix_shows_each_verdict_and_marks_the_regression_and_the_fix(connection, fa4_line):
    m = grid.build_matrix(connection, "Flash_Attn_4", device_name="NVIDIA B200")
    assert m.package == "flash-attn-4" and [b.version for b in m.builds] == ["4.0.0b9", "4.0.0b11", "4.0.0b29", "4.0.0b30", "4.0.0b31", "4.0.0b36"]
    te_style, native = m.rows
    assert (te_style.variant, native.variant) == ("te_style", "native"), "rows with a regression come first"
    assert [(c.status, c.signature, c.transition) for c in te_style.cells] == [
        ("pass", None, None),
        ("pass", None, None),
        ("skip", None, None),
        ("fail", "out:all_zero", "regression"),
        ("fail", "out:all_zero", None),
        ("pass", None, "fix"),
    ]
    assert "cannot import" in te_style.cells[2].detail
    assert [c.status for c in native.cells] == ["pass", "pass", "skip", "pass", "pass", "pass"] and not native.transitions
    assert [r.variant for r in grid.build_matrix(connection, "flash-attn-4", changes_only=True).rows] == ["te_style"]


def test_regressions_and_fixes_are_found_per_device_stepping_over_skips(connection, fa4_line):
    rows = grid.find_regressions(connection, "flash-attn-4")
    assert [(r.kind, r.device_name, r.before_version, r.after_version, r.after_signature) for r in rows] == [
        ("regression", "NVIDIA B200", "4.0.0b11", "4.0.0b30", "out:all_zero"),
        ("fix", "NVIDIA B200", "4.0.0b31", "4.0.0b36", None),
    ], "the H200 build passing b30 is not a fix of the B200's b30"
    assert [r.kind for r in grid.find_regressions(connection, "flash-attn-4", kinds=["fix"])] == ["fix"]
    assert grid.find_regressions(connection, "flash-attn-4", backend="te-fa4") == []
    with pytest.raises(FieldValidationError, match="kind: unknown value 'worse'"):
        grid.find_regressions(connection, "flash-attn-4", kinds=["worse"])


def test_regressions_of_a_built_matrix_match_find_regressions_and_limits_keep_the_total(connection, fa4_line):
    full = grid.build_matrix(connection, "flash-attn-4", limit=None)
    assert grid.regressions_of(full) == grid.find_regressions(connection, "flash-attn-4")
    assert [r.kind for r in grid.regressions_of(full, ["fix"])] == ["fix"]
    one = grid.limited(full, 1)
    assert len(one.rows) == 1 and one.total_rows == full.total_rows > 1 and one.truncated
    assert one.rows[0] == full.rows[0] and grid.limited(full, None) is full


def test_the_matrix_page_lists_the_line_regressions_without_a_device_filter(client, connection, fa4_line):
    html = client.get("/matrix", params={"package": "flash-attn-4", "limit": 1}).text
    expected = grid.find_regressions(connection, "flash-attn-4")
    assert len(expected) == 2
    assert f"Regressions and fixes ({len(expected)})" in html  # the full list, not cut by the row limit


def test_a_new_signature_on_a_later_build_counts_with_the_regressions(connection, fa4_line):
    replay_rows.record_replay(connection, outcome("4.0.0b33", ("fail", "lse:nan")), trigger="builds")
    kinds = [(r.kind, r.after_version) for r in grid.find_regressions(connection, "flash-attn-4")]
    assert ("new_signature", "4.0.0b33") in kinds


def test_replayed_results_are_stored_once_and_count_in_their_bucket(connection, fa4_line):
    again = replay_rows.record_replay(connection, outcome("4.0.0b30", ("fail", "out:all_zero")), trigger="cli")
    assert again.build.build_id == fa4_line["4.0.0b30"] and not again.build.is_new
    stored = connection.execute(
        select(Result.status).where(Result.build_id == fa4_line["4.0.0b30"], Result.variant == "te_style")
    ).scalars().all()
    assert stored == ["fail"]
    (task,) = [t for t in replay_rows.replay_tasks_from_buckets(connection) if t.variant == "te_style"]
    assert task.case == CASE and task.source.startswith("bucket:")


def test_a_replay_that_never_reported_its_build_stores_nothing(connection):
    lost = ReplayOutcome((TE_STYLE,), None, {}, (), (Skip(CASE.case_id, "fa4", "te_style", "child died"),))
    record = replay_rows.record_replay(connection, lost, trigger="builds")
    assert record.build is None and record.run_id is None and record.skip_count == 1
    with pytest.raises(FieldValidationError, match="trigger: unknown value 'cron'"):
        replay_rows.record_replay(connection, lost, trigger="cron")


def test_build_history_knows_which_backends_a_build_was_replayed_for(connection):
    build_id = SqlStore(connection).register_build(fingerprint("4.0.0b36"))
    history = replay_rows.SqlBuildHistory(connection)
    assert not history.is_replayed(build_id, ["fa4"])
    skip = Skip(CASE.case_id, "te-fa4", "mask_type", "TransformerEngine is not installed")
    history.record_replay(build_id, {"transformer-engine": ""}, ["fa4", "te-fa4"], [skip], {CASE.case_id: CASE.to_json()}, 3, "worker")
    assert history.is_replayed(build_id, ["fa4"]) and history.is_replayed(build_id, ["fa4", "te-fa4"])
    assert not history.is_replayed(build_id, ["fa4", "fa2"])
    run = connection.execute(select(ReplayRun.trigger, ReplayRun.skip_count).where(ReplayRun.build_id == build_id)).one()
    assert tuple(run) == ("worker", 1)
    with pytest.raises(NotFoundError):
        history.record_replay(10**6, {}, ["fa4"], [], {}, 0, "worker")


def test_a_bisection_stores_every_step_and_its_outcome(connection, fa4_line):
    versions = ["4.0.0b11", "4.0.0b29", "4.0.0b30", "4.0.0b31", "4.0.0b36"]
    verdicts = {
        "4.0.0b11": Verdict("pass"),
        "4.0.0b29": Verdict("skip", None, "ImportError"),
        "4.0.0b30": Verdict("fail", "out:all_zero"),
        "4.0.0b31": Verdict("fail", "out:all_zero"),
        "4.0.0b36": Verdict("fail", "out:all_zero"),
    }
    run_id = bisection_rows.start_bisect(
        connection, case=CASE, backend="fa4", variant="te_style", package="flash-attn-4",
        good_version="4.0.0b11", bad_version="4.0.0b36", signature=None,
    )
    build_ids = {v: fa4_line.get(v) for v in versions}
    outcome_ = bisect_builds(versions, verdicts.__getitem__, on_step=lambda s: bisection_rows.record_bisect_step(connection, run_id, s, build_ids[s.version]))
    bisection_rows.finish_bisect(connection, run_id, outcome_, build_ids)
    view = bisection_rows.get_bisection(connection, run_id)
    assert (view.run.status, view.run.last_good_version, view.run.first_bad_version) == ("ambiguous", "4.0.0b11", "4.0.0b30")
    assert view.run.candidates == ["4.0.0b29", "4.0.0b30"] and view.run.replays == len(view.steps) == outcome_.replays
    assert [s.verdict for s in view.steps] == [s.verdict for s in outcome_.steps]
    assert view.run.first_bad_build_id == fa4_line["4.0.0b30"] and view.run.finished_at is not None
    assert [r.id for r in bisection_rows.list_bisections(connection, "flash-attn-4")] == [run_id]
    with pytest.raises(NotFoundError, match="bisection"):
        bisection_rows.get_bisection(connection, run_id + 1)


def test_the_corpus_exports_each_buckets_case_with_verdicts_and_imports_elsewhere(connection, fa4_line, tmp_path):
    entries = corpus_rows.corpus_entries_from_db(connection, backends=["fa4"])
    (entry,) = entries
    assert (entry.backend, entry.variant, entry.case) == ("fa4", "te_style", CASE)
    assert (entry.expected_status, entry.expected_signature) == ("pass", None), "the newest verdict (b36, fixed) is expected"
    by_version = {
        dict(v.packages)["flash-attn-4"]: (v.status, v.signature) for v in entry.verdicts if v.build.device_name == B200[0]
    }
    assert len(entry.verdicts) == 6, "one verdict per build: five judged B200 builds and the H200 one"
    assert by_version["4.0.0b30"] == ("fail", "out:all_zero") and by_version["4.0.0b11"] == ("pass", None)
    assert "4.0.0b29" not in by_version, "a skip is not a verdict"
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        stored = corpus_rows.import_corpus(engine, entries)
        assert stored == len(entry.verdicts)
        imported = grid.build_matrix(engine, "flash-attn-4", device_name="NVIDIA B200")
        assert [(b.version, b.fingerprint_id) for b in imported.builds] == [
            (b.version, b.fingerprint_id) for b in lines.line_builds(connection, "flash-attn-4", device_name="NVIDIA B200") if b.version != "4.0.0b29"
        ]
        assert [(r.kind, r.after_version) for r in grid.find_regressions(engine, "flash-attn-4")] == [
            ("regression", "4.0.0b30"),
            ("fix", "4.0.0b36"),
        ]
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------------ pages, API
@pytest.fixture
def client(database, session: Session) -> Iterator[TestClient]:
    app = create_app(Settings(database_url=database.url, api_token=None, read_requires_token=False))
    app.include_router(matrix_routes.api_router)
    app.include_router(matrix_routes.page_router, include_in_schema=False)

    def test_session() -> Iterator[Session]:
        yield session

    app.dependency_overrides[get_session] = test_session
    with TestClient(app) as test_client:
        yield test_client


def test_the_api_gives_lines_builds_matrix_and_regressions(client, fa4_line):
    lines = {line["package"]: line["builds"] for line in client.get("/api/matrix/lines").json()}
    assert lines["flash-attn-4"] == 7
    builds = client.get("/api/matrix/builds", params={"package": "flash-attn-4", "device_name": "NVIDIA B200"}).json()
    assert [b["version"] for b in builds] == ["4.0.0b9", "4.0.0b11", "4.0.0b29", "4.0.0b30", "4.0.0b31", "4.0.0b36"]
    body = client.get("/api/matrix", params={"package": "flash-attn-4", "backend": "fa4", "limit": 1}).json()
    assert body["total_rows"] == 2 and body["truncated"] and body["rows"][0]["variant"] == "te_style"
    assert body["rows"][0]["has_regression"]
    regressions = client.get("/api/matrix/regressions", params={"package": "flash-attn-4", "kind": "regression"}).json()
    assert [(r["before_version"], r["after_version"]) for r in regressions] == [("4.0.0b11", "4.0.0b30")]


@pytest.mark.parametrize(
    ("path", "params", "loc"),
    [
        ("/api/matrix", {"package": ""}, ["query", "package"]),
        ("/api/matrix", {"package": "flash-attn-4", "limit": 0}, ["query", "limit"]),
        ("/api/matrix/regressions", {"package": "flash-attn-4", "kind": "worse"}, ["query", "kind"]),
    ],
)
def test_bad_queries_are_refused_naming_the_field(client, path, params, loc):
    response = client.get(path, params=params)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == loc


def test_the_matrix_page_highlights_the_regression_and_the_fix(client, fa4_line):
    page = client.get("/matrix", params={"package": "flash-attn-4", "device_name": "NVIDIA B200"})
    assert page.status_code == 200
    html = page.text
    assert html.count('data-transition="regression"') == 1 and html.count('data-transition="fix"') == 1
    assert 'data-status="skip"' in html and "out:all_zero" in html
    assert html.index("4.0.0b9<") < html.index("4.0.0b11<") < html.index("4.0.0b36<")
    assert client.get("/matrix").status_code == 200 and "flash-attn-4" in client.get("/matrix").text


def test_the_bisection_page_and_api_show_the_steps(client, connection, fa4_line):
    run_id = bisection_rows.start_bisect(
        connection, case=CASE, backend="fa4", variant="te_style", package="flash-attn-4",
        good_version="4.0.0b11", bad_version="4.0.0b31", signature="out:all_zero",
    )
    verdicts = {"4.0.0b11": Verdict("pass"), "4.0.0b30": Verdict("fail", "out:all_zero"), "4.0.0b31": Verdict("fail", "out:all_zero")}
    found = bisect_builds(list(verdicts), verdicts.__getitem__, signature="out:all_zero",
                          on_step=lambda s: bisection_rows.record_bisect_step(connection, run_id, s, fa4_line.get(s.version)))
    bisection_rows.finish_bisect(connection, run_id, found, fa4_line)
    body = client.get(f"/api/matrix/bisections/{run_id}").json()
    assert (body["status"], body["first_bad_version"], body["replays"]) == ("found", "4.0.0b30", 3)
    assert [s["verdict"] for s in body["steps"]] == ["bad", "good", "bad"]
    page = client.get(f"/matrix/bisections/{run_id}")
    assert page.status_code == 200 and "4.0.0b30" in page.text and page.text.count("<td class=\"num\">") >= 3
    assert client.get(f"/api/matrix/bisections/{run_id + 1}").status_code == 404
