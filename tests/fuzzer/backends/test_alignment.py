"""Top-left and bottom-right causal masks coincide when every sequence has as many keys as
queries; a backend that implements only one alignment must still accept such cases (the seed's
case, b2 s1024 causal top-left, was refused by fa4 before this)."""

from __future__ import annotations

import pytest

from fuzzer.backends.base import alignment_irrelevant
from fuzzer.backends.fa4 import FA4Backend
from oracle.config import AttentionCase
from oracle.masks import visible_mask


@pytest.mark.parametrize(
    ("fields", "irrelevant"),
    [
        (dict(seqlen_q=8, seqlen_k=8), True),
        (dict(seqlen_q=8, seqlen_k=9), False),
        (dict(qkv_format="thd", batch_size=2, seqlen_q=5, seqlen_k=5, seqlens_q=(5, 3), seqlens_k=(5, 3)), True),
        (dict(qkv_format="thd", batch_size=2, seqlen_q=5, seqlen_k=5, seqlens_q=(5, 3), seqlens_k=(3, 5)), False),
    ],
)
def test_alignment_is_irrelevant_exactly_when_the_masks_coincide(fields, irrelevant):
    top = AttentionCase(head_dim=16, causal=True, causal_alignment="top_left", **fields)
    bottom = AttentionCase(head_dim=16, causal=True, causal_alignment="bottom_right", **fields)
    assert alignment_irrelevant(top) is irrelevant
    lengths = list(zip(top.seqlens_q, top.seqlens_k)) if top.is_varlen else [(top.seqlen_q, top.seqlen_k)]
    same = all(bool((visible_mask(top, sq, sk) == visible_mask(bottom, sq, sk)).all()) for sq, sk in lengths)
    assert same is irrelevant


def test_fa4_accepts_top_left_causal_at_equal_lengths_and_refuses_it_otherwise():
    backend = FA4Backend()
    equal = AttentionCase(seqlen_q=64, seqlen_k=64, head_dim=128, dtype="bfloat16", causal=True, causal_alignment="top_left")
    unequal = AttentionCase(seqlen_q=64, seqlen_k=96, head_dim=128, dtype="bfloat16", causal=True, causal_alignment="top_left")
    for variant in ("native", "te_style"):
        assert not [r for r in backend.unsupported_reasons(equal, variant) if "causal_alignment" in r]
        assert [r for r in backend.unsupported_reasons(unequal, variant) if "causal_alignment" in r]


def test_declared_limits_found_on_the_h200(monkeypatch):
    """Two refusals seen on the H200 (docs/gpu-campaigns.md, 2026-11-29) are declared, not run:
    te-fa4 on SM90 with GQA and head_dim != head_dim_v in backward (FA4's assertion), and cuDNN
    SDPA with one key."""
    from fuzzer.backends import te
    from fuzzer.backends.sdpa import builtin_backends

    monkeypatch.setattr(te, "cuda_arch_major", lambda: 9)
    gqa = AttentionCase(seqlen_q=16, seqlen_k=16, num_heads=4, num_heads_kv=2, head_dim=64, head_dim_v=32,
                        dtype="bfloat16", backward=True)
    reasons = te.TEFA4Backend().unsupported_reasons(gqa, "mask_type")
    assert any("head_dim != head_dim_v" in r for r in reasons), reasons
    same_dims = AttentionCase(seqlen_q=16, seqlen_k=16, num_heads=4, num_heads_kv=2, head_dim=64, dtype="bfloat16",
                              backward=True)
    assert not any("head_dim != head_dim_v" in r for r in te.TEFA4Backend().unsupported_reasons(same_dims, "mask_type"))

    cudnn = {b.name: b for b in (x if not isinstance(x, tuple) else x[0] for x in builtin_backends())}["torch-sdpa-cudnn"]
    one_key = AttentionCase(seqlen_q=4, seqlen_k=1, head_dim=16, dtype="bfloat16")
    two_keys = AttentionCase(seqlen_q=4, seqlen_k=2, head_dim=16, dtype="bfloat16")
    variant = cudnn.variants[0]
    assert any("seqlen_k 1" in r for r in cudnn.unsupported_reasons(one_key, variant))
    assert not any("seqlen_k 1" in r for r in cudnn.unsupported_reasons(two_keys, variant))
