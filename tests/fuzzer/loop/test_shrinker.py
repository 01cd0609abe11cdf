"""`fuzzer.loop.shrinker`: the shrink share, the still-fails predicate and the buckets kept
unshrunk, with a stand-in sink and evaluation instead of a worker."""

from __future__ import annotations

import dataclasses

import pytest

from fuzzer.known import KnownBuckets
from fuzzer.loop.config import WorkerConfig
from fuzzer.loop.shrinker import SHRINK_SHARE_MARGIN, Shrinker
from fuzzer.loop.stats import WorkerStats
from fuzzer.results import CaseResult, MinimiseClaim
from oracle.config import AttentionCase
from tests.fuzzer.planted_jit import FakeClock
from tests.fuzzer.standins import CorrectBackend

CASE = AttentionCase(seqlen_q=5, seqlen_k=6, head_dim=8, dtype="float32", backward=False)
KEY = ("standin-ok", "native", "out:mismatch")


class Sink:
    """The minimisation calls of a `fuzzer.results.ResultSink`, recorded."""

    def __init__(self, claims=(), renew=True):
        self.claims, self.renew, self.minimised, self.renewals = list(claims), renew, [], 0

    def claim_minimisation(self, worker_id, names, lease_s, max_attempts):
        return self.claims.pop(0) if self.claims else None

    def renew_minimisation(self, bucket_id, worker_id, lease_s):
        self.renewals += 1
        return self.renew

    def record_minimised(self, bucket_id, case_json, original_id, note, **kwargs):
        self.minimised.append((bucket_id, case_json, note, kwargs))
        return []


def shrinker(*, sink=None, ratios=None, clock=None, started=0.0, budget_s=None, **settings) -> Shrinker:
    """A `Shrinker` whose evaluations fail with ``KEY``'s signature at ``ratios[case]`` (else 10)."""
    backend = CorrectBackend()
    config = WorkerConfig(backends=[(backend, "x:CorrectBackend")], isolation="none", **settings)
    ratios = ratios or {}
    evaluated, reported = [], []

    def evaluate(case, phase="fuzz", tasks=None, record=True):
        evaluated.append((case, phase, tasks))
        ratio = ratios.get(case, 10.0)
        return [CaseResult(case.case_id, KEY[0], KEY[1], "fail", signature=KEY[2], error_ratio=ratio)]

    part = Shrinker(
        config=config, sink=sink or Sink(), stats=WorkerStats(), known=KnownBuckets(None), backends={backend.name: backend},
        usable=lambda: [backend], evaluate=evaluate, record=lambda *a, **k: None, clock=clock or FakeClock(),
        check_stop=lambda: None, heartbeat=lambda: None, worker_id=lambda: 7, run_started=lambda: started,
        budget_s=lambda: budget_s, is_crashed=lambda backend, case, variant: False,
        is_compile_failure=lambda key: False, on_minimised=lambda key, outcome: reported.append((key, outcome)),
    )
    part.evaluated, part.reported = evaluated, reported
    return part


def test_the_slice_keeps_the_shrink_share_below_its_aim_less_the_last_overrun():
    clock = FakeClock()
    clock.now = 100.0
    part = shrinker(clock=clock, budget_s=1000.0, shrink_share=0.25, shrink_deadline_s=40.0, shrink_min_s=1.0)
    f = 0.25 * (1 - SHRINK_SHARE_MARGIN)
    part.stats.shrink_s = 15.0
    assert part.slice_s() == pytest.approx((100 * f - 15) / (1 - f))
    part.overrun_s = 3.0
    assert part.slice_s() == pytest.approx((100 * f - 15) / (1 - f) - 3.0)
    part.overrun_s = 9.0
    assert part.slice_s() is None


def test_once_the_cases_are_done_every_claim_gets_the_whole_deadline_until_one_past_the_budget():
    clock = FakeClock()
    part = shrinker(clock=clock, budget_s=100.0, max_cases=0, shrink_deadline_s=30.0)
    clock.now = 120.0
    assert part.slice_s() == 30.0
    clock.now = 130.0
    assert part.slice_s() is None


def test_a_smaller_case_still_fails_only_as_clearly_as_the_original_up_to_the_margin():
    smaller = dataclasses.replace(CASE, seqlen_k=4)
    part = shrinker(ratios={CASE: 1.5, smaller: 1.4}, shrink_error_margin=2.0)
    predicate = part.still_fails(KEY, original=CASE)
    assert predicate(CASE) and predicate.original_ratio == 1.5
    assert not predicate(smaller)  # 1.4 < min(2.0, 1.5)
    assert part.evaluated[-1] == (smaller, "shrink", [("standin-ok", "native")])


def test_a_lost_lease_answers_false_from_then_on_without_running():
    clock = FakeClock()
    sink = Sink(renew=False)
    part = shrinker(sink=sink, clock=clock, heartbeat_s=1.0)
    predicate = part.still_fails(KEY, bucket_id=3, original=CASE)
    clock.advance(2.0)
    assert not predicate(CASE) and predicate.lease_lost and sink.renewals == 1
    assert not predicate(CASE) and part.evaluated == [] and sink.renewals == 1


def test_a_limit_bucket_is_kept_unshrunk_with_its_limit_siblings_and_nothing_runs():
    key = ("standin-ok", "native", "out:limit")
    sibling = (5, ("standin-ok", "other", "out:limit"))
    claim = MinimiseClaim(bucket_id=4, key=key, case_json=CASE.to_json(), attempt=1, siblings=(sibling,))
    sink = Sink(claims=[claim])
    part = shrinker(sink=sink, shrink_share=1.0)
    part.drain()
    assert part.evaluated == []
    ((bucket_id, case_json, note, kwargs),) = sink.minimised
    assert bucket_id == 4 and case_json == CASE.to_json() and note.startswith("unchanged: not shrunk: a limit")
    assert kwargs["attach"] == [("other", "out:limit")]
    assert [k for k, _ in part.reported] == [key] and [k for k, _ in part.stats.minimised] == [key]


def test_a_worker_that_does_not_shrink_claims_nothing():
    claim = MinimiseClaim(bucket_id=4, key=KEY, case_json=CASE.to_json(), attempt=1)
    sink = Sink(claims=[claim])
    shrinker(sink=sink, shrink=False).drain()
    assert sink.claims == [claim]
