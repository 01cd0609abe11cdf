"""Tests of fuzzer/minimise.py: shrinking starts from the failing case and keeps its signature."""

from hypothesis.database import InMemoryExampleDatabase

from fuzzer.minimise import minimise
from oracle.config import AttentionCase

BIG = AttentionCase(
    batch_size=3,
    seqlen_q=77,
    seqlen_k=130,
    num_heads=8,
    num_heads_kv=2,
    head_dim=96,
    causal=True,
    causal_alignment="bottom_right",
    window_size_left=5,
    softcap=30.0,
    input_distribution="outliers",
    seed=1234,
)


def test_the_first_candidate_is_the_failing_case_itself():
    seen = []

    def still_fails(case):
        seen.append(case)
        return case.causal

    minimise(BIG, still_fails, deadline_s=30)
    # two confirmations of the original, then Hypothesis replays the seeded choices
    assert seen[0] == BIG and seen[2] == BIG


def test_sizes_shrink_to_the_smallest_case_that_still_fails():
    outcome = minimise(BIG, lambda c: c.seqlen_k >= 3 and c.batch_size >= 2, deadline_s=60)
    assert outcome.status == "minimised"
    case = outcome.case
    assert (case.batch_size, case.num_heads, case.seqlen_q, case.seqlen_k) == (2, 1, 1, 3)
    assert case.causal and case.causal_alignment == "bottom_right" and case.dtype == BIG.dtype
    assert case.seed == 0 and case.input_distribution == "normal" and case.softcap is None


def test_a_failure_that_does_not_reproduce_is_reported_not_shrunk():
    calls = iter([True, False])
    outcome = minimise(BIG, lambda c: next(calls, False), deadline_s=10)
    assert outcome.status == "not_reproduced" and outcome.case == BIG


def test_a_shrunk_case_that_fails_only_once_slips_and_the_original_is_kept():
    seen = {}

    def still_fails(case):
        if case == BIG:
            return True
        seen[case] = seen.get(case, 0) + 1
        return seen[case] == 1  # every smaller case fails the first time only

    outcome = minimise(BIG, still_fails, deadline_s=60)
    assert outcome.status == "slipped"
    assert outcome.case == BIG and "original kept" in outcome.note


def test_nothing_smaller_failing_leaves_the_case_unchanged():
    outcome = minimise(BIG, lambda c: c == BIG, deadline_s=30)
    assert outcome.status == "unchanged" and outcome.case == BIG


def test_a_second_minimisation_with_the_same_database_is_immediate():
    db = InMemoryExampleDatabase()
    first = minimise(BIG, lambda c: c.seqlen_k >= 3, deadline_s=60, database=db, database_key=b"bucket-1")
    again = minimise(BIG, lambda c: c.seqlen_k >= 3, deadline_s=60, database=db, database_key=b"bucket-1")
    assert again.case == first.case
    assert again.attempts < first.attempts


def test_varlen_cases_shrink_per_sequence():
    case = AttentionCase(
        batch_size=2, qkv_format="thd", seqlens_q=(5, 9), seqlens_k=(7, 3), seqlen_q=9, seqlen_k=7, head_dim=64
    )
    outcome = minimise(case, lambda c: c.total_q >= 6, deadline_s=30)
    assert outcome.status == "minimised"
    assert outcome.case.total_q == 6 and outcome.case.is_varlen


def test_jit_backends_keep_their_head_dims_while_shrinking():
    outcome = minimise(BIG, lambda c: c.seqlen_k >= 3, deadline_s=60, keep_head_dims=True)
    assert outcome.status == "minimised"
    assert (outcome.case.head_dim, outcome.case.head_dim_v) == (BIG.head_dim, BIG.head_dim_v)
    assert outcome.case.seqlen_k == 3 and outcome.case.batch_size == 1


def test_a_case_with_head_dims_of_eight_or_less_replays_in_step_and_shrinks():
    """``sampled_from`` of one option (head_dim 8: the only small head dim <= 8) records no
    Hypothesis choice; the seeded choices must not hold one for it, or every later field is read
    from the wrong position and the original is never replayed ("unchanged")."""
    small = AttentionCase(
        batch_size=2, seqlen_q=9, seqlen_k=12, num_heads=2, num_heads_kv=1, head_dim=8, head_dim_v=4, causal=True,
        seed=7,
    )
    seen = []

    def still_fails(case):
        seen.append(case)
        return case.causal and case.seqlen_k >= 2

    outcome = minimise(small, still_fails, deadline_s=30)
    assert seen[2] == small  # the first Hypothesis candidate is the original itself
    assert outcome.status == "minimised", outcome.note
    case = outcome.case
    assert (case.head_dim, case.head_dim_v) == (8, 4)
    assert (case.batch_size, case.num_heads, case.seqlen_q, case.seqlen_k, case.seed) == (1, 1, 1, 2, 0)
