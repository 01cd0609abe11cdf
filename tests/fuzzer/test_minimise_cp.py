"""Shrinking a context-parallel case keeps ``cp_size``/``cp_comm_type`` and a case that can be laid
out: bshd/sbhd lengths step in multiples of ``2 * cp_size``, ``a2a``/``a2a+p2p`` head counts in
multiples of the ranks the heads are split over (`fuzzer.backends.cp_layout.cp_unsupported_reasons`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzer.backends.cp_layout import cp_unsupported_reasons
from fuzzer.minimise import minimise, neighbourhood
from oracle.config import AttentionCase

A2A = AttentionCase(batch_size=2, seqlen_q=24, seqlen_k=40, num_heads=8, num_heads_kv=4, head_dim=16, causal=True,
                    backward=True, seed=9, cp_size=2, cp_comm_type="a2a")
HIERARCHICAL = AttentionCase(seqlen_q=32, seqlen_k=16, num_heads=12, num_heads_kv=6, head_dim=16, cp_size=4,
                             cp_comm_type="a2a+p2p")
THD = AttentionCase(qkv_format="thd", batch_size=2, seqlens_q=(8, 5), seqlens_k=(8, 5), seqlen_q=8, seqlen_k=8,
                    num_heads=2, head_dim=16, causal=True, cp_size=2, cp_comm_type="p2p")


@pytest.mark.parametrize("case", [A2A, HIERARCHICAL, THD], ids=["a2a", "a2a+p2p", "thd"])
def test_every_case_of_a_cp_neighbourhood_keeps_the_cp_fields_and_can_be_laid_out(case: AttentionCase) -> None:
    assert cp_unsupported_reasons(case) == []
    strategy, _ = neighbourhood(case)

    @settings(max_examples=60)
    @given(strategy)
    def check(candidate: AttentionCase) -> None:
        assert (candidate.cp_size, candidate.cp_comm_type) == (case.cp_size, case.cp_comm_type)
        assert cp_unsupported_reasons(candidate) == [], candidate.describe()

    check()


def test_the_neighbourhood_of_a_cp_case_starts_from_the_case_itself() -> None:
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes

    seen = []

    def still_fails(case: AttentionCase) -> bool:
        seen.append(case)
        return True

    database = InMemoryExampleDatabase()
    _, choices = neighbourhood(A2A)
    assert choices_to_bytes(choices)  # one choice per field, multipliers for the stepped ones
    minimise(A2A, still_fails, deadline_s=30, database=database)
    assert seen[0] == A2A and seen[2] == A2A, "the replayed choices draw the original case"


def test_a_cp_case_shrinks_to_the_smallest_lengths_and_heads_its_layout_allows() -> None:
    outcome = minimise(A2A, lambda c: c.causal, deadline_s=60)
    assert outcome.status == "minimised", outcome.note
    case = outcome.case
    assert (case.cp_size, case.cp_comm_type, case.qkv_format) == (2, "a2a", "bshd")
    assert (case.batch_size, case.num_heads_kv, case.num_heads) == (1, 2, 2), case.describe()
    assert (case.seqlen_q, case.seqlen_k) == (4, 4), case.describe()


def test_thd_lengths_of_a_cp_case_shrink_freely_because_the_layout_pads_them() -> None:
    outcome = minimise(THD, lambda c: c.causal, deadline_s=60)
    assert outcome.status == "minimised", outcome.note
    assert outcome.case.seqlens_q == (1,) and outcome.case.cp_size == 2, outcome.case.describe()
    assert cp_unsupported_reasons(outcome.case) == []


@given(st.sampled_from([2, 4, 8]), st.integers(1, 6), st.integers(1, 6))
def test_bshd_lengths_are_drawn_as_chunk_counts_under_cp_and_as_lengths_without(cp_size: int, chunks_q: int,
                                                                                chunks_k: int) -> None:
    """Without CP a length is one choice, the length itself, as before (example databases written
    before keep their meaning); under CP it is the number of ``2 * cp_size`` chunks."""
    unit = 2 * cp_size
    case = AttentionCase(seqlen_q=unit * chunks_q, seqlen_k=unit * chunks_k, num_heads=2, head_dim=16, backward=False)
    _, choices = neighbourhood(case)
    assert tuple(choices[-2:]) == (unit * chunks_q, unit * chunks_k), choices
    _, cp_choices = neighbourhood(case.replace(cp_size=cp_size, cp_comm_type="p2p"))
    assert tuple(cp_choices[-2:]) == (chunks_q, chunks_k), cp_choices
    assert cp_choices[:-2] == choices[:-2]
