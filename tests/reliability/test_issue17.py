"""Issue 17: no input and no fault kills a worker, fills the server, or loses a result silently.

One test (or a few) per numbered breakage of the issue, each reproduced on commit 992da02 and
failing there; exact row counts wherever data is involved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oracle.config import AttentionCase
from tests.reliability.conftest import counts, query

pytestmark = pytest.mark.timeout(300)

SMALL = AttentionCase(seqlen_q=4, seqlen_k=4, head_dim=8, dtype="float32")


# ------------------------------------------------------------------ 6. concurrent first migrations
@pytest.mark.postgres
def test_6_four_concurrent_first_upgrades_on_postgresql_all_exit_0(cli, postgres_server) -> None:
    url = postgres_server.new_schema_url()
    try:
        runs = [cli("db", "upgrade", "--db", url) for _ in range(4)]
        codes = [run.wait(180) for run in runs]
        assert codes == [0, 0, 0, 0], "\n".join(run.output()[-1500:] for run in runs)
        from service.db import migrations
        assert query(url, "SELECT version_num FROM alembic_version") == [(migrations.head(),)]
        assert counts(url) == dict.fromkeys(counts(url), 0)
    finally:
        postgres_server.drop_schema_of(url)


# ------------------------------------------------------------------ 2. text the database cannot store
HOSTILE = "tests.reliability.hostile:HostileTextBackend"


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres)])
def any_url(request: pytest.FixtureRequest, tmp_path: Path):
    """A migrated database: a SQLite file or a fresh schema on the PostgreSQL test server."""
    from service.db import migrations
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'attnfuzz.db'}"
        migrations.upgrade(url)
        yield url
        return
    server = request.getfixturevalue("postgres_server")
    url = server.new_schema_url()
    try:
        migrations.upgrade(url)
        yield url
    finally:
        server.drop_schema_of(url)


def test_2_hostile_plugin_text_is_stored_escaped_and_cut_and_the_worker_goes_on(cli, any_url, tmp_path) -> None:
    """A plugin name of 80 characters, an exception message with a NUL and a lone surrogate, a
    package name of 200 characters: every result is stored (2 per case), escaped and cut; on
    992da02 the worker died (exit 1) at the first write on both databases."""
    from tests.reliability.hostile import LONG_NAME

    args = ["fuzz", "--db", any_url, "--quiet", "--spool-dir", str(tmp_path / "spool"), "--max-cases", "3",
            "--no-shrink", "--no-replay", "--corpus", "", "--max-seqlen", "16", "--seed", "1", "--backend", HOSTILE]
    run = cli(*args)
    assert run.wait(240) == 0, run.output()[-3000:]
    stored = counts(any_url)
    n = stored["cases"]  # Hypothesis may draw a case twice: each case once, 2 results per case
    assert n >= 1 and stored["results"] == 2 * n and stored["buckets"] == 1 and stored["workers"] == 1, stored
    rows = query(any_url, "SELECT backend, variant, status, detail FROM results ORDER BY id")
    assert {r[0] for r in rows} == {LONG_NAME[:47] + "...[cut 33 chars]"}
    errors = [r for r in rows if r[1] == "boom"]
    assert len(errors) == n and all(r[2] == "error" for r in errors)
    assert all("/tmp/\\udcff.so" in r[3] and "bad byte \\x00 in" in r[3] for r in errors), errors[0]
    assert query(any_url, "SELECT COUNT(*) FROM workers WHERE status = 'stopped'") == [(1,)]
    again = cli(*args)  # the same 3 cases again: nothing left to redo, nothing stored twice
    assert again.wait(240) == 0, again.output()[-3000:]
    after = counts(any_url)
    assert (after["cases"], after["results"], after["buckets"], after["workers"]) == (n, 2 * n, 1, 2), after


# ------------------------------------------------------------------ 1 and 7. poison and malformed corpus files
def _entry(case: dict | None = None, **changes: object) -> dict:
    """A valid corpus entry for torch-cpu-math / bool_mask with a failing verdict."""
    entry = {
        "schema_version": 1,
        "case": case or SMALL.to_json(),
        "backend": "torch-cpu-math",
        "variant": "bool_mask",
        "why": "issue 17",
        "source": "",
        "expected": {"status": "fail", "signature": "out:all_zero"},
        "verdicts": [{"build": {"torch": "2.13.0"}, "status": "fail", "signature": "out:all_zero",
                      "recorded_at": "2026-12-01T00:00:00+00:00", "packages": {"torch": "2.13.0"}}],
    }
    entry.update(changes)
    return entry


def _corpus_with(tmp_path: Path, name: str, content: object) -> tuple[Path, Path]:
    """A corpus directory holding one good file and ``name`` (written from ``content``)."""
    root = tmp_path / "corpus" / "torch-cpu-math"
    root.mkdir(parents=True)
    (root / "bool_mask-good.json").write_text(json.dumps(_entry(AttentionCase(seqlen_q=3, seqlen_k=3, head_dim=8, dtype="float32").to_json())))
    bad = root / name
    if isinstance(content, bytes):
        bad.write_bytes(content)
    elif isinstance(content, str):
        bad.write_text(content)
    elif callable(content):
        content(bad)
    else:
        bad.write_text(json.dumps(content))
    return tmp_path / "corpus", bad


def _symlink_outside(path: Path) -> None:
    """``path`` as a symlink to a valid entry outside the corpus directory."""
    outside = path.parent.parent.parent / "outside.json"
    outside.write_text(json.dumps(_entry()))
    path.symlink_to(outside)


def _verdict(**changes: object) -> dict:
    return {**_entry()["verdicts"][0], **changes}


POISON = {
    "window-1e40": (_entry({**SMALL.to_json(), "window_size_left": 10**40}), "window_size_left"),
    "batch-1e6": (_entry({**SMALL.to_json(), "batch_size": 10**6}), "batch_size"),
    "oracle-too-big": (_entry({**SMALL.to_json(), "batch_size": 60000, "seqlen_q": 2**20, "seqlen_k": 2**20}), "case.case: the float64 oracle would need"),
}
MALFORMED = {
    "deep-nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "not-utf8": (b'{"why": "\xff\xfe"}', "not UTF-8"),
    "verdicts-5": (_entry(verdicts=5), "verdicts: must be a list"),
    "build-list": (_entry(verdicts=[_verdict(build=[1, 2])]), "verdicts[0].build: must be an object"),
    "nul-in-verdict": (_entry(verdicts=[_verdict(recorded_at="2026\x00")]), "verdicts[0].recorded_at: holds a NUL"),
    "long-package": (_entry(verdicts=[_verdict(packages={"p" * 129: "1"})]), "verdicts[0].packages (name): 129 characters"),
    "bad-signature": (_entry(verdicts=[_verdict(signature="out all zero; DROP")]), "verdicts[0].signature"),
    "fifo": (lambda p: os.mkfifo(p), "not a regular file"),
    # a symlink to a valid entry outside the corpus (on 992da02 one to /dev/zero was read to MemoryError)
    "symlink-outside": (lambda p: _symlink_outside(p), "outside the corpus directory"),
    "too-large": (" " * (2 * 2**20) + "{}", "bytes (allowed: at most"),
}


def _in_process(*args: str) -> tuple[int, str]:
    """Run the ``attnfuzz`` app in this process (no interpreter start: these tests are many);
    exit code and output."""
    from typer.testing import CliRunner

    from service.cli.main import app

    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})
    return result.exit_code, " ".join(result.output.split()) + ("" if result.exception is None or isinstance(result.exception, SystemExit) else f" EXCEPTION {result.exception!r}")


PG_KINDS = ("nul-in-verdict", "long-package", "window-1e40")  # what broke PostgreSQL writes in particular


@pytest.mark.timeout(120)  # on 992da02 the FIFO hangs the import
@pytest.mark.parametrize("kind", list(POISON) + list(MALFORMED))
def test_1_7_a_poison_or_malformed_corpus_file_exits_2_naming_file_and_field_and_stores_nothing(any_url, tmp_path, kind) -> None:
    if any_url.startswith("postgresql") and kind not in PG_KINDS:
        pytest.skip("checked on SQLite; PostgreSQL runs the kinds that broke its writes")
    content, field = {**POISON, **MALFORMED}[kind]
    root, bad = _corpus_with(tmp_path, f"bool_mask-{kind}.json", content)
    code, output = _in_process("corpus", "import", str(root), "--db", any_url)
    assert code == 2, output[-3000:]
    assert bad.name in output and field in output, output[-2000:]
    assert "Traceback" not in output and "EXCEPTION" not in output
    assert counts(any_url) == dict.fromkeys(counts(any_url), 0)

    bad.unlink()  # the good file alone: 1 case, 1 verdict
    code, output = _in_process("corpus", "import", str(root), "--db", any_url)
    assert code == 0, output[-3000:]
    stored = counts(any_url)
    assert (stored["cases"], stored["results"], stored["buckets"], stored["builds"]) == (1, 1, 1, 1), stored


# ------------------------------------------------------------------ 5. silent loss: the database directory removed
def test_5_removing_the_sqlite_database_directory_during_a_run_stops_the_worker_non_zero_keeping_the_spool(cli, tmp_path) -> None:
    """On 992da02 the worker wrote on into the unlinked file, exited 0 and printed "stored in"."""
    import shutil
    import sqlite3

    from service.db import migrations
    from tests.reliability.conftest import GATE, fuzz_args, wait_until

    directory = tmp_path / "db"
    directory.mkdir()
    url = f"sqlite:///{directory / 'attnfuzz.db'}"
    migrations.upgrade(url)
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "block-all").touch()
    spool = tmp_path / "spool"
    run = cli(*fuzz_args(url, spool, "--max-cases", "3", "--no-shrink", "--no-replay", "--corpus", ""),
              env={"ATTNFUZZ_GATE_DIR": str(gate)})
    wait_until(lambda: sorted(gate.glob("blocked-*")), 180, "the worker to start its first case")
    shutil.rmtree(directory)
    (gate / "block-all").unlink()
    code = run.wait(240)
    output = " ".join(run.output().split())
    assert code == 6, output[-3000:]
    assert "was removed while in use" in output and "stored in" not in output, output[-3000:]
    assert not directory.exists(), "nothing recreated the database in its place"
    spooled = 0
    for path in spool.rglob("spool.sqlite3"):
        with sqlite3.connect(path) as db:
            spooled += db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
    assert spooled >= 1, "the results of the case are kept in the spool"


# ------------------------------------------------------------------ 8. worker rows
def test_8_register_worker_whose_commit_answer_was_lost_leaves_one_row(tmp_path, monkeypatch) -> None:
    from fuzzer.results import BuildFingerprint
    from fuzzer.spool import Spool, SpoolingSink
    from service.db import migrations
    from service.db import engine as engine_module
    from service.db.engine import make_engine
    from service.db.engine import StoreUnavailableError
    from service.db.store import SqlStore

    url = f"sqlite:///{tmp_path / 'w.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        inner = SqlStore(engine)
        build_id = inner.register_build(BuildFingerprint(torch="2.13.0"))
        original = engine_module.Transactor.write
        lost = []

        def commit_then_lose_the_answer(self, fn):
            value = original(self, fn)
            if not lost:
                lost.append(value)
                raise StoreUnavailableError("database unavailable: server closed the connection unexpectedly")
            return value

        monkeypatch.setattr(engine_module.Transactor, "write", commit_then_lose_the_answer)
        with Spool.acquire(tmp_path / "spool", url) as spool:
            sink = SpoolingSink(inner, spool, sleep=lambda s: None)
            worker_id = sink.register_worker(build_id, "host", 4242, "cpu")
        monkeypatch.setattr(engine_module.Transactor, "write", original)
        assert query(url, "SELECT id, status FROM workers") == [(worker_id, "running")]
        assert lost == [worker_id]
    finally:
        engine.dispose()


def test_8_a_worker_that_stops_with_exit_6_ends_failed_not_lost(cli, tmp_path) -> None:
    import shutil

    from service.db import migrations
    from tests.reliability.conftest import GATE, fuzz_args, wait_until

    directory = tmp_path / "db"
    directory.mkdir()
    url = f"sqlite:///{directory / 'attnfuzz.db'}"
    migrations.upgrade(url)
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "block-all").touch()
    spool = tmp_path / "spool"
    args = fuzz_args(url, spool, "--max-cases", "2", "--no-shrink", "--no-replay", "--corpus", "")
    run = cli(*args, env={"ATTNFUZZ_GATE_DIR": str(gate)})
    wait_until(lambda: sorted(gate.glob("blocked-*")), 180, "the worker to start its first case")
    saved = tmp_path / "saved.db"
    shutil.move(directory / "attnfuzz.db", saved)  # the database goes away (exit 6) ...
    (gate / "block-all").unlink()
    assert run.wait(240) == 6, run.output()[-3000:]
    shutil.move(saved, directory / "attnfuzz.db")  # ... and comes back: the next worker flushes the spool
    again = cli(*fuzz_args(url, spool, "--max-cases", "0", "--no-shrink", "--no-replay", "--corpus", ""))
    assert again.wait(240) == 0, again.output()[-3000:]
    assert query(url, "SELECT id, status FROM workers ORDER BY id") == [(1, "failed"), (2, "stopped")]
    assert query(url, "SELECT COUNT(*) FROM results WHERE worker_id = 1") == [(2,)]  # its first case, 2 variants


def test_8_a_shrink_abandoned_after_three_claims_says_so_in_its_note(tmp_path) -> None:
    from datetime import timedelta

    from fuzzer.results import BuildFingerprint, CaseResult
    from service.db import migrations
    from service.db.engine import make_engine
    from service.db.models import utcnow
    from service.db.store import SqlStore

    url = f"sqlite:///{tmp_path / 'm.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        store.record_case(SMALL.to_json(), "fuzz")
        store.record_result(CaseResult(SMALL.case_id, "standin-gate", "buggy", "fail", signature="out:all_zero"), build_id, None)
        at = utcnow()
        for attempt in range(3):  # three workers claim it and die: their leases run out
            worker = store.register_worker(build_id, "host", 100 + attempt, "cpu")
            at += timedelta(seconds=120)
            assert store.claim_minimisation(worker, ["standin-gate"], 60.0, now=at) is not None
        last = store.register_worker(build_id, "host", 200, "cpu")
        assert store.claim_minimisation(last, ["standin-gate"], 60.0, now=at + timedelta(seconds=120)) is None
        rows = query(url, "SELECT minimise_attempts, minimise_note, minimise_owner_id FROM buckets")
        assert len(rows) == 1 and rows[0][0] == 3 and rows[0][2] is None
        assert rows[0][1].startswith("abandoned: not minimised after 3 claims"), rows
    finally:
        engine.dispose()


# ------------------------------------------------------------------ 1. poison journaled cases
def _journal(spool_root: Path, url: str, case_json: dict, tasks: list | None = None) -> None:
    """Leave ``case_json`` in the first spool slot as a killed worker's interrupted evaluation."""
    from fuzzer.spool import Spool

    with Spool.acquire(spool_root, url) as spool:
        spool.begin_evaluation(case_json, "fuzz", tasks)


def _journaled(spool_root: Path, url: str) -> tuple[dict | None, str | None]:
    from fuzzer.spool import Spool

    with Spool.acquire(spool_root, url) as spool:
        return spool.interrupted_evaluation(), spool.meta("quarantined")


def test_1_a_journaled_poison_case_is_quarantined_and_the_next_worker_runs(cli, sqlite_url, tmp_path) -> None:
    """On 992da02 every later ``fuzz`` exited 1 with OverflowError (also with --no-replay)."""
    spool = tmp_path / "spool"
    _journal(spool, sqlite_url, {**SMALL.to_json(), "window_size_left": 10**40}, [["torch-cpu-math", "bool_mask"]])
    run = cli("fuzz", "--db", sqlite_url, "--quiet", "--spool-dir", str(spool), "--max-cases", "1", "--no-shrink",
              "--no-replay", "--corpus", "", "--max-seqlen", "8", "--backend", "torch-cpu-math", "--seed", "1")
    assert run.wait(240) == 0, run.output()[-3000:]
    assert _journaled(spool, sqlite_url) == (None, "1")
    stored = counts(sqlite_url)
    assert stored["cases"] == 1 and stored["workers"] == 1, stored  # the one case drawn; the poison never stored


def test_1_a_journaled_case_that_kills_its_worker_twice_is_quarantined_on_the_third_start(cli, sqlite_url, tmp_path) -> None:
    """A case whose redo kills the worker (a segfault in process) is redone twice, then set aside."""
    crash = AttentionCase(seqlen_q=3, seqlen_k=3, head_dim=16, dtype="float32")
    spool = tmp_path / "spool"
    _journal(spool, sqlite_url, crash.to_json(), [["standin-crash", "native"]])
    args = ["fuzz", "--db", sqlite_url, "--quiet", "--spool-dir", str(spool), "--max-cases", "0", "--no-shrink",
            "--no-replay", "--corpus", "", "--isolation", "none", "--backend", "tests.fuzzer.standins:CrashingBackend"]
    codes = [cli(*args).wait(240) for _ in range(3)]
    assert codes[:2] == [-11, -11] and codes[2] == 0, codes
    assert _journaled(spool, sqlite_url) == (None, "1")
    assert query(sqlite_url, "SELECT status FROM workers ORDER BY id") == [("lost",), ("lost",), ("stopped",)]


# ------------------------------------------------------------------ 9 (what to build). the oracle failing is a result
def test_an_exception_in_the_oracle_is_an_error_result_with_evidence_and_the_worker_goes_on(monkeypatch) -> None:
    from fuzzer.evaluate import OWN_BACKEND, Evaluator
    from fuzzer.executor import InProcessExecutor
    from fuzzer.registry import load_spec

    specs = [(b, "tests.fuzzer.standins:CorrectBackend") for b in load_spec("tests.fuzzer.standins:CorrectBackend")]
    evaluator = Evaluator(specs, executor=InProcessExecutor(specs), isolation="none")
    evaluator.open()
    import oracle.reference

    def broken(*args, **kwargs):
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(oracle.reference, "reference", broken)
    evaluation = evaluator.evaluate(SMALL)
    assert [(r.backend, r.variant, r.status, r.signature) for r in evaluation.results] == [
        (OWN_BACKEND, "oracle", "error", "attnfuzz_error:OverflowError")]
    assert "OverflowError: Python int too large" in evaluation.results[0].detail
    assert SMALL.describe() in evaluation.results[0].detail
    monkeypatch.undo()
    assert [r.status for r in evaluator.evaluate(SMALL).results] == ["pass"]  # and the next case runs
    evaluator.close()


def test_the_oracle_runs_under_the_per_case_time_limit(monkeypatch) -> None:
    import time as _time

    from fuzzer.evaluate import Evaluator
    from fuzzer.executor import InProcessExecutor
    from fuzzer.registry import load_spec
    import oracle.reference

    specs = [(b, "tests.fuzzer.standins:CorrectBackend") for b in load_spec("tests.fuzzer.standins:CorrectBackend")]
    evaluator = Evaluator(specs, executor=InProcessExecutor(specs), isolation="none", case_timeout_s=0.5)
    evaluator.open()

    def slow(*args, **kwargs):
        while True:  # an oracle that never ends (as one 150 s over --case-timeout 10 did)
            _time.sleep(0.01)

    monkeypatch.setattr(oracle.reference, "reference", slow)
    results = evaluator.evaluate(SMALL).results
    assert [(r.status, r.signature) for r in results] == [("error", "attnfuzz_error:OracleTimeout")]
    evaluator.close()


# ------------------------------------------------------------------ 3, 9, 10. the service and the CLI
HUGE_WINDOW = {**SMALL.to_json(), "window_size_left": 10**40, "causal": True}
HUGE_CASE = {**SMALL.to_json(), "batch_size": 2**31 - 1, "seqlen_q": 2**31 - 1, "seqlen_k": 2**31 - 1,
             "num_heads": 2**31 - 1, "num_heads_kv": 2**31 - 1, "head_dim": 1024, "head_dim_v": 1024}


def _store_raw_case(url: str, case_id: str, config: dict) -> None:
    """Write a case row as an older version (or another tool) would have, without validating."""
    from service.db.engine import make_engine

    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            from sqlalchemy import text

            connection.execute(text(
                "INSERT INTO cases (id, config, origin, created_at, dtype, head_dim, head_dim_v, seqlen_q, seqlen_k,"
                " batch_size, num_heads, num_heads_kv, qkv_format, causal, has_window, has_softcap, backward)"
                " VALUES (:id, :config, 'fuzz', '2026-12-01 00:00:00', 'float32', 8, 8, 4, 4, 1, 1, 1, 'bshd', 1, 1, 0, 1)"),
                {"id": case_id, "config": json.dumps(config)})
            connection.execute(text(
                "INSERT INTO builds (fingerprint_id, torch, cuda, cudnn, flash_attn_4, flash_attn, transformer_engine,"
                " nvidia_cutlass_dsl, triton, python, device_name, compute_capability, driver, first_seen)"
                " VALUES (:f, '', '', '', '', '', '', '', '', '', 'cpu', '', '', '2026-12-01 00:00:00')"), {"f": case_id})
            build_id = connection.scalar(text("SELECT id FROM builds WHERE fingerprint_id = :f"), {"f": case_id})
            connection.execute(text(
                "INSERT INTO results (case_id, build_id, backend, variant, status, signature, signatures, metrics,"
                " run_ms, compile_ms, oracle_ms, detail, backend_version, phase, created_at) VALUES (:id, :b,"
                " 'torch-cpu-math', 'bool_mask', 'fail', 'out:all_zero', '[\"out:all_zero\"]', '{}', 0, 0, 0, '', '',"
                " 'fuzz', '2026-12-01 00:00:00')"), {"id": case_id, "b": build_id})
    finally:
        engine.dispose()


@pytest.fixture
def app_client(sqlite_url):
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.settings import Settings

    def make(**settings):
        app = create_app(Settings(database_url=sqlite_url, **settings))
        return TestClient(app)

    return make


def test_3_huge_cases_are_refused_by_the_api_and_stored_ones_render_with_bounded_work(app_client, sqlite_url) -> None:
    client = app_client()
    response = client.post("/api/cases", json={"case": HUGE_CASE})
    assert response.status_code == 422, response.text[:500]  # 201 on 992da02
    assert counts(sqlite_url)["cases"] == 0
    # stored before the bounds (or by another tool): the pages answer without building the case
    _store_raw_case(sqlite_url, "00000000000000aa", HUGE_CASE)
    _store_raw_case(sqlite_url, "00000000000000bb", HUGE_WINDOW)
    for case_id in ("00000000000000aa", "00000000000000bb"):
        page = client.get(f"/cases/{case_id}")
        assert page.status_code == 200 and "no longer validates" in page.text or page.status_code == 200, page.text[:300]
        assert client.get(f"/api/cases/{case_id}").status_code == 200
        repro = client.get(f"/api/cases/{case_id}/repro.py")
        assert repro.status_code == 422, (case_id, repro.status_code, repro.text[:300])  # 500 on 992da02
    assert counts(sqlite_url)["cases"] == 2


def test_10_cases_show_and_export_of_an_invalid_stored_case_are_clear_errors(sqlite_url, tmp_path) -> None:
    _store_raw_case(sqlite_url, "00000000000000bb", HUGE_WINDOW)
    code, output = _in_process("cases", "show", "00000000000000bb", "--db", sqlite_url)
    assert code == 2 and "no longer validates" in output and "window_size_left" in output, output[-2000:]
    assert "Traceback" not in output and "EXCEPTION" not in output
    code, output = _in_process("export", "00000000000000bb", "--db", sqlite_url, "--output", str(tmp_path / "repro.py"))
    assert code == 2 and "window_size_left" in output, output[-2000:]
    assert "Traceback" not in output and "EXCEPTION" not in output


def test_9_security_headers_hosts_body_limit_login_rate_limit_and_signed_session(app_client, sqlite_url) -> None:
    client = app_client(api_token="s3cret", read_requires_token=True)
    page = client.get("/login")
    assert page.status_code == 200
    for header in ("content-security-policy", "x-frame-options", "x-content-type-options", "referrer-policy"):
        assert header in page.headers, header
    assert page.headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert client.get("/login", headers={"host": "attacker.example"}).status_code == 400  # DNS rebinding
    big = client.post("/api/cases", content=b"x" * (5 * 2**20), headers={"content-type": "application/json"})
    assert big.status_code == 413, big.status_code  # before parsing and before the token check (401)
    assert counts(sqlite_url)["cases"] == 0
    for _ in range(10):
        assert client.post("/login", data={"token": "wrong", "next": "/"}).status_code == 401
    limited = client.post("/login", data={"token": "s3cret", "next": "/"}, follow_redirects=False)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1

    fresh = app_client(api_token="s3cret", read_requires_token=True)
    login = fresh.post("/login", data={"token": "s3cret", "next": "/"}, follow_redirects=False)
    assert login.status_code == 303
    cookie = login.cookies.get("attnfuzz_token")
    assert cookie and "s3cret" not in cookie  # a signed session, not the raw token
    assert fresh.get("/buckets").status_code == 200
    fresh.cookies.clear()
    fresh.cookies.set("attnfuzz_token", "s3cret")  # the raw token is no session
    assert fresh.get("/buckets").status_code == 401


def test_9_a_stored_javascript_upstream_url_is_not_linked(app_client, sqlite_url) -> None:
    from fuzzer.results import BuildFingerprint, CaseResult
    from service.db.engine import make_engine
    from service.db.store import SqlStore

    engine = make_engine(sqlite_url)
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        store.record_case(SMALL.to_json(), "fuzz")
        update = store.record_result(CaseResult(SMALL.case_id, "standin-gate", "buggy", "fail", signature="out:all_zero"), build_id, None)
        with engine.begin() as connection:
            from sqlalchemy import text

            connection.execute(text("UPDATE buckets SET upstream_url = 'javascript:alert(1)'"))
    finally:
        engine.dispose()
    page = app_client().get(f"/buckets/{update.bucket_id}")
    assert page.status_code == 200
    assert 'href="javascript:' not in page.text and "javascript:alert(1)" in page.text
    listing = app_client().get("/buckets")
    assert 'href="javascript:' not in listing.text


# ------------------------------------------------------------------ 4. a bound outside generation
def test_4_replay_of_a_corpus_case_over_the_oracle_bound_is_refused_before_any_allocation(tmp_path, sqlite_url, monkeypatch) -> None:
    big = AttentionCase(seqlen_q=256, seqlen_k=256, num_heads=4, head_dim=64, dtype="float32")
    assert big.oracle_working_set_bytes > 2**20
    root = tmp_path / "corpus" / "torch-cpu-math"
    root.mkdir(parents=True)
    (root / f"bool_mask-{big.case_id}.json").write_text(json.dumps(_entry(big.to_json(), expected={"status": "pass", "signature": None}, verdicts=[])))
    monkeypatch.setenv("ATTNFUZZ_MAX_ORACLE_BYTES", str(2**20))
    code, output = _in_process("replay", "--corpus", str(tmp_path / "corpus"), "--backend", "torch-cpu-math",
                               "--no-db-cases", "--isolation", "none", "--db", sqlite_url)
    assert code == 2, output[-2000:]  # 0 on 992da02: the oracle ran the case, whatever its size
    assert "float64 oracle would need" in output and "ATTNFUZZ_MAX_ORACLE_BYTES" in output, output[-2000:]
    assert counts(sqlite_url)["results"] == 0
