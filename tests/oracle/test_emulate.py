"""The design emulation (`oracle.emulate`) and the designs as data (`oracle.design`): the float64
run is the oracle's reference, the float32 run of the FlashAttention numerics passes the oracle,
and `explain_failure` calls a failure a design's limit only where a correct kernel of that design
fails the same way (planted defects stay defects)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from oracle.compare import PreparedReference, compare_outputs
from oracle.config import AttentionCase
from oracle.design import FLASH_NUMERICS, UNDECLARED, Claim, Design, DesignError
from oracle.emulate import design_rule, emulate, explain_failure
from oracle.inputs import make_inputs
from oracle.reference import reference

CASES = [
    AttentionCase(batch_size=2, seqlen_q=37, seqlen_k=70, num_heads=4, num_heads_kv=2, head_dim=16, head_dim_v=8, dtype="float16", seed=1),
    AttentionCase(seqlen_q=70, seqlen_k=33, num_heads=2, head_dim=16, causal=True, causal_alignment="bottom_right", dtype="bfloat16", seed=2),
    AttentionCase(seqlen_q=40, seqlen_k=40, num_heads=3, num_heads_kv=1, head_dim=8, window_size_left=5, window_size_right=2, softcap=3.0, dtype="float32", seed=3),
    AttentionCase(batch_size=3, qkv_format="thd", seqlens_q=(5, 17, 1), seqlens_k=(9, 17, 30), seqlen_q=17, seqlen_k=30,
                  num_heads=4, num_heads_kv=2, head_dim=16, causal=True, dtype="float16", seed=4),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.qkv_format}-{c.dtype}-{c.seqlen_q}x{c.seqlen_k}")
def test_the_float64_run_of_the_emulation_is_the_oracle_s_reference(case: AttentionCase) -> None:
    """With ``record`` (float64, nothing rounded) the emulation computes the oracle's formulas:
    every tensor equals `oracle.reference.reference` to 1e-12 relative (masked rows, bottom-right
    causal with seqlen_q > seqlen_k, windows, softcap, GQA, varlen)."""
    inputs = make_inputs(case)
    ref = reference(case, inputs)
    emu = emulate(case, inputs, UNDECLARED, record=True)
    for name in ("out", "lse", "dq", "dk", "dv"):
        a, r = getattr(emu, name), getattr(ref, name)
        assert a.shape == r.shape, name
        finite = torch.isfinite(r)
        assert torch.equal(torch.isfinite(a), finite), name
        scale = r[finite].abs().max().clamp(min=1.0)
        assert float((a[finite] - r[finite]).abs().max() / scale) < 1e-12, name


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.qkv_format}-{c.dtype}-{c.seqlen_q}x{c.seqlen_k}")
def test_the_flash_numerics_emulation_passes_the_oracle(case: AttentionCase) -> None:
    """The float32 emulation of the numerics the tolerance model assumes (`FLASH_NUMERICS`) is a
    correct kernel: it passes the oracle on ordinary inputs."""
    inputs = make_inputs(case)
    prepared = PreparedReference(case, reference(case, inputs), inputs=inputs)
    emu = emulate(case, inputs, FLASH_NUMERICS)
    assert emu.out.dtype == getattr(torch, case.dtype) and emu.lse.dtype == torch.float32
    verdict = compare_outputs(case, prepared, **emu.tensors())
    assert verdict.passed, verdict.signatures


def _overflowing_gqa_case() -> tuple[AttentionCase, object]:
    """A float16 GQA case whose per-query-head dk overflows (about 2.4e5) while the summed dk stays
    finite (about 1.3e3): query heads in pairs with equal q and opposite dout (times 0.995)."""
    case = AttentionCase(seqlen_q=512, seqlen_k=64, num_heads=4, num_heads_kv=1, head_dim=32, dtype="float16", seed=1)
    inputs = make_inputs(case)
    q = inputs.q.clone()
    q[:, :, 1], q[:, :, 3] = q[:, :, 0], q[:, :, 2]
    dout = inputs.dout.double()
    dout[:, :, 1], dout[:, :, 3] = -0.995 * dout[:, :, 0], -0.995 * dout[:, :, 2]
    inputs = dataclasses.replace(inputs, q=q, dout=(300 * dout).half(), v=(300 * inputs.v.double()).half())
    return case, inputs


def test_a_per_head_gqa_overflow_is_the_limit_of_a_design_that_holds_per_head_gradients() -> None:
    """The issue's mechanism 1: a correct kernel that writes per-head dk in float16 before the GQA
    sum (`UNDECLARED`) gets infinite dk where the float64 dk is finite. Explained against its own
    design it is ``dk:limit`` with the figure named; against a design that sums in float32
    (`FLASH_NUMERICS`, e.g. FA4) the same output stays a defect on dk."""
    case, inputs = _overflowing_gqa_case()
    prepared = PreparedReference(case, reference(case, inputs), inputs=inputs)
    kernel = emulate(case, inputs, UNDECLARED).tensors()
    verdict = compare_outputs(case, prepared, **kernel)
    assert not verdict.passed and verdict.tensors["dk"].nan_count + verdict.tensors["dk"].posinf_count > 0
    own = explain_failure(case, prepared, kernel, verdict, UNDECLARED)
    assert own.verdict == "limit" and "dk:limit" in own.signatures
    assert all(s.endswith(":limit") for s in own.signatures)
    assert "per-head dk" in own.why and "before the GQA sum" in own.why and "65,504" in own.why
    other = explain_failure(case, prepared, kernel, verdict, FLASH_NUMERICS)
    assert other.verdict == "defect" and other.signatures[0].startswith("dk:") and "dk:limit" not in other.signatures
    assert other.rule["dk"]["nonfinite_outside"] > 2


def test_planted_defects_stay_defects_beside_a_design_limit() -> None:
    """On the overflowing case, a kernel of the design whose dv is zeroed, or whose out has one row
    doubled, keeps ``dv``/``out`` as defects (first, so the bucket is ``wrong``) while the shared
    dk overflow is the limit; an all-zero output is never a limit."""
    case, inputs = _overflowing_gqa_case()
    prepared = PreparedReference(case, reference(case, inputs), inputs=inputs)
    kernel = emulate(case, inputs, UNDECLARED).tensors()
    zeroed = dict(kernel, dv=torch.zeros_like(kernel["dv"]))
    verdict = compare_outputs(case, prepared, **zeroed)
    explained = explain_failure(case, prepared, zeroed, verdict, UNDECLARED)
    assert explained.verdict == "defect" and explained.signatures[0].startswith("dv:")
    assert "dk:limit" in explained.signatures
    doubled = kernel["out"].clone()
    doubled[0, 100] *= 2
    wrong_row = dict(kernel, out=doubled)
    verdict = compare_outputs(case, prepared, **wrong_row)
    explained = explain_failure(case, prepared, wrong_row, verdict, UNDECLARED)
    assert explained.signatures[0].startswith("out:") and explained.verdict == "defect"


def test_scores_held_in_bfloat16_at_large_magnitude_are_not_judgeable() -> None:
    """TE-unfused-style scores written in bfloat16 at a score offset of -256 nats: the spacing is
    2 nats there, beyond any first-order bound; the kernel of that design is ``unjudgeable``, with
    the figure named."""
    design = Design("scores-in-dtype", (Claim("scores", "tests: baddbmm(alpha=scale) with a bfloat16 output"), *FLASH_NUMERICS.claims))
    case = AttentionCase(seqlen_q=64, seqlen_k=64, num_heads=2, head_dim=32, dtype="bfloat16", score_offset=-256.0, backward=False, seed=5)
    inputs = make_inputs(case)
    prepared = PreparedReference(case, reference(case, inputs), inputs=inputs)
    kernel = emulate(case, inputs, design).tensors()
    verdict = compare_outputs(case, prepared, **kernel)
    assert not verdict.passed
    explained = explain_failure(case, prepared, kernel, verdict, design)
    assert explained.verdict == "unjudgeable" and all(s.endswith(":unjudgeable") for s in explained.signatures)
    assert "bfloat16 scores" in explained.why and "first-order" in explained.why


def test_the_rule_is_infinite_for_a_wrong_shape() -> None:
    """`design_rule` of a tensor of another shape than the reference's holds nowhere."""
    case = CASES[0]
    inputs = make_inputs(case)
    prepared = PreparedReference(case, reference(case, inputs), inputs=inputs)
    emu = emulate(case, inputs, FLASH_NUMERICS)
    figures = design_rule(prepared.tensor("out"), emu.out[:, :-1], emu.out)
    assert not figures.holds and figures.ratio == float("inf")
    same = design_rule(prepared.tensor("out"), emu.out, emu.out)
    assert same.holds and same.ratio <= 1 / 2


def test_designs_are_checked_when_declared() -> None:
    """A claim names a known intermediate and a source; a design rounds dS one way at most: each
    error names the field and the allowed values."""
    with pytest.raises(DesignError, match="intermediate: unknown value 'logits'.*allowed: scores"):
        Claim("logits", "somewhere:1")
    with pytest.raises(DesignError, match="source"):
        Claim("probs", " ")
    with pytest.raises(DesignError, match="claims: at most one of ds, ds_scaled"):
        Design("two", (Claim("ds", "a:1"), Claim("ds_scaled", "b:2")))
    assert UNDECLARED.holds == {"probs", "ds", "gqa_grads_per_head"}
    assert FLASH_NUMERICS.to_json()["claims"][0]["intermediate"] == "probs"


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.qkv_format}-{c.dtype}-{c.seqlen_q}x{c.seqlen_k}")
def test_the_emulation_on_cuda_is_the_emulation_on_the_cpu(case: AttentionCase) -> None:
    """On a GPU (where the worker's judge thread runs it) the float64 run is the oracle's reference
    and the float32 FlashAttention run passes the oracle, as on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    inputs = make_inputs(case, "cuda")
    ref = reference(case, inputs)
    emu = emulate(case, inputs, UNDECLARED, record=True)
    for name in ("out", "lse", "dq", "dk", "dv"):
        a, r = getattr(emu, name), getattr(ref, name)
        finite = torch.isfinite(r)
        assert a.device.type == "cuda" and torch.equal(torch.isfinite(a), finite), name
        assert float((a[finite] - r[finite]).abs().max() / r[finite].abs().max().clamp(min=1.0)) < 1e-12, name
    prepared = PreparedReference(case, ref, inputs=inputs)
    assert compare_outputs(case, prepared, **emulate(case, inputs, FLASH_NUMERICS).tensors()).passed
