"""fuzzer/builds/replay.py: replays here and in a child, what a dying or hanging child leaves, the
worker's first-build hook, and the ``attnfuzz replay`` command (CPU backends, no GPU)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import select

from fuzzer import registry
from fuzzer.builds.envs import BuildEnvironment
from fuzzer.builds.corpus import CorpusEntry, load_corpus, save_entry
from fuzzer.builds.replay import replay_here, replay_in_build, replay_on_new_build
from fuzzer.results import BuildFingerprint, CaseResult, ReplayTask, SinkUnavailableError
from fuzzer.worker import Worker, WorkerConfig
from oracle.config import AttentionCase
from service.db import migrations
from service.db.engine import make_engine
from service.matrix.replay_rows import SqlBuildHistory
from service.db.models import ReplaySkip, Result
from service.db.store import SqlStore

SDPA_SPEC = "fuzzer.backends.sdpa:builtin_backends"
CASE = AttentionCase(seqlen_q=5, seqlen_k=7, num_heads=2, head_dim=16, dtype="float32", causal=True, backward=False)
OTHER = CASE.replace(seqlen_q=3)


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for the child interpreter (``$3`` = request, ``$4`` = events)."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


BUILD_EVENT = '{"kind": "build", "fingerprint": {"torch": "2.13.0"}, "packages": {"torch": "2.13.0"}}'
START_EVENT = '{"kind": "start", "case_id": "%s", "tasks": [["torch-cpu-math", "is_causal"]]}' % CASE.case_id


def tasks() -> list[ReplayTask]:
    return [ReplayTask(CASE, "torch-cpu-math", "is_causal"), ReplayTask(OTHER, "torch-cpu-math", "is_causal")]


def test_a_child_that_cannot_start_makes_every_task_a_skip_with_its_stderr(tmp_path):
    python = fake_python(tmp_path, 'echo "ImportError: libcuda.so.1: cannot open shared object file" >&2\nexit 1\n')
    outcome = replay_in_build(None, tasks(), [("torch-cpu-math", SDPA_SPEC)], python=python)
    assert outcome.fingerprint is None and outcome.results == ()
    assert [s.case_id for s in outcome.skips] == [CASE.case_id, OTHER.case_id]
    assert all("the build could not start" in s.reason and "libcuda.so.1" in s.reason for s in outcome.skips)
    assert "exited with status 1" in outcome.error


def test_a_child_that_dies_midway_keeps_the_build_and_the_task_it_ran_becomes_a_crash(tmp_path):
    python = fake_python(tmp_path, f"echo '{BUILD_EVENT}' >> \"$4\"\necho '{START_EVENT}' >> \"$4\"\nkill -SEGV $$\n")
    outcome = replay_in_build(None, tasks(), [("torch-cpu-math", SDPA_SPEC)], python=python)
    assert outcome.fingerprint is not None and outcome.packages == {"torch": "2.13.0"}
    (crash,) = outcome.results
    assert (crash.case_id, crash.status, crash.signature, crash.phase) == (CASE.case_id, "crash", "crash", "replay")
    (skip,) = outcome.skips
    assert skip.case_id == OTHER.case_id and skip.reason.startswith("not run: replay child exited with status -11")


def test_a_child_that_hangs_is_killed_and_the_task_it_ran_times_out(tmp_path):
    python = fake_python(tmp_path, f"echo '{BUILD_EVENT}' >> \"$4\"\necho '{START_EVENT}' >> \"$4\"\nexec sleep 60\n")
    outcome = replay_in_build(
        None, tasks()[:1], [("torch-cpu-math", SDPA_SPEC)], python=python, start_timeout_s=0.5, case_timeout_s=0.1
    )
    (timeout,) = outcome.results
    assert timeout.status == "timeout" and "killed after 0.7 s" in outcome.error
    assert outcome.wall_s < 30


def test_the_child_gets_the_build_first_on_its_pythonpath(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    python = fake_python(tmp_path, 'echo "$PYTHONPATH" > "$(dirname "$0")/seen"\nexit 3\n')
    env = BuildEnvironment("flash-attn-4", "4.0.0b11", (tmp_path / "extras", tmp_path / "fa4"))
    replay_in_build(env, tasks()[:1], [], python=python)
    seen = (tmp_path / "seen").read_text().strip().split(os.pathsep)
    assert seen[:2] == [str(tmp_path / "extras"), str(tmp_path / "fa4")] and seen[-1] == "/inherited"
    assert seen[2] == str(Path(__file__).resolve().parents[2]), "the project root comes right after the build"


def test_a_replay_here_runs_what_it_can_and_skips_the_rest_with_reasons():
    outcome = replay_here(
        [
            ReplayTask(CASE, "torch-cpu-math", "is_causal"),
            ReplayTask(CASE, "torch-cpu-math", "no_such_variant"),
            ReplayTask(CASE, "torch-sdpa-math", "is_causal"),
            ReplayTask(CASE, "nobody", "x"),
        ],
        [("torch-cpu-math", SDPA_SPEC), ("torch-sdpa-math", SDPA_SPEC)],
        device="cpu",
        isolation="none",
    )
    verdicts = [(v.status, v.detail) for v in map(outcome.verdict, outcome.tasks)]
    assert verdicts[0] == ("pass", "")
    assert verdicts[1][0] == "unsupported" and "no_such_variant" in verdicts[1][1]
    assert verdicts[2][0] == "skip" and "no CUDA device" in verdicts[2][1]
    assert verdicts[3] == ("skip", "backend 'nobody' is not among the replayed backends")
    assert outcome.packages["torch"] == outcome.fingerprint.torch and all(r.phase == "replay" for r in outcome.results)


@pytest.fixture
def cpu_corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    save_entry(root, CorpusEntry(CASE, "torch-cpu-math", "is_causal", "causal control", "pass"))
    save_entry(root, CorpusEntry(CASE, "torch-sdpa-math", "is_causal", "a GPU entry", "pass"))
    return root


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'attnfuzz.db'}"
    migrations.upgrade(url)
    return url


def test_a_worker_replays_the_corpus_once_per_build_before_it_fuzzes(cpu_corpus, db_url):
    found = registry.discover()
    config = WorkerConfig(backends=[found["torch-cpu-math"], found["torch-sdpa-math"]], device="cpu", isolation="none")
    engine = make_engine(db_url)
    try:
        worker = Worker(config, SqlStore(engine))
        worker.open()
        try:
            history = SqlBuildHistory(engine)
            first = replay_on_new_build(worker, cpu_corpus, history)
            again = replay_on_new_build(worker, cpu_corpus, history)
        finally:
            worker.close()
        with engine.connect() as connection:
            stored = connection.execute(select(Result.backend, Result.status, Result.phase, Result.build_id)).all()
            skipped = connection.execute(select(ReplaySkip.backend, ReplaySkip.reason)).all()
    finally:
        engine.dispose()
    assert [(r.backend, r.status) for r in first] == [("torch-cpu-math", "pass")]
    assert again is None, "the build was replayed already"
    assert [tuple(r) for r in stored] == [("torch-cpu-math", "pass", "replay", worker.build_id)]
    assert [(b, "no CUDA device" in reason) for b, reason in skipped] == [("torch-sdpa-math", True)]


def test_the_replay_command_records_checks_and_updates_the_corpus(cli, cpu_corpus, db_url):
    done = cli("replay", "--corpus", cpu_corpus, "--db", db_url, "--isolation", "none", "--no-db-cases", "--update-corpus", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    rows = {r["backend"]: r for r in report["verdicts"]}
    assert rows["torch-cpu-math"]["status"] == "pass" and rows["torch-cpu-math"]["matches"] is True
    assert rows["torch-sdpa-math"]["status"] == "skip" and rows["torch-sdpa-math"]["matches"] is None
    assert report["corpus_files_updated"] == 1
    entries = {e.backend: e for e in load_corpus(cpu_corpus)}
    (verdict,) = entries["torch-cpu-math"].verdicts
    assert verdict.status == "pass" and verdict.build_key and dict(verdict.packages)["torch"]
    assert entries["torch-sdpa-math"].verdicts == ()

    wrong = CorpusEntry(CASE, "torch-cpu-math", "is_causal", "a wrong expectation", "fail", "out:all_zero")
    save_entry(cpu_corpus, wrong)
    checked = cli("replay", "--corpus", cpu_corpus, "--db", db_url, "--isolation", "none", "--no-db-cases", "--check")
    assert checked.exit_code == 9 and "MISMATCH" in checked.output


def test_corpus_export_then_import_through_the_cli(cli, db_url, tmp_path):
    engine = make_engine(db_url)
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        store.record_case(CASE.to_json(), "fuzz")
        store.record_result(
            CaseResult(CASE.case_id, "torch-cpu-math", "bool_mask", "fail", "out:nan", ("out:nan",), phase="replay"), build_id, None
        )
    finally:
        engine.dispose()
    root = tmp_path / "exported"
    exported = cli("corpus", "export", "--root", root, "--db", db_url)
    assert exported.exit_code == 0, exported.output
    (entry,) = load_corpus(root)
    assert (entry.backend, entry.variant, entry.expected_status, entry.expected_signature) == ("torch-cpu-math", "bool_mask", "fail", "out:nan")
    assert entry.source == "bucket:1" and [v.status for v in entry.verdicts] == ["fail"]
    other = f"sqlite:///{tmp_path / 'other.db'}"
    imported = cli("corpus", "import", root, "--db", other)
    assert imported.exit_code == 0 and "1 verdicts" in imported.output
    broken = root / "torch-cpu-math" / "bad.json"
    broken.write_text(json.dumps({**entry.to_json(), "schema_version": 9}))
    refused = cli("corpus", "import", root, "--db", other)
    assert refused.exit_code == 2 and "bad.json" in refused.output and "schema_version" in refused.output


class UnreachableHistory:
    """A build history whose database is down."""

    def is_replayed(self, build_id, backends):
        raise SinkUnavailableError("database unavailable: connection refused")

    def record_replay(self, *args):
        raise AssertionError("nothing is recorded when the history cannot be read")


def test_a_worker_whose_history_is_unreachable_fuzzes_without_replaying(cpu_corpus, db_url):
    found = registry.discover()
    engine = make_engine(db_url)
    try:
        worker = Worker(WorkerConfig(backends=[found["torch-cpu-math"]], device="cpu", isolation="none"), SqlStore(engine))
        worker.open()
        try:
            assert replay_on_new_build(worker, cpu_corpus, UnreachableHistory()) is None
        finally:
            worker.close()
        with engine.connect() as connection:
            assert connection.execute(select(Result.id)).all() == []
    finally:
        engine.dispose()


def test_the_sql_build_history_reports_an_unreachable_database_as_unavailable():
    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:9/none", timeout_s=2)
    try:
        with pytest.raises(SinkUnavailableError, match="database unavailable"):
            SqlBuildHistory(engine).is_replayed(1, ["fa4"])
    finally:
        engine.dispose()
