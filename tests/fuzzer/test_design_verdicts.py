"""Design-aware verdicts through the evaluator (`fuzzer.evaluate.explain`): on a float16 GQA case
whose per-query-head dk overflows (2.6e5) while the summed dk is finite, correct kernels of
designs that hold per-head gradients in the dtype get ``dk:limit`` (severity ``limit``, the
mechanism named), a float32 one passes, and a planted defect on the same case stays ``wrong``."""

from __future__ import annotations

import copy

import torch

from fuzzer.backends.base import BackendOutput
from fuzzer.evaluate import DESIGN_METRICS_KEY, Evaluator
from fuzzer.severity import severity
from oracle.config import AttentionCase
from tests.fuzzer.design_plugins import FlashStyle, Fp32Inside, GqaExpandInDtype, TEUnfusedStyle

# found by a search of the case space with oracle.emulate.emulate(record=True): per-head dk up to
# 2.6e5, the float64 dk finite in float16 at those entries
OVERFLOWING = AttentionCase(
    seqlen_q=256, seqlen_k=256, num_heads=6, num_heads_kv=1, head_dim=64, dtype="float16", seed=988,
    score_offset=-50.0, qk_rank=2, attention_sink=True, seq_scale_log2=3, peaked_rows=0.125, dout_distribution="large",
)


class ZeroedDv(GqaExpandInDtype):
    """The GQA-expanding kernel with a planted defect: dv is all zero."""

    name = "design-gqa-fp16-zero-dv"

    def run(self, case, inputs, variant):
        output = super().run(case, inputs, variant)
        return BackendOutput(out=output.out, lse=output.lse, dq=output.dq, dk=output.dk, dv=torch.zeros_like(output.dv))


def test_correct_kernels_of_per_head_designs_get_a_limit_and_a_planted_defect_stays_wrong() -> None:
    backends = [Fp32Inside(), GqaExpandInDtype(), FlashStyle(), TEUnfusedStyle(), ZeroedDv()]
    with Evaluator([(b, b.variants) for b in backends], isolation="none") as evaluator:
        results = {r.backend: r for r in evaluator.evaluate(OVERFLOWING).results}
    assert results["design-fp32"].status == "pass"
    for name in ("design-gqa-fp16", "design-flash"):
        result = results[name]
        assert result.status == "fail" and result.signature == "dk:limit", (name, result.signatures)
        assert severity(result.signature, result.error_ratio) == "limit"
        block = result.metrics[DESIGN_METRICS_KEY]
        assert block["verdict"] == "limit" and "per-head dk" in block["why"] and "GQA sum" in block["why"]
        assert block["rule"]["dk"]["holds"] and not block["emulation"]["passed"]
    te = results["design-te-unfused"]
    assert te.status == "fail" and all(severity(s) == "limit" for s in te.signatures), te.signatures
    planted = results["design-gqa-fp16-zero-dv"]
    assert planted.signature.startswith("dv:") and severity(planted.signature, planted.error_ratio) == "wrong"
    assert "dk:limit" in planted.signatures
    assert planted.metrics[DESIGN_METRICS_KEY]["verdict"] == "defect"


def test_a_design_that_sums_gqa_gradients_in_float32_keeps_the_overflow_wrong() -> None:
    """The same per-head overflow from a backend that declares FlashAttention numerics with a
    float32 GQA sum (FA4's design) is ``wrong``: the declaration decides, not the regime."""
    from oracle.design import FLASH_NUMERICS

    class ClaimsFloat32Sum(GqaExpandInDtype):
        name = "design-gqa-fp16-claims-fp32-sum"
        design = FLASH_NUMERICS

    with Evaluator([(ClaimsFloat32Sum(), ("default",))], isolation="none") as evaluator:
        (result,) = evaluator.evaluate(OVERFLOWING).results
    assert result.status == "fail" and result.signature.startswith("dk:") and severity(result.signature, result.error_ratio) == "wrong"
    block = result.metrics[DESIGN_METRICS_KEY]
    assert block["verdict"] == "defect" and block["emulation"]["tensors"]["dk"]["signatures"] == []  # the design passes


# found by a CPU search of torch-cpu-flash's fp16 GQA backward cases on 2026-12-05 (`bool_mask`
# dk:neginf at one entry; the float64 dk is finite there): a partial sum of dk, accumulated block
# by block in the float16 output, passes 65,504
PARTIAL_SUM_OVERFLOW = AttentionCase(
    seqlen_q=113, seqlen_k=113, num_heads=8, num_heads_kv=1, head_dim=243, dtype="float16", qkv_format="sbhd",
    causal=True, window_size_left=224, softmax_scale=1.6444555389258468, input_distribution="near_constant",
    seed=44072, score_offset=60.0, dout_distribution="large",
)


def test_torch_cpu_flash_partial_sums_in_float16_are_its_design_s_limit_and_a_planted_defect_stays_wrong() -> None:
    """PyTorch's CPU flash backward accumulates dk over query blocks and over the GQA group's heads
    in its float16 output (`grads_accumulated`): on this case a partial sum overflows while the
    whole dk fits. Every variant of torch-cpu-flash that fails gets ``dk:limit`` with the partial
    sums named (before the claim: ``wrong dk:neginf``), and the same kernel with a zeroed dv stays
    ``wrong`` on dv."""
    from fuzzer.registry import select

    (flash, _), = select(["torch-cpu-flash"])

    class ZeroDv(type(flash)):
        def run(self, case, inputs, variant):
            output = super().run(case, inputs, variant)
            return BackendOutput(out=output.out, lse=output.lse, dq=output.dq, dk=output.dk, dv=torch.zeros_like(output.dv))

    planted = copy.copy(flash)
    planted.__class__ = ZeroDv
    planted.name = "torch-cpu-flash-zero-dv"
    with Evaluator([(flash, flash.variants), (planted, ("bool_mask",))], isolation="none") as evaluator:
        results = evaluator.evaluate(PARTIAL_SUM_OVERFLOW).results
    failing = [r for r in results if r.backend == "torch-cpu-flash" and r.status == "fail"]
    assert failing, [(r.variant, r.status) for r in results]
    for result in failing:
        assert all(severity(s) == "limit" for s in result.signatures), (result.variant, result.signatures)
        assert "partial sums of dk" in result.metrics[DESIGN_METRICS_KEY]["why"]
    (zeroed,) = [r for r in results if r.backend == "torch-cpu-flash-zero-dv"]
    assert zeroed.status == "fail" and severity(zeroed.signature, zeroed.error_ratio) == "wrong"
    assert zeroed.signature.startswith("dv:")


# a CPU campaign of 2026-12-05: the TE-unfused-style plugin failed out at 1.003 (imprecise) where
# the emulation of its design passes at 0.83
NARROW = AttentionCase(
    batch_size=2, seqlen_q=6, seqlen_k=4, num_heads=8, num_heads_kv=4, head_dim=64, dtype="float16", causal=True,
    causal_alignment="bottom_right", window_size_right=0, softmax_scale=1.2958003989811817,
    input_distribution="near_constant", seed=2, backward=False,
)
AMPLIFIED = 1.5
"""The narrow kernel's error from the float64 out, times this: its ratio to the allowance about
1.5 (outside it, whatever the host's float16 GEMM rounds: the kernel's own ratio is 1.003 on one
host and under 1 on another), still within FlashAttention's rule (at most twice the emulation's
error, 0.83 of the allowance, plus the allowance)."""


class Amplified(TEUnfusedStyle):
    """The TE-unfused-style kernel with its out error from the float64 reference times
    `AMPLIFIED`: a failure of precision only, of the size a kernel of this design may have."""

    def run(self, case, inputs, variant):
        from oracle.reference import attention_forward

        output = super().run(case, inputs, variant)
        ref = attention_forward(inputs.q, inputs.k, inputs.v, case, error_scales=False).out
        out = (ref + AMPLIFIED * (output.out.double() - ref)).to(output.out.dtype)
        return BackendOutput(out=out, dq=output.dq, dk=output.dk, dv=output.dv)


def test_a_narrow_precision_failure_within_the_rule_is_the_design_s_limit_and_a_worse_one_is_not() -> None:
    """Where the emulation of the design passes the oracle narrowly, a kernel whose ``mismatch`` or
    ``tile_mismatch`` is within FlashAttention's rule against it gets ``<tensor>:limit`` (the
    design's precision: its own test suite accepts it); the same kernel with out 5% off stays
    outside the rule, a defect."""
    class FivePercentOff(TEUnfusedStyle):
        name = "design-te-unfused-five-percent"

        def run(self, case, inputs, variant):
            output = super().run(case, inputs, variant)
            return BackendOutput(out=(output.out.float() * 1.05).to(output.out.dtype), dq=output.dq, dk=output.dk, dv=output.dv)

    backends = [Amplified(), FivePercentOff()]
    with Evaluator([(b, b.variants) for b in backends], isolation="none") as evaluator:
        results = {r.backend: r for r in evaluator.evaluate(NARROW).results}
    narrow = results["design-te-unfused"]
    assert narrow.status == "fail" and narrow.signatures == ("out:limit",), narrow.signatures
    block = narrow.metrics[DESIGN_METRICS_KEY]
    assert block["emulation"]["passed"] and block["rule"]["out"]["holds"]
    off = results["design-te-unfused-five-percent"]
    assert off.status == "fail" and severity(off.signature, off.error_ratio) != "limit", off.signatures
