"""`SpoolingSink.record_case_results`: a case with all its results is one spool entry while the
database is away, flushed in order once it is back, and stored once even when the database had
committed the write before the worker saw the connection drop."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from fuzzer.results import BuildFingerprint, CaseResult, SinkFatalError
from fuzzer.spool import Ledger, Spool, SpoolingSink
from oracle.config import AttentionCase
from tests.reliability.test_spool import Clock, FlakySink

CASES = [AttentionCase(seqlen_q=n, seqlen_k=n, head_dim=16, dtype="float32") for n in range(1, 4)]


def _results(case: AttentionCase) -> list[CaseResult]:
    return [
        CaseResult(case.case_id, "b", "native", "pass"),
        CaseResult(case.case_id, "b", "window", "unsupported", detail="no"),
        CaseResult(case.case_id, "b", "buggy", "fail", signature="out:all_zero", signatures=("out:all_zero",)),
    ]


def _sink(tmp_path: Path, inner: FlakySink, ledger: Ledger | None = None) -> tuple[SpoolingSink, Clock]:
    clock = Clock()
    sink = SpoolingSink(inner, Spool(tmp_path / "slot-0"), clock=clock, sleep=lambda s: None, log=lambda line: None,
                        ledger=ledger)
    return sink, clock


def test_an_outage_spools_whole_cases_and_the_flush_stores_each_once_in_order(tmp_path: Path) -> None:
    inner = FlakySink()
    sink, clock = _sink(tmp_path, inner, Ledger(tmp_path / "ledger.jsonl"))
    build_id = sink.register_build(BuildFingerprint())
    first = sink.record_case_results(CASES[0].to_json(), "fuzz", _results(CASES[0]), build_id, None)
    assert first[2] is not None and first[2].is_new
    inner.down = True
    assert sink.record_case_results(CASES[1].to_json(), "fuzz", _results(CASES[1]), build_id, None) == [None] * 3
    inner.down = False
    # not due yet: the next case queues behind the spooled one (order kept)
    assert sink.record_case_results(CASES[2].to_json(), "fuzz", _results(CASES[2]), build_id, None) == [None] * 3
    assert sink.pending == 2
    clock.now += 60
    assert sink.flush()
    assert len(inner.results) == 9 and len(inner.cases) == 3
    order = [entry[1] for entry in inner.accepted if entry[0] == "case"]
    assert order == [c.case_id for c in CASES]
    assert inner.buckets[("b", "buggy", "out:all_zero")].hit_count == 3
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 9  # one ledger line per result, written or spooled


def test_a_write_committed_before_the_connection_dropped_is_not_stored_twice(tmp_path: Path) -> None:
    inner = FlakySink()
    sink, clock = _sink(tmp_path, inner)
    build_id = sink.register_build(BuildFingerprint())
    results = _results(CASES[0])
    inner.record_case_results(CASES[0].to_json(), "fuzz", results, build_id, None)  # committed ...
    inner.down = True  # ... but the worker sees the connection drop and spools it
    sink.record_case_results(CASES[0].to_json(), "fuzz", results, build_id, None)
    inner.down = False
    clock.now += 60
    assert sink.flush()
    assert len(inner.results) == 3
    assert inner.buckets[("b", "buggy", "out:all_zero")].hit_count == 1


def test_a_refused_write_is_kept_in_the_spool_and_raised(tmp_path: Path) -> None:
    inner = FlakySink()
    sink, _ = _sink(tmp_path, inner)
    build_id = sink.register_build(BuildFingerprint())
    inner.refusing = True
    with pytest.raises(SinkFatalError):
        sink.record_case_results(CASES[0].to_json(), "fuzz", _results(CASES[0]), build_id, None)
    assert sink.pending == 1
    ((_, op, payload),) = sink.spool.entries()
    assert op == "record_case_results" and len(payload["results"]) == 3


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_during_a_stored_write_is_raised_after_its_ledger_lines(tmp_path: Path, signum: int) -> None:
    """A Ctrl-C, or a SIGTERM the command made a stop (`fuzzer.results.stop_on_signals`), that
    comes while a case's results are being written is raised once the ledger names them: a
    result stored is a result reported. Before, the `KeyboardInterrupt` came out of the write
    and the ledger missed the case (a stop mid-run then read as results stored but never
    reported)."""
    from fuzzer.results import stop_exit_code, stop_on_signals

    class InterruptedSink(FlakySink):
        def record_case_results(self, *args, **kwargs):
            stored = super().record_case_results(*args, **kwargs)
            signal.raise_signal(signum)  # in this thread: the handler runs before it returns, still inside the write
            return stored

    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background run starts with it ignored
    restore = stop_on_signals()
    try:
        inner = InterruptedSink()
        sink, _ = _sink(tmp_path, inner, Ledger(tmp_path / "ledger.jsonl"))
        build_id = sink.register_build(BuildFingerprint())
        with pytest.raises(KeyboardInterrupt):
            sink.record_case_results(CASES[0].to_json(), "fuzz", _results(CASES[0]), build_id, None)
        assert stop_exit_code() == 128 + signum
    finally:
        restore()
        signal.signal(signal.SIGINT, started_with)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # given back
    assert len(inner.results) == 3
    lines = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [(e["event"], e["variant"], e["written"]) for e in lines] == [
        ("result", "native", True), ("result", "window", True), ("result", "buggy", True)
    ]
