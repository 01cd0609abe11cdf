"""Ctrl-C during a shrink keeps the best case so far (issue 18): `minimise` raises
`MinimiseInterrupted` carrying it, and the worker stores it with the bucket before it stops."""

from __future__ import annotations

import pytest

from fuzzer import registry
from fuzzer.minimise import MinimiseInterrupted, minimise
from fuzzer.sinks import MemorySink
from fuzzer.worker import Worker, WorkerConfig
from oracle.config import AttentionCase
from tests.fuzzer.standins import GateBackend

BIG = AttentionCase(batch_size=3, seqlen_q=40, seqlen_k=50, num_heads=4, num_heads_kv=2, head_dim=32, causal=True,
                    dtype="float32")


def _volume(case: AttentionCase) -> int:
    return case.batch_size * case.num_heads * case.seqlen_q * case.seqlen_k


def _interrupt_after(calls: int, fails, *, once_smaller_failed: bool = False):
    """A ``still_fails`` that raises KeyboardInterrupt (Ctrl-C) on every call after ``calls``
    calls, or (``once_smaller_failed``) on the first call after a smaller case failed."""
    seen: list[AttentionCase] = []
    smaller_failed = [False]

    def still_fails(case: AttentionCase) -> bool:
        seen.append(case)
        if len(seen) > calls or smaller_failed[0]:
            raise KeyboardInterrupt
        failed = fails(case)
        if failed and once_smaller_failed and _volume(case) < _volume(BIG):
            smaller_failed[0] = True
        return failed

    return still_fails


def test_ctrl_c_mid_shrink_carries_the_best_case_so_far() -> None:
    with pytest.raises(MinimiseInterrupted) as raised:
        minimise(BIG, _interrupt_after(10_000, lambda c: c.causal, once_smaller_failed=True), deadline_s=60)
    outcome = raised.value.outcome
    assert isinstance(raised.value, KeyboardInterrupt)  # whoever does not look for it still stops
    assert outcome.status == "interrupted" and outcome.original == BIG
    assert outcome.case != BIG and outcome.case.causal
    assert _volume(outcome.case) < _volume(BIG)
    assert "not re-confirmed" in outcome.note


def test_ctrl_c_before_anything_smaller_failed_is_a_plain_interrupt() -> None:
    with pytest.raises(KeyboardInterrupt) as raised:
        minimise(BIG, _interrupt_after(2, lambda c: c.causal), deadline_s=60)  # during the confirmations
    assert not isinstance(raised.value, MinimiseInterrupted)


SMALLER_CALLS = [0]


class InterruptingGate(GateBackend):
    """GateBackend whose ``buggy`` variant is hit by Ctrl-C on its second call on a case smaller
    than the bucket's (the first smaller one failed: it is the best so far)."""

    def run(self, case, inputs, variant):
        if variant == "buggy" and case.batch_size * case.seqlen_q < BIG.batch_size * BIG.seqlen_q:
            SMALLER_CALLS[0] += 1
            if SMALLER_CALLS[0] == 2:
                raise KeyboardInterrupt
        return super().run(case, inputs, variant)


def test_the_worker_stores_the_best_case_so_far_when_ctrl_c_stops_a_shrink() -> None:
    from fuzzer.results import BuildFingerprint, CaseResult

    SMALLER_CALLS[0] = 0
    backends = registry.select([], ["tests.fuzzer.test_minimise_interrupt:InterruptingGate"])
    sink = MemorySink()
    build_id = sink.register_build(BuildFingerprint())
    sink.record_case(BIG.to_json(), "fuzz")
    sink.record_result(CaseResult(BIG.case_id, "standin-gate", "buggy", "fail", signature="out:all_zero"), build_id, None)
    config = WorkerConfig(backends=backends, max_cases=0, time_budget_s=None, isolation="none", shrink_deadline_s=60)
    worker = Worker(config, sink)
    with pytest.raises(KeyboardInterrupt):
        worker.run()
    bucket = sink.buckets[("standin-gate", "buggy", "out:all_zero")]
    assert bucket.note.startswith("interrupted"), bucket.note
    kept = AttentionCase.from_json(bucket.minimised_case)
    assert kept != BIG and kept.causal and kept.batch_size * kept.seqlen_q < BIG.batch_size * BIG.seqlen_q
    assert [(key, outcome.status) for key, outcome in worker.stats.minimised] == [
        (("standin-gate", "buggy", "out:all_zero"), "interrupted")
    ]
