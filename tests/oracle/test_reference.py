"""Tests of `oracle.reference`: independent computations, closed forms, gradcheck, invariants."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.config import AttentionCase
from oracle.inputs import AttentionInputs, make_inputs
from oracle.masks import key_bounds, visible_mask
from oracle._dense import SAFE_SHIFT_BOUND
from oracle.reference import (
    ReferenceInputError,
    attention_backward,
    attention_forward,
    choose_block_q,
    reference,
)

FLOAT64_CLOSE = dict(rtol=1e-10, atol=1e-12)  # float64 vs float64: only summation order differs


def materialised(case: AttentionCase, inputs: AttentionInputs) -> dict[str, torch.Tensor]:
    """An independent float64 reference: full score matrix, explicit mask, autograd for gradients.

    bshd only; thd is tested against per-sequence bshd.
    """
    q, k, v = (t.double().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    k_rep = k.repeat_interleave(case.group_size, dim=2)
    v_rep = v.repeat_interleave(case.group_size, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", q, k_rep) * case.softmax_scale
    if case.softcap is not None:
        scores = case.softcap * torch.tanh(scores / case.softcap)
    scores = scores.masked_fill(~visible_mask(case), -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    out = torch.einsum("bhij,bjhd->bihd", probs, v_rep)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), inputs.dout.double())
    return {"out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}


@st.composite
def small_cases(draw, varlen: bool = False, softcap: bool = True) -> AttentionCase:
    num_heads_kv = draw(st.sampled_from((1, 2)))
    head_dim = draw(st.sampled_from((4, 8, 16)))
    fields = dict(
        num_heads=num_heads_kv * draw(st.sampled_from((1, 2, 3))),
        num_heads_kv=num_heads_kv,
        head_dim=head_dim,
        head_dim_v=draw(st.sampled_from((head_dim, 4, 12))),
        dtype=draw(st.sampled_from(("bfloat16", "float16", "float32"))),
        causal=draw(st.booleans()),
        causal_alignment=draw(st.sampled_from(("top_left", "bottom_right"))),
        window_size_left=draw(st.one_of(st.none(), st.integers(0, 12))),
        window_size_right=draw(st.one_of(st.none(), st.integers(0, 12))),
        softcap=draw(st.one_of(st.none(), st.sampled_from((2.0, 20.0)))) if softcap else None,
        input_distribution=draw(st.sampled_from(("normal", "large_logits", "outliers", "near_constant"))),
        seed=draw(st.integers(0, 2**32 - 1)),
    )
    if varlen:
        batch_size = draw(st.integers(1, 3))
        seqlens_q = tuple(draw(st.lists(st.integers(1, 20), min_size=batch_size, max_size=batch_size)))
        seqlens_k = tuple(draw(st.lists(st.integers(1, 20), min_size=batch_size, max_size=batch_size)))
        fields.update(qkv_format="thd", batch_size=batch_size, seqlens_q=seqlens_q, seqlens_k=seqlens_k,
                      seqlen_q=max(seqlens_q), seqlen_k=max(seqlens_k))
    else:
        fields.update(batch_size=draw(st.integers(1, 2)), seqlen_q=draw(st.integers(1, 24)),
                      seqlen_k=draw(st.integers(1, 24)))
    return AttentionCase(**fields)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == torch.float64, what
    torch.testing.assert_close(actual, expected, **FLOAT64_CLOSE, msg=lambda m: f"{what}: {m}")


@settings(max_examples=60, deadline=None)
@given(small_cases(), st.sampled_from((None, 1, 5)))
def test_reference_matches_a_materialised_autograd_reference(case, block_q):
    inputs = make_inputs(case)
    result = reference(case, inputs, backward=True, block_q=block_q)
    expected = materialised(case, inputs)
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert_close(getattr(result, name), expected[name], name)


@settings(max_examples=40, deadline=None)
@given(small_cases(softcap=False))
def test_reference_matches_pytorch_sdpa_math_in_float64(case):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    inputs = make_inputs(case)
    q, k, v = (t.double().transpose(1, 2).requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=visible_mask(case), scale=case.softmax_scale, enable_gqa=True
        )
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), inputs.dout.double().transpose(1, 2))
    result = reference(case, inputs, backward=True)
    assert_close(result.out, out.detach().transpose(1, 2), "out")
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert_close(getattr(result, name), grad.transpose(1, 2), name)


def test_a_single_visible_key_gives_out_v_and_lse_equal_to_the_score():
    case = AttentionCase(batch_size=2, seqlen_q=33, seqlen_k=33, num_heads=4, num_heads_kv=2, head_dim=16,
                         head_dim_v=8, dtype="float32", window_size_left=0, window_size_right=0)
    inputs = make_inputs(case)
    result = reference(case, inputs, backward=False)
    k_rep = inputs.k.double().repeat_interleave(2, dim=2)
    v_rep = inputs.v.double().repeat_interleave(2, dim=2)
    score = (inputs.q.double() * k_rep).sum(-1) * case.softmax_scale  # [b, i, h]
    assert_close(result.out, v_rep, "out")
    assert_close(result.lse, score.transpose(1, 2), "lse")


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_equal_scores_give_lse_log_n_plus_the_score_and_the_mean_of_v(alignment):
    case = AttentionCase(seqlen_q=20, seqlen_k=50, num_heads=2, head_dim=8, dtype="float32", causal=True,
                         causal_alignment=alignment, window_size_left=9)
    inputs = make_inputs(case)
    inputs.k = inputs.k[:, :1].expand_as(inputs.k).contiguous()  # every key equal: scores equal per row
    result = reference(case, inputs, backward=False)
    lo, hi = key_bounds(case, 20, 50)
    count = (hi - lo).double()
    score = (inputs.q.double() * inputs.k[:, :1].double()).sum(-1)[0] * case.softmax_scale  # [i, h]
    assert_close(result.lse[0], (score + count.log()[:, None]).T, "lse")
    means = torch.stack([inputs.v[0, a:b].double().mean(0) for a, b in zip(lo.tolist(), hi.tolist())])
    assert_close(result.out[0], means, "out")


class _ReferenceAttention(torch.autograd.Function):
    """The reference's forward with the reference's backward, for gradcheck."""

    @staticmethod
    def forward(ctx, q, k, v, case):
        ctx.save_for_backward(q, k, v)
        ctx.case = case
        return attention_forward(q, k, v, case, error_scales=False).out

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        result = attention_backward(q, k, v, dout.contiguous(), ctx.case, error_scales=False)
        return result.dq, result.dk, result.dv, None


@pytest.mark.parametrize(
    "fields",
    [
        dict(causal=True, causal_alignment="bottom_right", seqlen_q=5, seqlen_k=7),
        dict(softcap=1.5, seqlen_q=6, seqlen_k=4),
        dict(num_heads=4, num_heads_kv=2, head_dim_v=3, window_size_left=2, window_size_right=1, seqlen_q=6, seqlen_k=6),
        dict(num_heads=3, num_heads_kv=1, softcap=4.0, causal=True, seqlen_q=7, seqlen_k=3, causal_alignment="bottom_right"),
        dict(qkv_format="thd", batch_size=2, seqlens_q=(3, 5), seqlens_k=(4, 2), seqlen_q=5, seqlen_k=4, causal=True,
             num_heads=2, num_heads_kv=1),
    ],
)
def test_backward_passes_gradcheck_in_float64(fields):
    case = AttentionCase(**{"head_dim": 4, "dtype": "float32", **fields})
    inputs = make_inputs(case)
    q, k, v = (t.double().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    assert torch.autograd.gradcheck(lambda q, k, v: _ReferenceAttention.apply(q, k, v, case), (q, k, v), eps=1e-6, atol=1e-7)


@settings(max_examples=25, deadline=None)
@given(small_cases(varlen=True))
def test_thd_equals_each_sequence_run_alone_as_bshd(case):
    inputs = make_inputs(case)
    packed = reference(case, inputs, backward=True)
    q_start = k_start = 0
    for len_q, len_k in zip(case.seqlens_q_list, case.seqlens_k_list):
        single = case.replace(qkv_format="bshd", batch_size=1, seqlen_q=len_q, seqlen_k=len_k,
                              seqlens_q=None, seqlens_k=None)
        rows_q, rows_k = slice(q_start, q_start + len_q), slice(k_start, k_start + len_k)
        single_inputs = AttentionInputs(q=inputs.q[rows_q][None], k=inputs.k[rows_k][None],
                                        v=inputs.v[rows_k][None], dout=inputs.dout[rows_q][None])
        alone = reference(single, single_inputs, backward=True)
        assert_close(packed.out[rows_q], alone.out[0], "out")
        assert_close(packed.lse[:, rows_q], alone.lse[0], "lse")
        assert_close(packed.dq[rows_q], alone.dq[0], "dq")
        assert_close(packed.dk[rows_k], alone.dk[0], "dk")
        assert_close(packed.dv[rows_k], alone.dv[0], "dv")
        for name in ("out", "dq"):
            assert_close(packed.error_scales[name][rows_q], alone.error_scales[name][0], f"{name} scale")
        q_start, k_start = q_start + len_q, k_start + len_k


def test_gqa_equals_repeating_the_kv_heads():
    case = AttentionCase(batch_size=2, seqlen_q=19, seqlen_k=23, num_heads=6, num_heads_kv=2, head_dim=8,
                         head_dim_v=5, dtype="float32", causal=True, causal_alignment="bottom_right", softcap=3.0)
    inputs = make_inputs(case)
    grouped = reference(case, inputs, backward=True)
    repeated_case = case.replace(num_heads_kv=6)
    repeated_inputs = AttentionInputs(q=inputs.q, k=inputs.k.repeat_interleave(3, dim=2),
                                      v=inputs.v.repeat_interleave(3, dim=2), dout=inputs.dout)
    repeated = reference(repeated_case, repeated_inputs, backward=True)
    for name in ("out", "lse", "dq"):
        assert_close(getattr(grouped, name), getattr(repeated, name), name)
    for name in ("dk", "dv"):
        summed = getattr(repeated, name).unflatten(2, (2, 3)).sum(3)
        assert_close(getattr(grouped, name), summed, name)


def test_rows_without_a_visible_key_give_zero_output_minus_inf_lse_and_zero_gradients():
    case = AttentionCase(seqlen_q=9, seqlen_k=4, num_heads=2, head_dim=8, dtype="float32", causal=True,
                         causal_alignment="bottom_right")
    result = reference(case, make_inputs(case), backward=True)
    empty = slice(0, 5)  # rows i with i + (4 - 9) < 0
    assert bool((result.out[:, empty] == 0).all()) and bool((result.dq[:, empty] == 0).all())
    assert bool((result.lse[:, :, empty] == -math.inf).all())
    assert bool(torch.isfinite(result.lse[:, :, 5:]).all())
    assert bool(torch.isfinite(result.dk).all()) and bool((result.dk != 0).any())
    assert bool((result.error_scales["lse"][:, :, empty] == 0).all())


def test_block_size_does_not_change_the_result():
    case = AttentionCase(batch_size=2, seqlen_q=70, seqlen_k=90, num_heads=4, num_heads_kv=1, head_dim=16,
                         dtype="float16", causal=True, window_size_left=20)
    inputs = make_inputs(case)
    results = [reference(case, inputs, block_q=block_q) for block_q in (1, 13, 64, None)]
    for other in results[1:]:
        for name in ("out", "lse", "dq", "dk", "dv"):
            assert_close(getattr(other, name), getattr(results[0], name), name)
        for name, scale in other.error_scales.items():
            assert_close(scale, results[0].error_scales[name], f"{name} scale")


@pytest.mark.parametrize("budget", [2**20, 64 * 2**20, 2 * 2**30])
def test_block_q_fits_the_memory_budget(budget):
    rows = choose_block_q(4, 16, 4096, 4096, 3, budget)
    assert 1 <= rows <= 4096
    assert rows == 1 or 3 * 4 * 16 * rows * 4096 * 8 <= budget
    assert rows < 64 or rows % 64 == 0
    assert choose_block_q(1, 1, 10, 10, 2, budget) == 10


def test_results_are_float64_with_error_scales_of_row_shape():
    case = AttentionCase(batch_size=2, seqlen_q=5, seqlen_k=7, num_heads=4, num_heads_kv=2, head_dim=8, head_dim_v=6)
    result = reference(case, make_inputs(case), backward=True)
    assert result.out.shape == (2, 5, 4, 6) and result.lse.shape == (2, 4, 5)
    assert result.dq.shape == (2, 5, 4, 8) and result.dk.shape == (2, 7, 2, 8) and result.dv.shape == (2, 7, 2, 6)
    expected_scales = {"out": (2, 5, 4), "lse": (2, 4, 5), "dq": (2, 5, 4), "dk": (2, 7, 2), "dv": (2, 7, 2)}
    assert {name: tuple(t.shape) for name, t in result.error_scales.items()} == expected_scales
    assert all(t.dtype == torch.float64 and bool((t >= 0).all()) for t in result.error_scales.values())
    assert result.engine == "torch"


def test_backward_false_returns_no_gradients():
    case = AttentionCase(seqlen_q=3, seqlen_k=3, head_dim=8, backward=False)
    result = reference(case, make_inputs(case))
    assert result.dq is None and result.dk is None and result.dv is None
    assert set(result.error_scales) == {"out", "lse"}


def test_inputs_that_do_not_match_the_case_are_rejected():
    case = AttentionCase(seqlen_q=3, seqlen_k=3, head_dim=8)
    inputs = make_inputs(case)
    with pytest.raises(ReferenceInputError, match="q has shape"):
        attention_forward(inputs.q[:, :2], inputs.k, inputs.v, case)
    with pytest.raises(ReferenceInputError, match="engine"):
        reference(case, inputs, engine="fast")


def test_scores_too_large_for_the_bound_shift_take_the_exact_maximum_path():
    case = AttentionCase(batch_size=2, seqlen_q=40, seqlen_k=50, num_heads=2, head_dim=16, dtype="float32",
                         causal=True, causal_alignment="bottom_right")
    inputs = make_inputs(case)
    inputs.q = inputs.q * 100  # scores up to ~1000: exp(s - bound) would underflow
    result = reference(case, inputs, backward=True)
    expected = materialised(case, inputs)
    for name in ("out", "lse", "dq", "dk", "dv"):  # scores ~1e3: float64 agrees to ~1e3 * eps of the norm
        scale = float(expected[name][torch.isfinite(expected[name])].abs().max())
        torch.testing.assert_close(getattr(result, name), expected[name], rtol=1e-10, atol=1e-10 * scale)
    assert float(expected["lse"].max()) > 2 * SAFE_SHIFT_BOUND


@pytest.mark.parametrize("softcap", [None, 500.0])
def test_a_huge_score_on_a_masked_key_does_not_leak_into_visible_rows(softcap):
    case = AttentionCase(seqlen_q=30, seqlen_k=30, num_heads=1, head_dim=8, dtype="float32", causal=True,
                         softcap=softcap)
    inputs = make_inputs(case)
    inputs.k = inputs.k.clone()
    inputs.k[0, -1] = inputs.q[0, 0] * 300  # only the last row sees it; row 0's unmasked max would be huge
    result = reference(case, inputs, backward=True)
    expected = materialised(case, inputs)
    assert bool(torch.isfinite(result.lse).all())
    for name in ("out", "lse", "dq", "dk", "dv"):
        scale = float(expected[name].abs().max())
        torch.testing.assert_close(getattr(result, name), expected[name], rtol=1e-10, atol=1e-10 * scale)


def test_inputs_that_require_grad_give_results_without_autograd_history():
    case = AttentionCase(seqlen_q=6, seqlen_k=6, head_dim=8, causal=True)
    inputs = make_inputs(case)
    inputs.q.requires_grad_()
    result = reference(case, inputs)
    assert all(not t.requires_grad for t in (result.out, result.lse, result.dq, result.dk, result.dv))
