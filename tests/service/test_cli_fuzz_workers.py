"""``attnfuzz fuzz --workers``: how many worker processes ``auto`` means, bad values, the figures of
several workers added up (`fuzzer.worker.merge_stats`), and a real two-worker run on one SQLite
database that stores every result once."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuzzer.worker import WorkerStats, merge_stats
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from service.cli.fuzz_workers import AUTO_MAX_WORKERS, AUTO_MIN_BUDGET_S, resolve_workers
from service.cli.main import app

FILE_DB = "sqlite:////tmp/x.db"
PLANTED = "tests.fuzzer.standins:PlantedWindowBackend"
PLANTED_CASE = AttentionCase(seqlen_q=3, seqlen_k=3, num_heads=1, head_dim=8, dtype="float32")


def _auto(**overrides) -> int:
    settings = dict(device="cpu", isolation="process", time_budget_s=60.0, seed=None, max_cases=None, ledger=None,
                    url=FILE_DB, cores=2)
    settings.update(overrides)
    return resolve_workers("auto", **settings)


def test_auto_is_one_worker_per_core_for_a_long_cpu_run() -> None:
    assert _auto() == 2
    assert _auto(cores=64) == AUTO_MAX_WORKERS
    assert _auto(cores=1) == 1


@pytest.mark.parametrize(
    "overrides",
    [
        {"device": "cuda"},
        {"isolation": "none"},
        {"seed": 3},
        {"max_cases": 100},
        {"ledger": "results.jsonl"},
        {"time_budget_s": AUTO_MIN_BUDGET_S - 1},
        {"time_budget_s": None},
        {"url": "sqlite://"},
        {"url": "sqlite:///:memory:"},
    ],
)
def test_auto_keeps_one_worker_where_several_would_not_pay_or_not_be_exact(overrides: dict) -> None:
    assert _auto(**overrides) == 1


def test_a_number_is_taken_as_given_and_a_bad_one_names_the_field() -> None:
    assert resolve_workers("3", device="cpu", isolation="process", time_budget_s=5.0, seed=None, max_cases=None,
                           ledger=None, url=FILE_DB) == 3
    for bad in ("0", "-1", "two", ""):
        with pytest.raises(CaseValidationError, match="workers"):
            resolve_workers(bad, device="cpu", isolation="process", time_budget_s=5.0, seed=None, max_cases=None,
                            ledger=None, url=FILE_DB)
    with pytest.raises(CaseValidationError, match="isolation none"):
        resolve_workers("2", device="cpu", isolation="none", time_budget_s=5.0, seed=None, max_cases=None, ledger=None, url=FILE_DB)
    with pytest.raises(CaseValidationError, match="ledger"):
        resolve_workers("2", device="cpu", isolation="process", time_budget_s=5.0, seed=None, max_cases=None,
                        ledger="r.jsonl", url=FILE_DB)


def test_a_bad_workers_option_is_a_usage_error_before_anything_runs(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["fuzz", "--workers", "many", "--db", str(tmp_path / "w.db")], env={"COLUMNS": "250"})
    assert result.exit_code == 2
    said = " ".join(result.output.split())  # the console may wrap the line
    assert "--workers: 'many'" in said and "auto, or an integer >= 1" in said  # the option, as typed
    assert not (tmp_path / "w.db").exists()  # nothing migrated


def test_merged_figures_add_counts_and_seconds_and_keep_the_longest_wall() -> None:
    a = WorkerStats(cases=10, wall_s=30.0, oracle_s=3.0, wait_s=6.0, shrink_s=1.0, judge_s=2.0)
    a.results.update({"pass": 18, "fail": 2})
    a.per_backend[("k", "pass")] = 18
    a.new_buckets.append(("k", "v", "out:all_zero"))
    a.first_cases[("k", "v", "out:all_zero")] = "case-a"
    a.kernel_keys["fa4"] = {"key1"}
    a.task_timing_s["k"] = {"run": 1.5}
    b = WorkerStats(cases=7, wall_s=31.0, oracle_s=2.0, wait_s=5.0, shrink_s=0.0, judge_s=1.0, all_busy=2)
    b.results.update({"pass": 14})
    b.per_backend[("k", "pass")] = 14
    b.new_buckets += [("k", "v", "out:all_zero"), ("k", "v", "lse:mismatch")]
    b.first_cases[("k", "v", "out:all_zero")] = "case-b"
    b.kernel_keys["fa4"] = {"key2"}
    b.task_timing_s["k"] = {"run": 0.5, "pack": 0.25}

    merged = merge_stats([a, b])

    assert merged.workers == 2 and merged.cases == 17 and merged.all_busy == 2
    assert merged.wall_s == 31.0 and merged.worker_s == 61.0 and merged.split_wall_s == 61.0
    assert merged.cases_per_s == pytest.approx(17 / 31.0)
    assert merged.results == Counter({"pass": 32, "fail": 2})
    assert merged.per_backend[("k", "pass")] == 32
    assert merged.new_buckets == [("k", "v", "out:all_zero"), ("k", "v", "lse:mismatch")]  # a bucket both saw, once
    assert merged.first_cases[("k", "v", "out:all_zero")] == "case-a"  # the first worker's
    assert merged.kernel_keys["fa4"] == {"key1", "key2"}
    assert merged.task_timing_s["k"] == {"run": 2.0, "pack": 0.25}
    assert merged.own_s == pytest.approx(61.0 - 5.0 - 11.0 - 1.0)  # the split is of the workers' summed wall
    assert a.cases == 10 and a.new_buckets == [("k", "v", "out:all_zero")]  # the parts are not changed
    a.started_s, a.stopped_s, b.started_s, b.stopped_s = 100.0, 130.0, 103.0, 134.0  # b started 3 s later
    timed = merge_stats([a, b])
    assert (timed.started_s, timed.stopped_s, timed.wall_s) == (100.0, 134.0, 34.0)  # the run's elapsed time
    assert timed.cases_per_s == pytest.approx(17 / 34.0) and timed.worker_s == 61.0
    one = merge_stats([a])
    assert one.workers == 1 and one.split_wall_s == a.wall_s and one.own_s == pytest.approx(a.own_s)
    with pytest.raises(ValueError, match="parts"):
        merge_stats([])


def _both_workers_stored_and_found(db: Path, least: int) -> bool:
    """Each of two workers has at least ``least`` results stored and a bucket exists (False while
    the database or its tables are not there yet)."""
    if not db.exists():
        return False
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            counts = [n for (n,) in con.execute("SELECT COUNT(*) FROM results GROUP BY worker_id")]
            buckets = con.execute("SELECT COUNT(*) FROM buckets").fetchone()[0]
    except sqlite3.Error:
        return False
    return len(counts) == 2 and min(counts) >= least and buckets > 0


def test_two_workers_share_one_database_and_the_summary_adds_them_up(tmp_path: Path) -> None:
    """A real ``--workers 2`` run: both processes ran cases, every result is stored once (no lost
    or doubled row), the summary's case count is the workers' sum, and the planted window bug was
    found (by either).

    The run is stopped with Ctrl-C (SIGINT to its process group, as a terminal sends it) once both
    workers have stored results and a bucket exists, not by a time budget, so the test waits as long
    as a loaded machine needs, and on a quiet one it ends in seconds. (Its CI failures of 2026-12-02
    and 2026-12-03, the second worker storing nothing, were the CI machine's ``$CI``: Hypothesis's
    derandomising "ci" profile made every chunk draw the same cases; see
    ``test_a_derandomising_hypothesis_profile_does_not_make_every_chunk_draw_the_same_cases``.) Not --max-cases: the two workers must run side by side for
    their walls to add up."""
    import signal
    import time

    db = tmp_path / "w.db"
    env = {**os.environ, "COLUMNS": "200"}
    process = subprocess.Popen(
        [sys.executable, "-m", "attnfuzz", "fuzz", "--workers", "2", "--time-budget", "600", "--json", "--no-shrink",
         "--corpus", "", "--backend", PLANTED, "--max-seqlen", "16", "--db", str(db), "--spool-dir", str(tmp_path / "spool")],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        started = time.monotonic()
        ready = False
        while time.monotonic() < started + 300 and process.poll() is None and not ready:
            time.sleep(0.5)
            ready = _both_workers_stored_and_found(db, 20)
        waited = time.monotonic() - started
        assert process.poll() is None, "the run ended before both workers stored results"
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 130, stdout[-2000:] + stderr[-3000:]  # Ctrl-C's exit code
    assert ready, f"both workers had not stored 20 results after {waited:.0f} s; stderr: {stderr[-3000:]}"
    summary = json.loads(stdout)
    assert summary["interrupted"] is True
    assert summary["workers"] == 2
    assert summary["worker_s"] > summary["wall_s"]  # two walls added up
    assert summary["spool"]["outages"] == 0
    with sqlite3.connect(db) as con:
        per_worker = dict(con.execute("SELECT worker_id, COUNT(*) FROM results GROUP BY worker_id").fetchall())
        stored = con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        distinct = con.execute("SELECT COUNT(*) FROM (SELECT DISTINCT case_id, backend, variant, build_id FROM results)").fetchone()[0]
        signatures = {row[0] for row in con.execute("SELECT signature FROM buckets")}
        statuses = [row[0] for row in con.execute("SELECT status FROM workers")]
    assert statuses == ["stopped", "stopped"]  # Ctrl-C is a stop, not a failure
    assert len(per_worker) == 2 and all(n >= 20 for n in per_worker.values())  # both workers stored results
    assert stored == distinct  # one row per case, backend, variant and build
    evaluations = sum(summary["evaluations_by_status"].values())
    assert 0 < stored <= evaluations  # a case drawn again by either worker is stored once
    assert summary["cases"] >= 2
    assert signatures, "the planted window bug was not found"


def test_the_live_bar_counts_the_other_workers_cases_and_buckets() -> None:
    from service.cli.fuzz_display import RichReporter

    reporter = RichReporter(60.0, None, others=lambda: (1, 5, 2))
    reporter.on_new_bucket(("k", "v", "out:all_zero"), PLANTED_CASE)
    reporter.on_case(PLANTED_CASE, [], WorkerStats(cases=3))
    description = reporter.progress.tasks[0].description
    assert description.startswith("8 cases (2 workers)")
    # the table counts this worker only, and says so (a new-user trial read "table: this one's" as unclear)
    assert reporter._render(WorkerStats(cases=3)).renderables[1].caption.startswith("this table: this process's worker only")
    assert "3 new bucket(s)" in description
    alone = RichReporter(60.0, None)
    alone.on_case(PLANTED_CASE, [], WorkerStats(cases=3))
    assert alone.progress.tasks[0].description.startswith("3 cases, ")


def test_the_summary_says_what_another_worker_did_with_a_bucket(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A bucket one worker found and another shrank or attached: the summary of several workers reads
    its state from the database (`bucket_states`) instead of calling it unshrunk."""
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from fuzzer.results import BuildFingerprint, CaseResult
    from service.cli.fuzz import _bucket_states
    from service.cli.fuzz_display import print_summary
    from service.db import migrations
    from service.db.engine import make_engine
    from service.db.models import Bucket
    from service.db.store import SqlStore

    url = f"sqlite:///{tmp_path / 's.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    store = SqlStore(engine)
    build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
    store.record_case(PLANTED_CASE.to_json(), "fuzz")
    shrunk, attached, alone = ("k", "a", "out:all_zero"), ("k", "b", "out:all_zero"), ("k", "c", "lse:mismatch")
    for key in (shrunk, attached, alone):
        store.record_result(CaseResult(PLANTED_CASE.case_id, key[0], key[1], "fail", signature=key[2]), build_id, None)
    with Session(engine) as session, session.begin():
        session.execute(update(Bucket).where(Bucket.variant == "a").values(minimised_case_id=PLANTED_CASE.case_id))
        session.execute(update(Bucket).where(Bucket.variant == "b").values(minimise_note="attached: fails as out:all_zero on the minimised case of bucket 1"))
    engine.dispose()

    states = _bucket_states(url, [shrunk, attached, alone, ("k", "z", "nope")])
    assert states[shrunk][0] == PLANTED_CASE.case_id and states[alone] == (None, "") and ("k", "z", "nope") not in states

    stats = WorkerStats(cases=1, wall_s=1.0, shrink_s=1.0)
    stats.new_buckets += [shrunk, attached, alone]
    print_summary(stats, url, stored=states)
    said = " ".join(capsys.readouterr().out.split())
    assert f"minimised by another worker: case {PLANTED_CASE.case_id}" in said
    assert "attached: fails as out:all_zero on the minimised case of bucket 1 (by another worker)" in said
    assert said.count("not minimised in this run") == 1  # only the bucket nobody shrank



def test_a_cpu_worker_process_collects_garbage_less_often_and_a_gpu_one_keeps_the_defaults() -> None:
    """`tune_gc`: on the CPU the start-up's objects are frozen out of the scans and the young
    generation waits for `GC_GEN0_THRESHOLD` allocations; on a GPU nothing changes."""
    import gc

    from service.cli.fuzz_workers import GC_GEN0_THRESHOLD, tune_gc

    gc.unfreeze()  # an in-process fuzz run of an earlier test may have frozen this process's objects
    before = gc.get_threshold()
    try:
        tune_gc("cuda")
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0
        tune_gc("cpu")
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
