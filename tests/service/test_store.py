"""`SqlStore`: idempotent writes, buckets, minimised cases, and concurrent worker processes."""

from __future__ import annotations

import math
import multiprocessing
import sqlite3
from datetime import UTC, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fuzzer.results import BucketUpdate, BuildFingerprint, CaseResult
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from service.db import migrations
from service.db.engine import Transactor, ctrl_c_deferred, make_engine
from service.errors import FieldValidationError, NotFoundError
from service.db.models import Bucket, Build, Case, Result, Worker, utcnow
from service.db.engine import StoreRefusedError, StoreUnavailableError
from service.db.store import SqlStore
from service.db.workers import heartbeat_gaps
from tests.service.conftest import Seeded

CASE = AttentionCase(batch_size=2, seqlen_q=113, seqlen_k=799, num_heads=4, causal=True, softcap=30.0)


def _failure(case_id: str, signature: str = "out:nan", **kw: object) -> CaseResult:
    return CaseResult(case_id=case_id, backend="sdpa", variant="default", status="fail", signature=signature, **kw)


def _count(session: Session, model: type) -> int:
    return session.scalar(select(func.count()).select_from(model))


@pytest.fixture
def build_id(store: SqlStore) -> int:
    return store.register_build(BuildFingerprint(torch="2.13.0", device_name="NVIDIA H200"))


@pytest.fixture
def case_id(store: SqlStore) -> str:
    return store.record_case(CASE.to_json(), "fuzz")


def test_register_build_returns_the_same_id_for_the_same_fingerprint(store: SqlStore, session: Session) -> None:
    first = store.register_build(BuildFingerprint(torch="2.13.0"))
    again = store.register_build(BuildFingerprint(torch="2.13.0"))
    other = store.register_build(BuildFingerprint(torch="2.14.0"))
    assert first == again != other
    build = session.get(Build, first)
    assert build.fingerprint_id == BuildFingerprint(torch="2.13.0").fingerprint_id
    assert build.torch == "2.13.0"
    assert build.first_seen.tzinfo is UTC


def test_record_case_stores_once_with_its_filter_columns(store: SqlStore, session: Session) -> None:
    first = store.record_case(CASE.to_json(), "fuzz")
    again = store.record_case(CASE.to_json(), "replay")
    assert first == again == CASE.case_id
    assert _count(session, Case) == 1
    row = session.get(Case, first)
    assert row.origin == "fuzz", "the first origin is kept"
    assert row.to_attention_case() == CASE
    assert (row.seqlen_q, row.seqlen_k, row.num_heads_kv, row.dtype) == (113, 799, 4, "bfloat16")
    assert (row.causal, row.has_window, row.has_softcap, row.backward) == (True, False, True, True)


def test_record_case_rejects_invalid_cases_and_unknown_origins(store: SqlStore) -> None:
    with pytest.raises(CaseValidationError, match="num_heads_kv"):
        store.record_case({**CASE.to_json(), "num_heads_kv": 3}, "fuzz")
    with pytest.raises(FieldValidationError, match="origin"):
        store.record_case(CASE.to_json(), "guess")


def test_the_same_result_twice_is_one_row_and_one_hit(
    store: SqlStore, session: Session, build_id: int, case_id: str
) -> None:
    first = store.record_result(_failure(case_id), build_id, None)
    again = store.record_result(_failure(case_id, run_ms=99.0), build_id, None)
    assert first == BucketUpdate(bucket_id=first.bucket_id, is_new=True)
    assert again == BucketUpdate(bucket_id=first.bucket_id, is_new=False)
    assert _count(session, Result) == 1
    assert session.scalar(select(Result.run_ms)) == 0.0, "the first write wins"
    assert session.get(Bucket, first.bucket_id).hit_count == 1


def test_two_failing_results_of_one_bucket_make_one_bucket_with_two_hits(
    store: SqlStore, session: Session, build_id: int, case_id: str
) -> None:
    later_build = store.register_build(BuildFingerprint(torch="2.14.0"))
    first = store.record_result(_failure(case_id), build_id, None)
    second = store.record_result(_failure(case_id, phase="replay"), later_build, None)
    assert (first.is_new, second.is_new) == (True, False)
    assert first.bucket_id == second.bucket_id
    bucket = session.get(Bucket, first.bucket_id)
    assert bucket.hit_count == 2
    assert (bucket.first_build_id, bucket.last_build_id) == (build_id, later_build)
    assert bucket.first_case_id == case_id
    assert bucket.last_seen >= bucket.first_seen
    assert _count(session, Bucket) == 1
    assert _count(session, Result) == 2


def test_a_different_signature_opens_a_new_bucket(store: SqlStore, build_id: int, case_id: str) -> None:
    nan = store.record_result(_failure(case_id, "out:nan"), build_id, None)
    zero = store.record_result(_failure(case_id, "out:all_zero", phase="confirm"), build_id, None)
    assert zero.is_new and zero.bucket_id != nan.bucket_id
    assert store.known_bucket_keys() == {("sdpa", "default", "out:nan"), ("sdpa", "default", "out:all_zero")}


def test_non_failures_are_stored_without_a_bucket(
    store: SqlStore, session: Session, build_id: int, case_id: str
) -> None:
    passed = CaseResult(case_id=case_id, backend="sdpa", variant="default", status="pass", error_ratio=0.3)
    assert store.record_result(passed, build_id, None) is None
    assert store.record_result(passed, build_id, None) is None
    assert _count(session, Result) == 1
    assert _count(session, Bucket) == 0
    assert store.known_bucket_keys() == set()


def test_results_need_a_recorded_case_build_and_worker(store: SqlStore, build_id: int, case_id: str) -> None:
    with pytest.raises(NotFoundError, match="case"):
        store.record_result(_failure("0123456789abcdef"), build_id, None)
    with pytest.raises(NotFoundError, match="build"):
        store.record_result(_failure(case_id), build_id + 1000, None)
    with pytest.raises(NotFoundError, match="worker"):
        store.record_result(_failure(case_id), build_id, 123456)


def test_metrics_with_non_finite_floats_are_stored_as_strings(
    store: SqlStore, session: Session, build_id: int, case_id: str
) -> None:
    metrics = {"out": {"err_backend": math.nan, "error_ratio": math.inf, "err_baseline": -math.inf, "ok": 1.5}}
    store.record_result(_failure(case_id, metrics=metrics), build_id, None)
    stored = session.scalar(select(Result.metrics))
    assert stored == {"out": {"err_backend": "nan", "error_ratio": "inf", "err_baseline": "-inf", "ok": 1.5}}


def test_record_minimised_stores_the_case_and_points_the_bucket_at_it(
    store: SqlStore, session: Session, build_id: int, case_id: str
) -> None:
    bucket_id = store.record_result(_failure(case_id), build_id, None).bucket_id
    small = AttentionCase(seqlen_q=2, seqlen_k=2, causal=True)
    store.record_minimised(bucket_id, small.to_json(), case_id, "shrunk in 12 steps")
    bucket = session.get(Bucket, bucket_id)
    assert bucket.minimised_case_id == small.case_id
    assert bucket.minimise_note == "shrunk in 12 steps"
    assert bucket.first_case_id == case_id
    assert session.get(Case, small.case_id).origin == "minimised"


def test_record_minimised_rejects_unknown_buckets_and_original_cases(
    store: SqlStore, session: Session, build_id: int, case_id: str
) -> None:
    bucket_id = store.record_result(_failure(case_id), build_id, None).bucket_id
    small = AttentionCase(seqlen_q=2).to_json()
    with pytest.raises(NotFoundError, match="bucket"):
        store.record_minimised(bucket_id + 1000, small, case_id, "")
    with pytest.raises(NotFoundError, match="case"):
        store.record_minimised(bucket_id, small, "ffffffffffffffff", "")
    assert session.get(Bucket, bucket_id).minimised_case_id is None
    assert session.get(Case, AttentionCase(seqlen_q=2).case_id) is None, "the failed call left nothing behind"


def test_known_failures_give_the_minimised_case_else_the_first_one(
    store: SqlStore, build_id: int, case_id: str
) -> None:
    bucket_id = store.record_result(_failure(case_id), build_id, None).bucket_id
    first = store.known_failures([_failure(case_id).backend])
    assert [(key, AttentionCase.from_json(c).case_id) for key, c in first] == [
        (_failure(case_id).bucket_key, case_id)
    ]
    small = AttentionCase(seqlen_q=2, seqlen_k=2, causal=True)
    store.record_minimised(bucket_id, small.to_json(), case_id, "shrunk")
    (_, case_json), = store.known_failures([_failure(case_id).backend])
    assert AttentionCase.from_json(case_json) == small
    assert store.known_failures(["some-other-backend"]) == []


def test_workers_register_and_heartbeat(store: SqlStore, session: Session, build_id: int) -> None:
    worker_id = store.register_worker(build_id, "gpu-host", 77, "cuda:3")
    started = session.get(Worker, worker_id)
    assert (started.status, started.cases_run, started.device) == ("running", 0, "cuda:3")
    session.expire_all()
    store.heartbeat(worker_id, 120, "stopping")
    worker = session.get(Worker, worker_id)
    assert (worker.cases_run, worker.status) == (120, "stopping")
    assert worker.last_heartbeat >= worker.started_at
    with pytest.raises(NotFoundError, match="worker"):
        store.heartbeat(worker_id + 1000, 1)
    with pytest.raises(NotFoundError, match="build"):
        store.register_worker(build_id + 1000, "h", 1, "cpu")


def test_seeded_data_counts_hits_per_bucket(seeded: Seeded, session: Session) -> None:
    assert session.get(Bucket, seeded.nan_bucket_id).hit_count == 3  # two fuzz cases + the shrink run
    assert session.get(Bucket, seeded.crash_bucket_id).hit_count == 1
    assert _count(session, Bucket) == 3


# ------------------------------------------------------------------------------ concurrency
PROCESSES = 4
SHARED_CASES = 8


def _worker_process(
    url: str, index: int, barrier: multiprocessing.synchronize.Barrier, queue: multiprocessing.Queue
) -> None:
    """Every process writes the same shared results plus its own; reports its BucketUpdates."""
    engine = make_engine(url)
    try:
        store = SqlStore(engine)
        barrier.wait(timeout=120)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        worker_id = store.register_worker(build_id, "host", 1000 + index, f"cuda:{index}")
        updates = []
        for i in range(SHARED_CASES):
            case_id = store.record_case(AttentionCase(seqlen_q=i + 1).to_json(), "fuzz")
            updates.append(store.record_result(_failure(case_id), build_id, worker_id))
            own = CaseResult(case_id=case_id, backend="sdpa", variant=f"p{index}", status="crash", signature="crash")
            updates.append(store.record_result(own, build_id, worker_id))
            store.heartbeat(worker_id, i + 1)
        queue.put((index, [(u.bucket_id, u.is_new) for u in updates]))
    except BaseException as exc:  # report instead of hanging the parent
        queue.put((index, repr(exc)))
    finally:
        engine.dispose()


def test_concurrent_worker_processes_write_one_bucket_per_key(fresh_database_url: str) -> None:
    migrations.upgrade(fresh_database_url)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    queue = context.Queue()
    processes = [
        context.Process(target=_worker_process, args=(fresh_database_url, i, barrier, queue)) for i in range(PROCESSES)
    ]
    for p in processes:
        p.start()
    reports = dict(queue.get(timeout=300) for _ in processes)
    for p in processes:
        p.join(timeout=60)
    errors = {i: r for i, r in reports.items() if isinstance(r, str)}
    assert not errors, f"worker processes failed: {errors}"

    updates = [u for r in reports.values() for u in r]
    shared_new = [u for r in reports.values() for u in r[0::2] if u[1]]
    assert len(shared_new) == 1, f"exactly one process opens the shared bucket, got {shared_new}"
    assert all(r[1][1] for r in reports.values()), "each process opens its own bucket on its first crash"
    assert len(updates) == PROCESSES * SHARED_CASES * 2

    engine = make_engine(fresh_database_url)
    try:
        with Session(engine) as session:
            assert _count(session, Build) == 1
            assert _count(session, Case) == SHARED_CASES
            assert _count(session, Worker) == PROCESSES
            assert _count(session, Result) == SHARED_CASES * (1 + PROCESSES)
            hits = {variant: n for variant, n in session.execute(select(Bucket.variant, Bucket.hit_count))}
            assert hits == {"default": SHARED_CASES, **{f"p{i}": SHARED_CASES for i in range(PROCESSES)}}
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ minimisation leases
LATER = timedelta(hours=1)


def _bucket_ids(store: SqlStore, build_id: int, n: int) -> list[int]:
    ids = []
    for i in range(n):
        case_id = store.record_case(AttentionCase(seqlen_q=i + 1).to_json(), "fuzz")
        ids.append(store.record_result(_failure(case_id, f"out:sig{i}"), build_id, None).bucket_id)
    return ids


def test_a_bucket_is_claimed_by_one_worker_until_its_lease_expires(
    store: SqlStore, session: Session, build_id: int
) -> None:
    (bucket_id,) = _bucket_ids(store, build_id, 1)
    one = store.register_worker(build_id, "h", 1, "cpu")
    two = store.register_worker(build_id, "h", 2, "cpu")
    claim = store.claim_minimisation(one, ["sdpa"], lease_s=60.0)
    assert (claim.bucket_id, claim.key, claim.attempt) == (bucket_id, ("sdpa", "default", "out:sig0"), 1)
    assert AttentionCase.from_json(claim.case_json).seqlen_q == 1
    assert store.claim_minimisation(two, ["sdpa"], lease_s=60.0) is None, "held by worker one"
    assert store.claim_minimisation(one, ["other-backend"], lease_s=60.0) is None
    assert store.renew_minimisation(bucket_id, one, lease_s=60.0) is True
    assert store.renew_minimisation(bucket_id, two, lease_s=60.0) is False

    taken = store.claim_minimisation(two, ["sdpa"], lease_s=60.0, now=utcnow() + LATER)
    assert (taken.bucket_id, taken.attempt) == (bucket_id, 2), "an expired lease is taken over"
    assert store.renew_minimisation(bucket_id, one, lease_s=60.0) is False, "worker one lost it"
    session.expire_all()
    assert session.get(Bucket, bucket_id).minimise_owner_id == two


def test_recording_the_minimised_case_ends_the_lease_and_the_bucket_is_never_claimed_again(
    store: SqlStore, session: Session, build_id: int
) -> None:
    (bucket_id,) = _bucket_ids(store, build_id, 1)
    worker = store.register_worker(build_id, "h", 1, "cpu")
    claim = store.claim_minimisation(worker, ["sdpa"], lease_s=60.0)
    store.record_minimised(bucket_id, AttentionCase(seqlen_q=1, seqlen_k=1).to_json(), claim.case_json and
                           AttentionCase.from_json(claim.case_json).case_id, "minimised: test")
    bucket = session.get(Bucket, bucket_id)
    assert (bucket.minimise_owner_id, bucket.minimise_lease_expires_at) == (None, None)
    assert store.claim_minimisation(worker, ["sdpa"], lease_s=60.0, now=utcnow() + LATER) is None


def test_a_bucket_claimed_max_attempts_times_is_left_alone(store: SqlStore, build_id: int) -> None:
    _bucket_ids(store, build_id, 1)
    worker = store.register_worker(build_id, "h", 1, "cpu")
    attempts = []
    for hour in range(4):
        claim = store.claim_minimisation(worker, ["sdpa"], 60.0, max_attempts=3, now=utcnow() + hour * LATER)
        attempts.append(None if claim is None else claim.attempt)
    assert attempts == [1, 2, 3, None]


def test_released_lost_and_stopped_workers_give_their_leases_back(
    store: SqlStore, session: Session, build_id: int
) -> None:
    first, second, third = _bucket_ids(store, build_id, 3)
    worker = store.register_worker(build_id, "h", 1, "cpu")
    other = store.register_worker(build_id, "h", 2, "cpu")
    assert [store.claim_minimisation(worker, ["sdpa"], 60.0).bucket_id for _ in range(3)] == [first, second, third]
    store.release_minimisation(first, worker, "not minimised: gave up")
    store.release_minimisation(second, other, "not mine: ignored")
    store.mark_worker_lost(worker)
    session.expire_all()
    assert session.get(Worker, worker).status == "lost"
    assert session.get(Bucket, first).minimise_note == "not minimised: gave up"
    assert session.get(Bucket, second).minimise_note == ""
    assert [store.claim_minimisation(other, ["sdpa"], 60.0).bucket_id for _ in range(3)] == [first, second, third]
    store.heartbeat(other, 3, status="stopped")
    session.expire_all()
    assert session.scalar(select(func.count()).where(Bucket.minimise_owner_id.is_not(None))) == 0
    store.mark_worker_lost(other)
    session.expire_all()
    assert session.get(Worker, other).status == "stopped", "a cleanly stopped worker is not marked lost"
    assert store.mark_worker_lost(other + 1000) is False  # e.g. a spool slot that outlived its database
    with pytest.raises(FieldValidationError, match="lease_s"):
        store.claim_minimisation(other, ["sdpa"], 0.0)


def test_worker_runs_show_the_heartbeat_gap_of_a_restarted_slot(store: SqlStore, build_id: int) -> None:
    killed = store.register_worker(build_id, "gpu-host", 10, "cuda:0", slot="slot-0")
    other = store.register_worker(build_id, "gpu-host", 11, "cuda:1", slot="slot-1")
    store.heartbeat(killed, 5)
    restarted = store.register_worker(build_id, "gpu-host", 12, "cuda:0", slot="slot-0")
    store.mark_worker_lost(killed)
    store.heartbeat(restarted, 1, status="stopped")
    again = store.register_worker(build_id, "gpu-host", 13, "cuda:0", slot="slot-0")
    runs = store.worker_runs("gpu-host")
    assert [s.worker_id for s in runs] == [killed, other, restarted, again]
    gaps = heartbeat_gaps(runs)
    assert [(g.before.worker_id, g.after.worker_id, g.clean) for g in gaps] == [(killed, restarted, False), (restarted, again, True)]
    assert all(g.gap_s >= 0 for g in gaps)
    assert runs[0].status == "lost" and runs[0].cases_run == 5
    assert store.worker_runs("elsewhere") == []


def _claimer(url: str, index: int, barrier, queue) -> None:
    engine = make_engine(url)
    try:
        store = SqlStore(engine)
        build_id = store.register_build(BuildFingerprint(torch="2.13.0"))
        worker_id = store.register_worker(build_id, "host", 2000 + index, "cpu")
        barrier.wait(timeout=120)
        claimed = []
        while (claim := store.claim_minimisation(worker_id, ["sdpa"], 600.0)) is not None:
            claimed.append(claim.bucket_id)
        queue.put((index, claimed))
    except BaseException as exc:  # report instead of hanging the parent
        queue.put((index, repr(exc)))
    finally:
        engine.dispose()


def test_concurrent_workers_claim_each_bucket_exactly_once(fresh_database_url: str) -> None:
    migrations.upgrade(fresh_database_url)
    engine = make_engine(fresh_database_url)
    try:
        store = SqlStore(engine)
        ids = _bucket_ids(store, store.register_build(BuildFingerprint(torch="2.13.0")), 24)
    finally:
        engine.dispose()
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(PROCESSES), context.Queue()
    processes = [context.Process(target=_claimer, args=(fresh_database_url, i, barrier, queue)) for i in range(PROCESSES)]
    for p in processes:
        p.start()
    reports = dict(queue.get(timeout=300) for _ in processes)
    for p in processes:
        p.join(timeout=60)
    errors = {i: r for i, r in reports.items() if isinstance(r, str)}
    assert not errors, f"claiming processes failed: {errors}"
    claimed = [b for r in reports.values() for b in r]
    assert sorted(claimed) == sorted(ids), "every bucket claimed, none twice"
    engine = make_engine(fresh_database_url)
    try:
        with Session(engine) as session:
            assert set(session.scalars(select(Bucket.minimise_attempts))) == {1}
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ faults
def test_a_sqlite_file_locked_past_the_busy_timeout_is_unavailable_and_nothing_is_written(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    migrations.upgrade(url)
    engine = make_engine(url, timeout_s=0.05)
    holder = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
    try:
        store = SqlStore(engine, retries=1)
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreUnavailableError, match="database unavailable: database is locked"):
            store.record_case(CASE.to_json(), "fuzz")
        holder.execute("ROLLBACK")
        with Session(engine) as session:
            assert _count(session, Case) == 0
        assert store.record_case(CASE.to_json(), "fuzz") == CASE.case_id, "fine once the lock is gone"
    finally:
        holder.close()
        engine.dispose()


def test_an_unreachable_postgresql_server_is_unavailable() -> None:
    from tests.reliability.pgcluster import free_port

    engine = make_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test", timeout_s=1)
    try:
        with pytest.raises(StoreUnavailableError, match="database unavailable: connection"):
            SqlStore(engine).register_build(BuildFingerprint())
    finally:
        engine.dispose()


def test_a_read_only_database_refuses_writes_with_a_clear_error(database, tmp_path) -> None:
    from sqlalchemy import event

    engine = make_engine(database.url)
    if database.kind == "postgresql":
        @event.listens_for(engine, "connect")
        def _read_only(dbapi_connection, _record):
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SET SESSION default_transaction_read_only = on")
            dbapi_connection.commit()
    else:
        import shutil

        copy = tmp_path / "ro.db"
        shutil.copy(database.url.removeprefix("sqlite:///"), copy)
        engine.dispose()
        engine = make_engine(f"sqlite:///file:{copy}?mode=ro&uri=true")
    try:
        with pytest.raises(StoreRefusedError, match=r"database refuses writes \(read-only database\)"):
            SqlStore(engine).record_case(AttentionCase(seqlen_q=77).to_json(), "fuzz")
        with Session(engine) as session:
            assert session.get(Case, AttentionCase(seqlen_q=77).case_id) is None
    finally:
        engine.dispose()


def test_a_ctrl_c_inside_a_write_waits_for_its_commit_and_leaves_no_lock(tmp_path) -> None:
    """Ctrl-C (SIGINT) arriving in the middle of a write transaction: the write is committed whole,
    the `KeyboardInterrupt` comes after it, and the next write (another connection, as a worker's
    last heartbeat is) gets the lock at once. Before, the interrupt could cut the transaction and
    leave the write lock held (a ``fuzz --workers 2`` run that hung after Ctrl-C)."""
    import signal

    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)  # a run in the background starts with it ignored
    try:
        _ctrl_c_in_a_write(tmp_path)
    finally:
        signal.signal(signal.SIGINT, started_with)


def _ctrl_c_in_a_write(tmp_path) -> None:
    import signal
    import threading

    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'c.db'}"
    engine = make_engine(url, timeout_s=1)
    try:
        Transactor(engine).write(lambda c: c.execute(text("CREATE TABLE t (x INTEGER)")))

        def insert_with_ctrl_c(connection) -> None:
            connection.execute(text("INSERT INTO t VALUES (1)"))
            signal.raise_signal(signal.SIGINT)  # in this thread: the handler runs before it returns, inside the transaction
            connection.execute(text("INSERT INTO t VALUES (2)"))

        with pytest.raises(KeyboardInterrupt):
            Transactor(engine).write(insert_with_ctrl_c)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is given back
        other = make_engine(url, timeout_s=1)
        try:
            Transactor(other).write(lambda c: c.execute(text("INSERT INTO t VALUES (3)")))  # no lock left behind
            assert Transactor(other).read(lambda c: sorted(c.scalars(text("SELECT x FROM t")))) == [1, 2, 3]
        finally:
            other.dispose()
    finally:
        engine.dispose()

    seen: list[bool] = []  # outside the main thread nothing is swapped (signals reach only the main thread)
    thread = threading.Thread(target=lambda: seen.append(_swapped_inside(ctrl_c_deferred)))
    thread.start()
    thread.join()
    assert seen == [False]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a caller's own setting is left alone
    try:
        assert not _swapped_inside(ctrl_c_deferred)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert _swapped_inside(ctrl_c_deferred)


def _swapped_inside(deferred) -> bool:
    """Whether ``deferred()`` replaced SIGINT's handler while its block ran."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    with deferred():
        inside = signal.getsignal(signal.SIGINT)
    return inside is not before
