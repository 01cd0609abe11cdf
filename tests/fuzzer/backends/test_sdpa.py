"""Tests of fuzzer/backends/sdpa.py: declared limits, and every CPU variant agrees with the oracle."""

import pytest

from fuzzer.backends.sdpa import builtin_backends
from fuzzer.worker import _normalise_masked_lse
from oracle.compare import compare_outputs
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference

BACKENDS = {b.name: b for b in builtin_backends()}
CPU = [b for b in BACKENDS.values() if b.device == "cpu"]

CASES = [
    AttentionCase(seqlen_q=5, seqlen_k=7, num_heads=4, num_heads_kv=2, head_dim=16, dtype="float32", causal=True),
    AttentionCase(
        seqlen_q=9, seqlen_k=4, head_dim=8, dtype="bfloat16", causal=True, causal_alignment="bottom_right", backward=True
    ),
    AttentionCase(seqlen_q=6, seqlen_k=6, head_dim=32, dtype="float16", window_size_left=1, window_size_right=2),
    AttentionCase(seqlen_q=3, seqlen_k=70, head_dim=16, dtype="float32", qkv_format="sbhd", batch_size=2),
]


@pytest.mark.parametrize("backend", CPU, ids=lambda b: b.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.describe())
def test_every_supported_cpu_variant_passes_against_the_oracle(backend, case):
    inputs = make_inputs(case)
    ref = reference(case, inputs)
    ran = 0
    for variant in backend.variants:
        if backend.unsupported_reasons(case, variant):
            continue
        output = backend.run(case, inputs, variant)
        lse = output.lse
        if lse is not None and backend.masked_row_lse is not None:
            lse = _normalise_masked_lse(lse, ref.lse, backend.masked_row_lse)
        verdict = compare_outputs(case, ref, out=output.out, lse=lse, dq=output.dq, dk=output.dk, dv=output.dv)
        assert verdict.passed, (variant, verdict.signatures, verdict.error_ratio)
        ran += 1
    assert ran >= 1


def test_is_causal_is_declared_top_left_only():
    case = AttentionCase(seqlen_q=4, seqlen_k=6, causal=True, causal_alignment="bottom_right")
    reasons = BACKENDS["torch-cpu-math"].unsupported_reasons(case, "is_causal")
    assert any("top-left" in r for r in reasons)
    assert not BACKENDS["torch-cpu-math"].unsupported_reasons(case, "bool_mask")


def test_limits_measured_on_the_h200_are_declared():
    gqa = AttentionCase(num_heads=2, num_heads_kv=1, head_dim=16, causal=True)
    assert any("enable_gqa" in r for r in BACKENDS["torch-sdpa-efficient"].unsupported_reasons(gqa, "is_causal"))
    assert not any("enable_gqa" in r for r in BACKENDS["torch-sdpa-efficient"].unsupported_reasons(gqa, "aten_lse"))
    small = AttentionCase(head_dim=8)
    assert any("head_dim 8" in r for r in BACKENDS["torch-sdpa-cudnn"].unsupported_reasons(small, "is_causal"))


def test_the_cuda_flash_kernel_takes_no_non_square_causal_case():
    """PyTorch's flash SDPA refuses is_causal with seqlen_q != seqlen_k and its private op would
    align such a mask bottom-right (FlashAttention 2's convention): declared for every variant;
    square causal cases and non-causal non-square ones still run."""
    flash = BACKENDS["torch-sdpa-flash"]
    wide = AttentionCase(seqlen_q=1, seqlen_k=2, head_dim=8, dtype="bfloat16", causal=True)
    for variant in ("is_causal", "causal_bias", "aten_lse"):
        assert any("bottom-right" in r for r in flash.unsupported_reasons(wide, variant)), variant
    square = AttentionCase(seqlen_q=2, seqlen_k=2, head_dim=8, dtype="bfloat16", causal=True)
    plain = AttentionCase(seqlen_q=1, seqlen_k=2, head_dim=8, dtype="bfloat16")
    for variant in ("is_causal", "aten_lse"):
        assert flash.unsupported_reasons(square, variant) == [] and flash.unsupported_reasons(plain, variant) == []
    assert not any("bottom-right" in r for r in BACKENDS["torch-sdpa-efficient"].unsupported_reasons(wide, "is_causal"))


def test_the_cpu_flash_masked_row_lse_is_mapped_only_on_masked_rows():
    case = AttentionCase(seqlen_q=6, seqlen_k=3, causal=True, causal_alignment="bottom_right", dtype="float32")
    inputs = make_inputs(case)
    ref = reference(case, inputs)
    backend = BACKENDS["torch-cpu-flash"]
    output = backend.run(case, inputs, "aten_lse")
    raw = compare_outputs(case, ref, out=output.out, lse=output.lse)
    assert "lse:finite_on_masked" in raw.signatures  # the library's 0 on rows that see no key
    fixed = _normalise_masked_lse(output.lse, ref.lse, backend.masked_row_lse)
    assert compare_outputs(case, ref, out=output.out, lse=fixed).passed
    planted = output.lse.clone()
    planted[..., -1] = 0.0  # a visible row with lse 0 must still fail after the mapping
    assert not compare_outputs(case, ref, out=output.out, lse=_normalise_masked_lse(planted, ref.lse, 0.0)).passed
