"""`fuzzer.loop.known_hits`: hits on buckets already known, without a worker."""

from __future__ import annotations

from fuzzer.known import KNOWN_TARGET_LOAD, KnownBuckets
from fuzzer.loop import known_hits
from fuzzer.loop.known_hits import KnownHits
from fuzzer.loop.stats import WorkerStats
from fuzzer.results import BucketUpdate, CaseResult
from oracle.config import AttentionCase

CASE = AttentionCase(seqlen_q=3, seqlen_k=4, head_dim=8, dtype="float32", backward=False)
KEY = ("standin", "native", "out:all_zero")
FAIL = CaseResult(CASE.case_id, *KEY[:2], "fail", signature=KEY[2])


def test_the_targets_cases_were_drawn_for_are_kept_for_the_recent_cases_only(monkeypatch):
    monkeypatch.setattr(known_hits, "MAX_REPEAT_MEMO", 2)
    hits = KnownHits(KnownBuckets(None), WorkerStats())
    for case_id in ("a", "b", "a", "c"):
        hits.note_drawn(case_id, "t-" + case_id)
    assert list(hits.drawn_for) == ["a", "c"]


def test_fuzz_hits_on_a_known_bucket_are_counted_and_past_its_budget_charge_the_target():
    known = KnownBuckets(1)
    known.start_budget(KEY)
    hits = KnownHits(known, WorkerStats())
    hits.note_drawn(CASE.case_id, "target")
    update = BucketUpdate(bucket_id=1, is_new=False)
    hits.note(CASE, [FAIL], [update], "fuzz")
    assert hits.stats.evaluations == 1 and hits.stats.known_hits == 1 and hits.stats.spent == []
    hits.note(CASE, [FAIL], [update], "fuzz")  # the second hit is past the budget of 1
    assert hits.stats.spent == [KEY] and hits.stats.known_load["target"] == KNOWN_TARGET_LOAD
    assert CASE.case_id not in hits.drawn_for


def test_other_phases_make_a_bucket_known_and_count_no_evaluation():
    hits = KnownHits(KnownBuckets(1), WorkerStats())
    hits.note(CASE, [FAIL], [None], "confirm")
    assert hits.known.is_known(KEY) and hits.stats.evaluations == 0 and hits.stats.known_hits == 0
