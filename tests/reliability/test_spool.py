"""`Spool` and `SpoolingSink`: outages spool in order and flush once, the spool is bounded and
never drops a write, slots are exclusive, a killed worker's slot is taken over, bad input is
refused before it is spooled."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from fuzzer.results import BuildFingerprint, CaseResult, SinkFatalError, SinkUnavailableError
from fuzzer.sinks import MemorySink
from fuzzer.spool import Ledger, Spool, SpoolError, SpoolFullError, SpoolingSink, TolerantExampleDatabase
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError

CASES = [AttentionCase(seqlen_q=n, seqlen_k=n, head_dim=16, dtype="float32") for n in range(1, 6)]


class FlakySink(MemorySink):
    """A MemorySink that raises while ``down`` (unavailable) or ``refusing`` (fatal), and logs the
    order of the writes it accepts."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.refusing = False
        self.accepted: list[tuple] = []

    def _check(self) -> None:
        if self.refusing:
            raise SinkFatalError("database refuses writes (disk full)")
        if self.down:
            raise SinkUnavailableError("database unavailable: connection refused")

    def record_case(self, case_json, origin):
        self._check()
        case_id = super().record_case(case_json, origin)
        self.accepted.append(("case", case_id))
        return case_id

    def record_result(self, result, build_id, worker_id):
        self._check()
        if result.case_id not in self.cases:
            raise AssertionError("a result arrived before its case: order broken")
        self.accepted.append(("result", result.case_id, result.variant))
        return super().record_result(result, build_id, worker_id)

    def heartbeat(self, worker_id, cases_run, status="running", **figures):
        self._check()
        super().heartbeat(worker_id, cases_run, status, **figures)

    def register_build(self, fingerprint):
        self._check()
        return super().register_build(fingerprint)

    def register_worker(self, *args, **kwargs):
        self._check()
        return super().register_worker(*args, **kwargs)

    def claim_minimisation(self, *args, **kwargs):
        self._check()
        return super().claim_minimisation(*args, **kwargs)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _sink(tmp_path: Path, inner: FlakySink, **kw) -> tuple[SpoolingSink, Clock]:
    clock = Clock()
    spool = Spool(tmp_path / "slot-0", **{k: v for k, v in kw.items() if k == "max_bytes"})
    sink = SpoolingSink(inner, spool, clock=clock, sleep=lambda s: None, log=lambda line: None,
                        ledger=kw.get("ledger"))
    return sink, clock


def _record(sink: SpoolingSink, case: AttentionCase, build_id: int, worker_id: int) -> None:
    sink.record_case(case.to_json(), "fuzz")
    for variant in ("native", "buggy"):
        sink.record_result(CaseResult(case.case_id, "b", variant, "pass"), build_id, worker_id)


def test_an_outage_spools_writes_in_order_and_flushes_each_once_when_the_database_is_back(tmp_path) -> None:
    inner = FlakySink()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sink, clock = _sink(tmp_path, inner, ledger=ledger)
    build_id = sink.register_build(BuildFingerprint())
    worker_id = sink.register_worker(build_id, "h", 1, "cpu")
    _record(sink, CASES[0], build_id, worker_id)
    assert (len(inner.results), sink.pending) == (2, 0)

    inner.down = True
    _record(sink, CASES[1], build_id, worker_id)
    _record(sink, CASES[2], build_id, worker_id)
    sink.heartbeat(worker_id, 3)  # dropped while away: not spooled, never raises
    assert (len(inner.results), sink.pending) == (2, 6), "3 cases x (case + 2 results) minus the first"
    assert sink.claim_minimisation(worker_id, ["b"], 10.0) is None, "no claims while away"

    inner.down = False
    _record(sink, CASES[3], build_id, worker_id)  # still in backoff: spooled behind the others
    assert sink.pending == 9 and len(inner.results) == 2
    clock.now += 60.0  # past the backoff
    _record(sink, CASES[4], build_id, worker_id)
    assert sink.pending == 0
    assert len(inner.results) == 10 and len(inner.cases) == 5
    order = [a[1] for a in inner.accepted if a[0] == "case"]
    assert order == [c.case_id for c in CASES], "the database receives the writes in the worker's order"
    assert (sink.outages, sink.spooled, sink.flushed) == (1, 9, 9)
    ledger.close()
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 10 and sum('"written": false' in line for line in lines) == 6


def test_a_write_the_database_stored_before_failing_is_stored_once_after_the_retry(tmp_path) -> None:
    inner = FlakySink()
    sink, clock = _sink(tmp_path, inner)
    build_id = sink.register_build(BuildFingerprint())
    sink.record_case(CASES[0].to_json(), "fuzz")
    result = CaseResult(CASES[0].case_id, "b", "v", "fail", signature="out:nan")
    inner.record_result(result, build_id, None)  # committed, but the worker saw the connection drop
    inner.down = True
    sink.record_result(result, build_id, None)
    inner.down = False
    clock.now += 60.0
    assert sink.flush() is True
    assert len(inner.results) == 1 and inner.buckets[("b", "v", "out:nan")].hit_count == 1


def test_the_spool_is_bounded_and_a_full_spool_drops_nothing(tmp_path) -> None:
    inner = FlakySink()
    sink, clock = _sink(tmp_path, inner, max_bytes=2000)
    build_id = sink.register_build(BuildFingerprint())
    inner.down = True
    with pytest.raises(SpoolFullError, match=r"spool .*slot-0 is full: .* > max_bytes 2000 .* nothing was dropped"):
        for case in CASES * 10:
            _record(sink, case, build_id, None)
    kept = sink.pending
    assert kept > 0 and sink.spool.size_bytes <= 2000
    inner.down = False
    clock.now += 60.0
    assert sink.flush() and len(inner.cases) + len(inner.results) == kept


def test_a_refusing_database_raises_at_once_and_keeps_the_write(tmp_path) -> None:
    inner = FlakySink()
    sink, _ = _sink(tmp_path, inner)
    build_id = sink.register_build(BuildFingerprint())
    sink.record_case(CASES[0].to_json(), "fuzz")
    inner.refusing = True
    with pytest.raises(SinkFatalError, match="disk full"):
        sink.record_result(CaseResult(CASES[0].case_id, "b", "v", "pass"), build_id, None)
    assert sink.pending == 1 and len(inner.results) == 0
    with pytest.raises(SinkFatalError):
        sink.flush()
    assert sink.pending == 1, "still kept"
    inner.refusing = False
    assert sink.flush() and len(inner.results) == 1


def test_bad_input_is_refused_before_it_reaches_the_spool(tmp_path) -> None:
    inner = FlakySink()
    sink, _ = _sink(tmp_path, inner)
    inner.down = True
    with pytest.raises(CaseValidationError, match="num_heads_kv"):
        sink.record_case({**CASES[0].to_json(), "num_heads": 4, "num_heads_kv": 3}, "fuzz")
    with pytest.raises(CaseValidationError, match="schema_version"):
        sink.record_case({**CASES[0].to_json(), "schema_version": 0}, "fuzz")
    assert sink.pending == 0


def test_register_retries_with_backoff_and_gives_up_with_a_clear_error(tmp_path) -> None:
    inner = FlakySink()
    waits: list[float] = []
    clock = Clock()

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.now += seconds
        if len(waits) == 3:
            inner.down = False

    spool = Spool(tmp_path / "slot-0")
    sink = SpoolingSink(inner, spool, clock=clock, sleep=sleep, log=lambda line: None, startup_timeout_s=100.0)
    inner.down = True
    build_id = sink.register_build(BuildFingerprint())
    assert waits == [0.5, 1.0, 2.0] and build_id == 1
    inner.down = True
    with pytest.raises(SinkUnavailableError, match="register_worker: the database stayed unavailable for 100 s") as caught:
        sink.register_worker(build_id, "h", 1, "cpu")
    assert caught.value.exit_code == 5  # as a database that cannot be opened (README's exit codes)
    inner.target = "the service"  # fuzz --server's HttpSink: its messages name the service
    with pytest.raises(SinkUnavailableError, match="register_worker: the service stayed unavailable for 100 s"):
        sink.register_worker(build_id, "h", 1, "cpu")


def test_a_slot_whose_last_worker_stopped_cleanly_is_reused_without_a_warning(tmp_path) -> None:
    """The final "stopped" heartbeat marks the slot free: the next worker of the slot takes
    nothing over and logs nothing (a new user saw a takeover warning after every clean run);
    after a worker that did not stop, the warning stays (the test above)."""
    root = tmp_path / "spool"
    inner = FlakySink()
    first = Spool.acquire(root, "sqlite:///x.db")
    lines: list[str] = []
    sink = SpoolingSink(inner, first, log=lines.append)
    build_id = sink.register_build(BuildFingerprint())
    done = sink.register_worker(build_id, "h", 1, "cpu")
    sink.heartbeat(done, 3, status="stopped")
    first.close()
    successor = SpoolingSink(inner, Spool.acquire(root, "sqlite:///x.db"), log=lines.append)
    successor.register_worker(build_id, "h", 2, "cpu")
    assert successor.taken_over_worker_id is None and inner.workers[done]["status"] == "stopped"
    assert not any("last used by" in line for line in lines), lines
    successor.spool.close()


def test_a_slot_is_held_by_one_worker_and_taken_over_after_it_dies(tmp_path) -> None:
    root = tmp_path / "spool"
    first = Spool.acquire(root, "sqlite:///x.db")
    second = Spool.acquire(root, "sqlite:///x.db")
    other_db = Spool.acquire(root, "sqlite:///y.db")
    assert (first.slot, second.slot, other_db.slot) == ("slot-0", "slot-1", "slot-0")
    assert first.path.parent != other_db.path.parent
    inner = FlakySink()
    sink = SpoolingSink(inner, first, log=lambda line: None)
    build_id = sink.register_build(BuildFingerprint())
    dead = sink.register_worker(build_id, "h", 1, "cpu")
    first.begin_evaluation(CASES[0].to_json(), "fuzz", None)
    inner.down = True
    sink.record_case(CASES[1].to_json(), "fuzz")
    first.close()  # the kernel does this when the worker dies
    inner.down = False

    taken = Spool.acquire(root, "sqlite:///x.db")
    assert taken.slot == "slot-0"
    assert taken.interrupted_evaluation() == {"case": CASES[0].to_json(), "phase": "fuzz", "tasks": None}
    successor = SpoolingSink(inner, taken, log=lambda line: None)
    new = successor.register_worker(build_id, "h", 2, "cpu")
    assert successor.taken_over_worker_id == dead and inner.workers[dead]["status"] == "lost"
    assert inner.workers[new]["slot"] == "slot-0"
    assert CASES[1].case_id in inner.cases and taken.meta("worker_id") == str(new)
    second.close(), other_db.close(), taken.close()


def _hold(path: str, ready, release) -> None:
    spool = Spool(path)
    ready.set()
    release.wait(30)
    spool.close()


def test_another_process_holding_a_slot_makes_acquire_take_the_next_one(tmp_path) -> None:
    context = multiprocessing.get_context("spawn")
    ready, release = context.Event(), context.Event()
    group = Spool.acquire(tmp_path, "sqlite:///x.db").path.parent
    (group / "slot-0" / "lock").touch()
    holder = context.Process(target=_hold, args=(str(group / "slot-1"), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(BlockingIOError):
            Spool(group / "slot-1")
        taken = Spool.acquire(tmp_path, "sqlite:///x.db", max_slots=3)
        assert taken.slot == "slot-2"
        with pytest.raises(SpoolError, match="all 3 spool slots are held"):
            Spool.acquire(tmp_path, "sqlite:///x.db", max_slots=3)
        taken.close()
    finally:
        release.set()
        holder.join(30)


def test_a_spool_of_another_format_version_is_refused_with_a_clear_message(tmp_path) -> None:
    Spool(tmp_path / "slot-0").close()
    with sqlite3.connect(tmp_path / "slot-0" / "spool.sqlite3") as db:
        db.execute("UPDATE meta SET value = '0' WHERE key = 'format_version'")
    with pytest.raises(SpoolError, match=r"format_version '0' is not supported \(allowed: 1\)"):
        Spool(tmp_path / "slot-0")
    (tmp_path / "slot-1").mkdir()
    (tmp_path / "slot-1" / "spool.sqlite3").write_bytes(b"not a database" * 100)
    with pytest.raises(SpoolError, match="cannot open the spool"):
        Spool(tmp_path / "slot-1")
    Spool(tmp_path / "slot-1" / "again").close()  # the failed opens released their locks


def test_the_example_database_wrapper_rides_out_an_outage() -> None:
    from hypothesis.database import InMemoryExampleDatabase

    class Away(InMemoryExampleDatabase):
        down = False

        def save(self, key, value):
            if self.down:
                raise SinkUnavailableError("away")
            super().save(key, value)

        def fetch(self, key):
            if self.down:
                raise SinkUnavailableError("away")
            return super().fetch(key)

    inner = Away()
    db = TolerantExampleDatabase(inner)
    db.save(b"k", b"1")
    inner.down = True
    db.save(b"k", b"2")
    assert list(db.fetch(b"k")) == [] and db.dropped == 1
    inner.down = False
    assert list(db.fetch(b"k")) == [b"1"]


def test_the_spool_counts_its_writes_across_append_remove_reject_and_reopening(tmp_path) -> None:
    spool = Spool(tmp_path / "slot-0")
    seqs = [spool.append("record_case", {"case_json": CASES[0].to_json(), "origin": "fuzz"}) for _ in range(3)]
    assert len(spool) == 3
    spool.remove(seqs[0])
    spool.remove(seqs[0])  # already gone: nothing changes
    spool.reject(seqs[1], "refused")
    assert len(spool) == 1 and [seq for seq, _, _ in spool.entries()] == [seqs[2]]
    spool.close()
    again = Spool(tmp_path / "slot-0")
    assert len(again) == 1 and again.size_bytes > 0 and len(again.rejected()) == 1
    again.close()


def test_a_relative_sqlite_url_names_the_file_in_the_working_directory(tmp_path, monkeypatch) -> None:
    from fuzzer.spool import canonical_database_url, database_key

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    in_a = canonical_database_url("sqlite:///attnfuzz.db?timeout=30")
    key_a = database_key("sqlite:///attnfuzz.db")
    monkeypatch.chdir(tmp_path / "b")
    assert in_a == f"sqlite:///{tmp_path / 'a' / 'attnfuzz.db'}?timeout=30"
    assert database_key("sqlite:///attnfuzz.db") != key_a, "two directories, two databases, two slot groups"
    assert database_key(f"sqlite:///{tmp_path / 'b' / 'attnfuzz.db'}") == database_key("sqlite:///attnfuzz.db")
    for url in ("sqlite://", "sqlite:///:memory:", "postgresql+psycopg://u@h/db", "sqlite:////abs/x.db"):
        assert canonical_database_url(url) == url


def test_a_slot_that_outlived_its_database_does_not_stop_the_next_worker(tmp_path) -> None:
    """The database file was deleted and created again: the slot's last worker is unknown there."""
    root = tmp_path / "spool"
    first = Spool.acquire(root, "sqlite:///x.db")
    old_database = FlakySink()
    old = SpoolingSink(old_database, first, log=lambda line: None)
    old_build = old.register_build(BuildFingerprint())
    old_database.register_worker(old_build, "other-host", 7, "cpu")  # so the slot's worker is not id 1
    assert old.register_worker(old_build, "h", 1, "cpu") != 1
    first.close()

    lines: list[str] = []
    new_database = FlakySink()  # empty: knows no worker
    successor = SpoolingSink(new_database, Spool.acquire(root, "sqlite:///x.db"), log=lines.append)
    build_id = successor.register_build(BuildFingerprint())
    worker_id = successor.register_worker(build_id, "h", 2, "cpu")
    assert successor.taken_over_worker_id is None
    assert new_database.workers[worker_id]["status"] == "running"
    assert any("does not know" in line for line in lines)
    assert new_database.mark_worker_lost(worker_id + 99) is False
    successor.spool.close()


@pytest.mark.parametrize("write", ["record_case_results", "record_result"])
def test_results_spooled_by_a_write_the_database_refuses_are_in_the_ledger(tmp_path, write) -> None:
    """A refused write (read-only or full database) keeps the entry in the spool and stops the
    worker; a later run flushes it. The ledger names those results (written False) before the
    stop, so stored and reported match after the flush (a CI run on a loaded machine saw results
    stored but never reported after PostgreSQL was turned read-only)."""
    import json

    inner = FlakySink()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sink, _ = _sink(tmp_path, inner, ledger=ledger)
    build_id = sink.register_build(BuildFingerprint())
    worker_id = sink.register_worker(build_id, "h", 1, "cpu")
    case = CASES[0]
    results = [CaseResult(case.case_id, "b", variant, "pass") for variant in ("native", "buggy")]
    inner.refusing = True
    with pytest.raises(SinkFatalError):
        if write == "record_case_results":
            sink.record_case_results(case.to_json(), "fuzz", results, build_id, worker_id)
        else:
            sink.record_case(case.to_json(), "fuzz")
    if write == "record_result":
        with pytest.raises(SinkFatalError):
            sink.record_result(results[0], build_id, worker_id)
        results = results[:1]
    lines = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    reported = [(e["variant"], e["written"]) for e in lines if e["event"] == "result"]
    assert reported == [(r.variant, False) for r in results]
    assert sink.pending >= 1
    inner.refusing = False
    sink.flush()
    assert len(inner.results) == len(results) and sink.pending == 0
