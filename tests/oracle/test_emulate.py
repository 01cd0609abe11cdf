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


ACCUMULATED = Design(
    "blocks",
    (*UNDECLARED.claims, Claim("grads_accumulated", "tests/oracle/test_emulate.py", block_q=((0, 8), (40, 16)), block_k=16)),
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.qkv_format}-{c.dtype}-{c.seqlen_q}x{c.seqlen_k}")
def test_the_float64_run_of_the_block_accumulation_is_the_oracle_s_reference(case: AttentionCase) -> None:
    """The kernel-order accumulation of ``grads_accumulated`` (query heads, query blocks, key blocks;
    blocks of 8 or 16 rows and 16 keys, so the cases span several of each) computes the same
    gradients: its float64 run equals the reference to 1e-12 relative."""
    inputs = make_inputs(case)
    ref = reference(case, inputs)
    emu = emulate(case, inputs, ACCUMULATED, record=True)
    assert emu.stats["dk_partial"].max_abs > 0
    for name in ("dq", "dk", "dv"):
        a, r = getattr(emu, name), getattr(ref, name)
        scale = r.abs().max().clamp(min=1.0)
        assert float((a - r).abs().max() / scale) < 1e-12, name


def test_a_grads_accumulated_claim_needs_its_blocks_and_others_take_none() -> None:
    """`Claim` checks the blocks of ``grads_accumulated`` and refuses blocks on other claims;
    `Claim.query_block` picks the block of the largest threshold at or below seqlen_q."""
    with pytest.raises(DesignError, match="block_q"):
        Claim("grads_accumulated", "x")
    with pytest.raises(DesignError, match="block_k"):
        Claim("grads_accumulated", "x", block_q=((0, 32),))
    with pytest.raises(DesignError, match="only grads_accumulated"):
        Claim("probs", "x", block_k=4)
    claim = Claim("grads_accumulated", "x", block_q=((0, 32), (192, 64), (768, 256)), block_k=512)
    assert [claim.query_block(n) for n in (5, 191, 192, 767, 768, 5000)] == [5, 32, 64, 64, 256, 256]


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


def _te_unfused_design() -> Design:
    """The claims of TE's UnfusedDotProductAttention (`fuzzer.backends.te.TE_UNFUSED_DESIGN`),
    with a test's source."""
    names = ("scores", "probs", "dp", "delta_from_dp", "ds", "pre_scale_grads", "gqa_grads_per_head")
    return Design("te-unfused-like", tuple(Claim(n, "tests/oracle/test_emulate.py") for n in names))


@pytest.mark.parametrize("kernel_design", ["undeclared", "flash", "te-unfused"])
@pytest.mark.parametrize("planted", [None, "dv_zero", "out_row"])
def test_the_fuzz_phase_explanation_gives_the_signatures_of_the_complete_one(kernel_design: str, planted: str | None) -> None:
    """`explain_failure` with ``complete=False`` (the fuzz and shrink phases: only the failing
    tensors emulated, with the claims that reach them, `design_for`) gives the same verdict,
    explained tensors and signatures as the complete second opinion, for kernels of three designs
    judged against every design, with and without a planted defect (a zero dv, a wrong out row):
    the cheaper explanation decides nothing differently."""
    case, inputs = _overflowing_gqa_case()
    prepared = PreparedReference(case, reference(case, inputs), inputs=inputs)
    designs = {"undeclared": UNDECLARED, "flash": FLASH_NUMERICS, "te-unfused": _te_unfused_design()}
    kernel = emulate(case, inputs, designs[kernel_design]).tensors()
    if planted == "dv_zero":
        kernel["dv"] = torch.zeros_like(kernel["dv"])
    elif planted == "out_row":
        kernel["out"] = kernel["out"].clone()
        kernel["out"][0, 3] += 1.0
    verdict = compare_outputs(case, prepared, **kernel)
    assert not verdict.passed
    for design in designs.values():
        full = explain_failure(case, PreparedReference(case, prepared.reference, inputs=inputs), kernel, verdict, design)
        cheap = explain_failure(
            case, PreparedReference(case, prepared.reference, inputs=inputs), kernel, verdict, design, ablate=False, complete=False
        )
        assert (cheap.verdict, cheap.explained, cheap.signatures) == (full.verdict, full.explained, full.signatures), design.name
        failing = [n for n, t in verdict.tensors.items() if not t.passed]
        assert set(cheap.emulation["tensors"]) == set(failing)
        assert set(full.emulation["tensors"]) == set(verdict.tensors)


def test_design_for_keeps_the_claims_that_reach_the_tensors() -> None:
    """`design_for`: the forward tensors keep only the forward claims (no backward pass needed),
    a gradient keeps every claim that reaches it, and the whole design is returned unchanged when
    nothing is dropped."""
    from oracle.emulate import design_for

    te = _te_unfused_design()
    assert design_for(te, ["out"]).holds == {"scores", "probs"}
    assert design_for(te, ["lse"]).holds == {"scores"}
    assert design_for(UNDECLARED, ["dv"]).holds == {"probs", "gqa_grads_per_head"}
    assert design_for(UNDECLARED, ["dk"]) is UNDECLARED


# LLM-like float32 cases whose float32 computation (every step in float32) set the float32 factors
# of the error model (`oracle.tolerance.TOLERANCE_FACTORS`, CPU campaigns of 2026-12-05)
FLOAT32_EDGE_CASES = [
    AttentionCase(batch_size=2, seqlen_q=1, seqlen_k=1, num_heads=32, num_heads_kv=4, head_dim=224, dtype="float32",
                  causal=True, causal_alignment="bottom_right", window_size_right=1, softmax_scale=0.0668153104781061,
                  seed=590241021, qk_rank=4, attention_sink=True, seq_scale_log2=3, peaked_rows=0.125),
    AttentionCase(batch_size=2, seqlen_q=6, seqlen_k=5, num_heads=32, num_heads_kv=4, head_dim=40, dtype="float32",
                  causal_alignment="bottom_right", window_size_left=0, window_size_right=3,
                  softmax_scale=1.9447983128483537, seed=2, qk_rank=1, peaked_rows=1.0),
]


@pytest.mark.parametrize("case", FLOAT32_EDGE_CASES, ids=["lse-one-key", "out-peaked-rank-1"])
def test_a_float32_computation_passes_the_cases_that_set_the_float32_factors(case: AttentionCase) -> None:
    """A float32 emulation with nothing in a lower precision is a correct float32 kernel: on the
    two cases where it missed the float32 lse (7.69x) and out (1.86x) baselines it passes with the
    factors set from them."""
    inputs = make_inputs(case)
    prepared = PreparedReference(case, reference(case, inputs), inputs=inputs)
    emu = emulate(case, inputs, Design("float32", ()))
    verdict = compare_outputs(case, prepared, **emu.tensors())
    assert verdict.passed, verdict.signatures
