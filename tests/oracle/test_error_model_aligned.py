"""The float32 error model on aligned scores (`oracle.reference.aligned_score_growth`).

A float32 kernel sums each score over head_dim products in channel order; where q is aligned with
a key (a peaked row, an attention sink in channel 0) the products have one sign from the first
channels on, every partial sum is large and so is the score's rounding. The row's dominant score
then carries an error that softmax hands to every other probability of the row as a relative
error, which a tile of keys the row barely attends shows in full. Found as ``torch-cpu-math / bool_mask / dv:tile_mismatch`` (error ratio
1.15) on the case below: the single-row dv tile of key 128 (8.9e-13 of the tensor's norm) of PyTorch's
math SDPA was off by 409 u32, because the sink score of row 4 (32.37 nats) was off by -396 u32, as
a sequential float32 sum gives it.
"""

from __future__ import annotations

import math

import pytest
import torch

import oracle.reference as reference_module
from oracle.calibration import sdpa_attention
from oracle.compare import compare_outputs
from oracle.config import AttentionCase
from oracle.design import Claim, Design
from oracle.emulate import emulate
from oracle.inputs import make_inputs
from oracle.masks import visible_mask
from oracle.reference import reference

CASE = AttentionCase(
    batch_size=2, seqlen_q=5, seqlen_k=129, num_heads=2, num_heads_kv=2, head_dim=128, dtype="float32",
    causal=True, causal_alignment="bottom_right", qk_rank=5, attention_sink=True, peaked_rows=0.5,
    dout_distribution="large", seed=1350629696, backward=True,
)
TILE = (1, 128, 1)  # dv[batch 1, key 128, kv head 1]: the single-row tile of key 128, seen by row 4 only
MATH_DESIGN = Design("torch-math", (Claim("delta_from_dp", "PyTorch _scaled_dot_product_attention_math"),))


def sequential_float32_math(case, inputs):
    """PyTorch's math SDPA in float32 with every score summed in channel order, one rounding per
    product and per addition (elementwise IEEE operations, no BLAS: the same bits on every CPU):
    ``s = sum_m (q_m sqrt(c)) (k_m sqrt(c))``, the mask, softmax, ``out = P v``, ``dv = P^T dO``.
    A correct float32 kernel of the math design (Higham's recursive summation)."""
    q, k, v, dout = (x.transpose(1, 2).float() for x in (inputs.q, inputs.k, inputs.v, inputs.dout))  # [B, H, S, D]
    root = torch.tensor(case.softmax_scale, dtype=torch.float32).sqrt()
    qs, ks = q * root, k * root
    s = torch.zeros(q.shape[:3] + (k.shape[2],), dtype=torch.float32)
    for m in range(q.shape[-1]):
        s = s + qs[..., m, None] * ks[..., None, :, m]
    p = torch.softmax(s.masked_fill(~visible_mask(case, device="cpu"), -math.inf), dim=-1)
    back = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731
    return {"out": back(p @ v), "dv": back(p.transpose(-1, -2) @ dout)}


@pytest.fixture(scope="module")
def judged():
    inputs = make_inputs(CASE)
    return inputs, reference(CASE, inputs), sequential_float32_math(CASE, inputs)


def test_a_sequential_float32_kernel_passes_the_aligned_case(judged):
    _, ref, outputs = judged
    verdict = compare_outputs(CASE, ref, **outputs)
    assert verdict.passed, verdict.signatures
    assert verdict.tensors["dv"].error_ratio < 0.5
    # the tile is what the case is about: far below the tensor's scale, off by hundreds of u32
    tile, expected = outputs["dv"][TILE].double(), ref.dv[TILE]
    assert float(expected.norm() / ref.dv.norm()) < 1e-11
    assert float((tile - expected).norm() / expected.norm()) > 300 * 2.0**-24


def test_without_the_aligned_term_the_correct_kernel_fails_that_tile(monkeypatch):
    monkeypatch.setattr(
        reference_module, "aligned_score_growth",
        lambda partial_sums, probs, growth, aligned: growth[..., None].expand_as(probs).clone(),
    )
    inputs = make_inputs(CASE)
    verdict = compare_outputs(CASE, reference(CASE, inputs), **sequential_float32_math(CASE, inputs))
    assert "dv:tile_mismatch" in verdict.signatures
    assert verdict.tensors["dv"].worst_index[:2] == TILE[:2]


def test_pytorch_math_sdpa_and_the_float32_emulation_pass(judged):
    inputs, ref, _ = judged
    math_sdpa = {k: t for k, t in sdpa_attention(CASE, inputs, backend="math").items() if k != "lse"}
    emulated = {k: t for k, t in emulate(CASE, inputs, MATH_DESIGN).tensors().items() if k != "lse"}
    for outputs in (math_sdpa, emulated):
        verdict = compare_outputs(CASE, ref, **outputs)
        assert verdict.passed, verdict.signatures
        assert verdict.tensors["dv"].error_ratio < 0.5


@pytest.mark.parametrize("change", [1.05, 1.001, 0.0])
def test_a_defect_in_that_tile_is_still_caught(judged, change):
    _, ref, outputs = judged
    planted = outputs["dv"].clone()
    planted[TILE] = planted[TILE] * change  # 5% or 0.1% off, or zeroed, on key 128 only
    verdict = compare_outputs(CASE, ref, out=outputs["out"], dv=planted)
    assert verdict.signatures == ("dv:tile_mismatch",)
    assert verdict.tensors["dv"].worst_index[:2] == TILE[:2]
    assert verdict.tensors["dv"].error_ratio > 5


def test_the_term_would_move_bfloat16_and_float16_allowances_by_a_few_percent_at_most():
    """Why it applies to float32 only (`oracle.reference.ALIGNED_SCORE_MIN_RHO`): ``rho = 2**-16``
    / ``2**-13`` scales it below the rounding of ``P`` and ``dS`` to the dtype; on this aligned case
    (scores to 32 nats, head_dim 128) it would grow float16 dv by 4.2% at most."""
    for dtype in ("bfloat16", "float16"):
        case = CASE.replace(dtype=dtype, dout_distribution="normal")
        inputs = make_inputs(case)
        old = reference(case, inputs).error_scales
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(reference_module, "ALIGNED_SCORE_MIN_RHO", 0.0)
            new = reference(case, inputs).error_scales
        for name in ("dq", "dk", "dv"):
            ratio = new[name] / old[name].clamp(min=1e-300)
            assert 1.0 - 1e-9 < float(ratio.min()) and float(ratio.max()) < 1.05, (dtype, name)


@pytest.mark.parametrize(("dtype", "extra"), [("float32", 3), ("bfloat16", 0)])
def test_the_memory_plan_counts_the_score_blocks_the_term_keeps(monkeypatch, dtype: str, extra: int) -> None:
    """The float32 backward with error scales holds three more score-sized blocks (the partial
    sums, their weights, a temporary): `choose_block_q` plans for them, so a large case on a GPU
    keeps to the memory budget (bf16/fp16 do not compute the term)."""
    planned = []

    def spy(batch_size, num_heads, seqlen_q, seqlen_k, buffers, memory_budget_bytes):
        planned.append(buffers)
        return seqlen_q

    monkeypatch.setattr(reference_module, "choose_block_q", spy)
    case = AttentionCase(seqlen_q=8, seqlen_k=8, num_heads=2, head_dim=8, dtype=dtype, backward=True)
    reference(case, make_inputs(case, device="cpu"))
    assert planned == [3 + extra]
