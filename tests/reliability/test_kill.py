"""``kill -9`` of a worker in the middle of a case, of a shrink and of a replay.

Each test runs the real CLI on the gate stand-in (`tests.fuzzer.standins.GateBackend`), which
writes ``blocked-<case_id>`` and waits while ``block-<case_id>`` (or ``block-all``) exists: the
test waits for that marker, checks the database, SIGKILLs the worker, removes the block, starts
a new worker on the same spool and checks the exact rows afterwards: the interrupted work is
redone and stored once, the dead worker is marked ``lost`` with its last heartbeat kept (the gap
before the next worker's start), and a minimisation it held is taken up again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from fuzzer.results import BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from service.db.engine import make_engine
from service.db.models import Case
from service.db.store import SqlStore
from service.db.workers import heartbeat_gaps
from tests.reliability.conftest import counts, fuzz_args, query, wait_until

pytestmark = pytest.mark.timeout(300)

# A causal case the gate's "buggy" variant zeroes: a failure to shrink or replay.
CAUSAL = AttentionCase(batch_size=2, seqlen_q=6, seqlen_k=7, num_heads=2, head_dim=16, dtype="float32", causal=True)
SMALL = AttentionCase(seqlen_q=2, seqlen_k=2, head_dim=16, dtype="float32", causal=True)


def _gate(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    gate = tmp_path / "gate"
    gate.mkdir()
    return gate, {"ATTNFUZZ_GATE_DIR": str(gate)}


def _seed_bucket(url: str, minimised: AttentionCase | None = None) -> int:
    """A stored failure of CAUSAL on (standin-gate, buggy): one bucket, never minimised unless
    ``minimised`` is given. Returns the bucket id."""
    engine = make_engine(url)
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="seeded"))
        store.record_case(CAUSAL.to_json(), "fuzz")
        failure = CaseResult(CAUSAL.case_id, "standin-gate", "buggy", "fail", signature="out:all_zero")
        bucket_id = store.record_result(failure, build_id, None).bucket_id
        if minimised is not None:
            store.record_minimised(bucket_id, minimised.to_json(), CAUSAL.case_id, "minimised: seeded")
        return bucket_id
    finally:
        engine.dispose()


def _stored_case(url: str, case_id: str) -> AttentionCase:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return AttentionCase.from_json(connection.scalar(select(Case.config).where(Case.id == case_id)))
    finally:
        engine.dispose()


def _workers(url: str) -> list[tuple]:
    return query(url, "SELECT id, status, slot FROM workers ORDER BY id")


def _assert_gap_recorded(url: str) -> None:
    engine = make_engine(url)
    try:
        gaps = heartbeat_gaps(SqlStore(engine).worker_runs())
    finally:
        engine.dispose()
    assert [(g.before.worker_id, g.after.worker_id, g.clean) for g in gaps] == [(1, 2, False)]
    assert gaps[0].gap_s >= 0, "the killed worker's last heartbeat precedes its successor's start"
    assert gaps[0].before.status == "lost"


def test_kill_9_mid_case_the_next_worker_redoes_the_case_and_stores_it_once(cli, sqlite_url, tmp_path) -> None:
    gate, env = _gate(tmp_path)
    (gate / "block-all").touch()
    args = fuzz_args(sqlite_url, tmp_path / "spool", "--max-cases", "4", "--seed", "3", "--no-shrink")
    first = cli(*args, env=env)
    marker = wait_until(lambda: sorted(gate.glob("blocked-*")), 120, "the worker to start its first case")
    interrupted = marker[0].name.removeprefix("blocked-")
    before = counts(sqlite_url)
    first.kill9()
    assert (before["cases"], before["results"], before["workers"]) == (0, 0, 1), before

    (gate / "block-all").unlink()
    second = cli(*[a if a != "3" else "4" for a in args], env=env)  # another seed: the case is not drawn again
    assert second.wait(180) == 0, second.output()
    after = counts(sqlite_url)
    rows = query(
        sqlite_url, "SELECT variant, phase, COUNT(*) FROM results WHERE case_id = :c GROUP BY variant, phase", c=interrupted
    )
    assert sorted(rows) == [("buggy", "fuzz", 1), ("native", "fuzz", 1)], "the interrupted case is redone, once"
    assert after["cases"] >= 1 and after["results"] == 2 * after["cases"], f"every case has its 2 results: {after}"
    assert _workers(sqlite_url) == [(1, "lost", "slot-0"), (2, "stopped", "slot-0")]
    _assert_gap_recorded(sqlite_url)


def test_kill_9_mid_shrink_the_next_worker_takes_the_bucket_and_minimises_it(cli, sqlite_url, tmp_path) -> None:
    bucket_id = _seed_bucket(sqlite_url)
    gate, env = _gate(tmp_path)
    (gate / f"block-{CAUSAL.case_id}").touch()  # minimisation first re-runs the bucket's case
    args = fuzz_args(sqlite_url, tmp_path / "spool", "--max-cases", "0", "--no-replay")
    first = cli(*args, env=env)
    wait_until((gate / f"blocked-{CAUSAL.case_id}").exists, 120, "the worker to start shrinking")
    lease = query(sqlite_url, "SELECT minimise_owner_id, minimise_attempts, minimised_case_id FROM buckets")
    assert lease == [(1, 1, None)], "worker 1 holds the lease while it shrinks"
    before = counts(sqlite_url)
    first.kill9()
    assert (before["cases"], before["results"], before["buckets"], before["workers"]) == (1, 1, 1, 1), before

    (gate / f"block-{CAUSAL.case_id}").unlink()
    second = cli(*args, env=env)
    assert second.wait(180) == 0, second.output()
    after = counts(sqlite_url)
    ((owner, attempts, minimised_id, note),) = query(
        sqlite_url, "SELECT minimise_owner_id, minimise_attempts, minimised_case_id, minimise_note FROM buckets"
    )
    assert (owner, attempts) == (None, 2), "claimed again by worker 2, then the lease ended"
    assert minimised_id is not None and note.startswith("minimised"), note
    minimal = _stored_case(sqlite_url, minimised_id)
    assert minimal.causal and minimal.seqlen_q <= CAUSAL.seqlen_q, minimal.describe()
    # + the minimised case and its confirm runs: every variant of the backend is re-checked there
    assert (after["cases"], after["results"], after["buckets"]) == (2, 3, 1), after
    assert sorted(query(sqlite_url, "SELECT variant, phase, status FROM results WHERE case_id = :c", c=minimised_id)) == [
        ("buggy", "confirm", "fail"), ("native", "confirm", "pass")
    ]
    assert bucket_id == 1
    assert _workers(sqlite_url) == [(1, "lost", "slot-0"), (2, "stopped", "slot-0")]
    _assert_gap_recorded(sqlite_url)


def test_kill_9_mid_replay_the_next_worker_stores_the_replay_once(cli, sqlite_url, tmp_path) -> None:
    _seed_bucket(sqlite_url, minimised=SMALL)
    gate, env = _gate(tmp_path)
    (gate / f"block-{SMALL.case_id}").touch()  # replay runs the bucket's minimised case
    args = fuzz_args(sqlite_url, tmp_path / "spool", "--max-cases", "0", "--no-shrink")
    first = cli(*args, env=env)
    wait_until((gate / f"blocked-{SMALL.case_id}").exists, 120, "the worker to start the replay")
    before = counts(sqlite_url)
    first.kill9()
    assert (before["cases"], before["results"], before["workers"]) == (2, 1, 1), before

    (gate / f"block-{SMALL.case_id}").unlink()
    second = cli(*args, env=env)
    assert second.wait(180) == 0, second.output()
    after = counts(sqlite_url)
    assert (after["cases"], after["results"], after["buckets"]) == (2, 2, 1), after
    replays = query(sqlite_url, "SELECT variant, status, signature FROM results WHERE phase = 'replay'")
    assert replays == [("buggy", "fail", "out:all_zero")], "redone after the kill and replayed again: one row"
    assert query(sqlite_url, "SELECT hit_count FROM buckets") == [(2,)], "the replay counted once in its bucket"
    calls = (gate / "calls.log").read_text().split()
    assert calls.count(SMALL.case_id) >= 3, "interrupted, redone, replayed"
    assert _workers(sqlite_url) == [(1, "lost", "slot-0"), (2, "stopped", "slot-0")]
    _assert_gap_recorded(sqlite_url)
