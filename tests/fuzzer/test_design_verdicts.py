"""Design-aware verdicts through the evaluator (`fuzzer.evaluate.explain`): on a float16 GQA case
whose per-query-head dk overflows (2.6e5) while the summed dk is finite, correct kernels of
designs that hold per-head gradients in the dtype get ``dk:limit`` (severity ``limit``, the
mechanism named), a float32 one passes, and a planted defect on the same case stays ``wrong``."""

from __future__ import annotations

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
