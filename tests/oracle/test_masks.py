"""Tests of `oracle.masks`: the mask table, its examples, and the shapes of the helpers."""

from __future__ import annotations

import doctest

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle.masks
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from oracle.masks import (
    batch_visible_mask,
    diagonal_offset,
    key_bounds,
    render_mask,
    visible_mask,
    visible_rows,
)

windows = st.one_of(st.none(), st.integers(0, 40))


def table_rule(case: AttentionCase, i: int, j: int, seqlen_q: int, seqlen_k: int) -> bool:
    """The module docstring's table, written out literally and independently of `key_bounds`."""
    off = 0 if case.causal_alignment == "top_left" else seqlen_k - seqlen_q
    if case.causal and j > i + off:
        return False
    if not case.causal and case.window_size_right is not None and j > i + off + case.window_size_right:
        return False
    if case.window_size_left is not None and j < i + off - case.window_size_left:
        return False
    return 0 <= j < seqlen_k


@st.composite
def mask_cases(draw) -> AttentionCase:
    return AttentionCase(
        seqlen_q=draw(st.integers(1, 40)),
        seqlen_k=draw(st.integers(1, 40)),
        causal=draw(st.booleans()),
        causal_alignment=draw(st.sampled_from(("top_left", "bottom_right"))),
        window_size_left=draw(windows),
        window_size_right=draw(windows),
    )


def test_diagonal_offset_is_zero_top_left_and_the_length_difference_bottom_right():
    assert diagonal_offset(3, 5, "top_left") == 0
    assert diagonal_offset(3, 5, "bottom_right") == 2
    assert diagonal_offset(5, 3, "bottom_right") == -2


def test_diagonal_offset_rejects_unknown_alignments():
    with pytest.raises(CaseValidationError):
        diagonal_offset(3, 5, "center")


@settings(max_examples=150, deadline=None)
@given(mask_cases())
def test_visible_mask_follows_the_documented_table(case):
    mask = visible_mask(case)
    expected = torch.tensor(
        [[table_rule(case, i, j, case.seqlen_q, case.seqlen_k) for j in range(case.seqlen_k)] for i in range(case.seqlen_q)]
    )
    assert torch.equal(mask, expected), render_mask(mask) + "\n--- expected ---\n" + render_mask(expected)


@settings(max_examples=100, deadline=None)
@given(mask_cases())
def test_every_row_sees_one_contiguous_key_range(case):
    lo, hi = key_bounds(case, case.seqlen_q, case.seqlen_k)
    mask = visible_mask(case)
    for i, row in enumerate(mask.tolist()):
        visible = [j for j, seen in enumerate(row) if seen]
        if visible:
            assert visible == list(range(lo[i], hi[i])), (i, visible, int(lo[i]), int(hi[i]))
        else:
            assert lo[i] >= hi[i], (i, int(lo[i]), int(hi[i]))
    assert lo.dtype == hi.dtype == torch.int64
    assert bool(((lo >= 0) & (lo <= case.seqlen_k) & (hi >= 0) & (hi <= case.seqlen_k)).all())


def test_causal_bottom_right_lets_the_last_row_see_every_key():
    case = AttentionCase(seqlen_q=3, seqlen_k=7, causal=True, causal_alignment="bottom_right")
    assert bool(visible_mask(case)[-1].all())
    assert visible_mask(case)[0].tolist() == [True] * 5 + [False] * 2


def test_causal_top_left_lets_row_i_see_keys_up_to_i():
    case = AttentionCase(seqlen_q=4, seqlen_k=6, causal=True)
    assert torch.equal(visible_mask(case), torch.ones(4, 6, dtype=torch.bool).tril())


def test_causal_ignores_a_right_window():
    causal = AttentionCase(seqlen_q=9, seqlen_k=12, causal=True, causal_alignment="bottom_right")
    with_window = causal.replace(window_size_right=5)
    assert torch.equal(visible_mask(causal), visible_mask(with_window))


def test_window_without_left_bound_and_zero_right_bound_equals_causal():
    # The seed bug's encoding: window (-1, 0) means causal. Here it is (None, 0).
    for alignment in ("top_left", "bottom_right"):
        causal = AttentionCase(seqlen_q=7, seqlen_k=11, causal=True, causal_alignment=alignment)
        window = AttentionCase(seqlen_q=7, seqlen_k=11, window_size_right=0, causal_alignment=alignment)
        assert torch.equal(visible_mask(causal), visible_mask(window)), alignment


def test_window_zero_zero_keeps_only_the_diagonal():
    case = AttentionCase(seqlen_q=5, seqlen_k=5, window_size_left=0, window_size_right=0)
    assert torch.equal(visible_mask(case), torch.eye(5, dtype=torch.bool))


def test_bottom_right_with_more_queries_than_keys_leaves_the_first_rows_empty():
    case = AttentionCase(seqlen_q=5, seqlen_k=3, causal=True, causal_alignment="bottom_right")
    lo, hi = key_bounds(case, 5, 3)
    assert (lo >= hi).tolist() == [True, True, False, False, False]
    assert visible_mask(case).sum(1).tolist() == [0, 0, 1, 2, 3]


def test_no_mask_lets_every_row_see_every_key():
    case = AttentionCase(seqlen_q=4, seqlen_k=9)
    assert bool(visible_mask(case).all())


def test_the_docstring_examples_render_as_documented():
    result = doctest.testmod(oracle.masks, verbose=False)
    assert result.attempted >= 4
    assert result.failed == 0


def test_batch_mask_uses_each_sequences_lengths_and_pads_with_false():
    case = AttentionCase(
        batch_size=2, seqlen_q=4, seqlen_k=6, qkv_format="thd", seqlens_q=(4, 2), seqlens_k=(3, 6),
        causal=True, causal_alignment="bottom_right",
    )
    mask = batch_visible_mask(case)
    assert mask.shape == (2, 4, 6)
    assert torch.equal(mask[0, :4, :3], visible_mask(case, 4, 3))
    assert torch.equal(mask[1, :2, :6], visible_mask(case, 2, 6))
    assert not bool(mask[0, :, 3:].any()) and not bool(mask[1, 2:].any())


def test_visible_rows_has_the_lse_layout_and_marks_empty_rows():
    case = AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=3, num_heads=3, causal=True, causal_alignment="bottom_right")
    rows = visible_rows(case)
    assert rows.shape == (2, 3, 5)
    assert rows[1, 2].tolist() == [False, False, True, True, True]
    varlen = case.replace(qkv_format="thd", seqlens_q=(5, 2), seqlens_k=(3, 3))
    assert visible_rows(varlen).shape == (3, 7)
    assert visible_rows(varlen)[0].tolist() == [False, False, True, True, True, True, True]
