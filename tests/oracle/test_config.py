"""Tests of oracle/config.py: validation, canonical form, JSON round trip, content hash."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzer.backends.base import Capabilities
from fuzzer.strategies import attention_cases
from oracle.config import AttentionCase
from oracle.errors import CaseValidationError

ALL_CAPS = Capabilities(
    dtypes=("bfloat16", "float16", "float32"),
    qkv_formats=("bshd", "sbhd", "thd"),
    max_head_dim=512,
    head_dim_v_differs=True,
    windows=True,
    softcap=True,
)


@given(attention_cases(capabilities=ALL_CAPS, max_work=2**20))
def test_every_drawn_case_round_trips_through_json_with_the_same_id(case):
    text = json.dumps(case.to_json())
    again = AttentionCase.from_json(json.loads(text))
    assert again == case
    assert again.case_id == case.case_id


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"num_heads": 6, "num_heads_kv": 4}, "num_heads_kv"),
        ({"dtype": "float8"}, "dtype"),
        ({"qkv_format": "bhsd"}, "qkv_format"),
        ({"head_dim": 0}, "head_dim"),
        ({"window_size_left": -1}, "window_size_left"),
        ({"softcap": 0.0}, "softcap"),
        ({"softmax_scale": float("nan")}, "softmax_scale"),
        ({"seqlens_q": (3, 4)}, "seqlens_q"),
        ({"qkv_format": "thd", "batch_size": 2, "seqlens_q": (3,)}, "seqlens_q"),
        ({"qkv_format": "thd", "batch_size": 2, "seqlen_q": 9, "seqlens_q": (3, 4)}, "seqlen_q"),
        ({"cp_size": 2}, "cp_comm_type"),
        ({"cp_size": 2, "cp_comm_type": "a2a+p2p"}, "cp_comm_type"),
        ({"causal": 1}, "causal"),
        ({"seed": -5}, "seed"),
    ],
)
def test_invalid_fields_raise_an_error_naming_the_field(changes, field):
    with pytest.raises(CaseValidationError) as info:
        AttentionCase(**changes)
    assert info.value.field == field
    assert field in str(info.value)


def test_the_minus_one_sentinel_is_rejected_with_the_allowed_values():
    with pytest.raises(CaseValidationError, match=r"window_size_right.*0 <= window_size_right"):
        AttentionCase(window_size_right=-1)


def test_from_json_rejects_unknown_fields_and_other_schema_versions():
    data = AttentionCase().to_json()
    with pytest.raises(CaseValidationError, match="nheads_k"):
        AttentionCase.from_json({**data, "nheads_k": 2})
    with pytest.raises(CaseValidationError, match="schema_version"):
        AttentionCase.from_json({**data, "schema_version": 99})
    with pytest.raises(CaseValidationError, match="case"):
        AttentionCase.from_json(["not", "an", "object"])


def test_defaults_resolve_scale_heads_and_value_dim():
    case = AttentionCase(head_dim=128, num_heads=8)
    assert case.softmax_scale == pytest.approx(128**-0.5)
    assert case.num_heads_kv == 8
    assert case.head_dim_v == 128


def test_alignment_without_a_mask_is_canonicalised_so_equal_cases_hash_equally():
    a = AttentionCase(causal_alignment="bottom_right")
    b = AttentionCase(causal_alignment="top_left")
    assert a == b and a.case_id == b.case_id
    c = AttentionCase(causal=True, causal_alignment="bottom_right")
    assert c.causal_alignment == "bottom_right" and c.case_id != b.case_id


@given(st.integers(1, 5), st.integers(1, 50))
def test_thd_lengths_default_to_the_maximum_per_sequence(batch_size, seqlen):
    case = AttentionCase(qkv_format="thd", batch_size=batch_size, seqlen_q=seqlen, seqlen_k=seqlen)
    assert case.seqlens_q == (seqlen,) * batch_size
    assert case.total_q == seqlen * batch_size
