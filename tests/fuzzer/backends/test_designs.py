"""The designs the built-in backends declare (`oracle.design.Design`, ``docs/design-limits.md``).

Every built-in backend declares one; every claim names an intermediate attnfuzz knows and a
source; FA4 (and TE on FA4) claims neither per-head GQA gradients nor scores in the dtype, so its
known defects stay defects; the two CPU kernels' designs reproduce what the kernels do where they
differ (a GQA group whose per-head dk overflows float16 while the sum is zero, the math path's
softmax backward) and where they agree (float32 subnormal P kept).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from oracle.config import AttentionCase
from oracle.design import INTERMEDIATES, Claim, Design
from oracle.emulate import emulate
from oracle.inputs import AttentionInputs, make_inputs

MODULES = ("fuzzer.backends.sdpa", "fuzzer.backends.fa4", "fuzzer.backends.te", "fuzzer.backends.fa2",
           "fuzzer.backends.cp_cpu")
"""Every module of built-in backends (`fuzzer.registry` BUILTIN_MODULES and OPT_IN_MODULES),
imported directly so that an import error fails here instead of hiding the module's backends."""

EXPECTED = {
    "torch-cpu-math", "torch-cpu-flash", "torch-sdpa-math", "torch-sdpa-flash", "torch-sdpa-efficient",
    "torch-sdpa-cudnn", "torch-flex", "fa4", "te-fa4", "te-fa2", "te-fused", "te-unfused", "fa2",
    "cp-cpu-ring", "cp-cpu-planted-window", "cp-cpu-planted-merge",
}


def _builtins() -> dict:
    backends = {}
    for module in MODULES:
        for backend in importlib.import_module(module).builtin_backends():
            backends[backend.name] = backend
    return backends


BACKENDS = _builtins()


def test_every_builtin_backend_is_covered():
    assert set(BACKENDS) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_builtin_backend_declares_a_design(name):
    design = BACKENDS[name].design
    assert isinstance(design, Design), name
    assert design.summary.strip(), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_claim_names_a_known_intermediate_and_its_source(name):
    for claim in BACKENDS[name].design.claims:
        assert isinstance(claim, Claim)
        assert claim.intermediate in INTERMEDIATES, (name, claim.intermediate)
        assert claim.source.strip(), (name, claim.intermediate)
        assert claim.note.strip(), (name, claim.intermediate)


@pytest.mark.parametrize("name", ["fa4", "te-fa4"])
def test_fa4_claims_neither_per_head_gqa_gradients_nor_scores(name):
    """FA4 sums a GQA group in float32 and keeps the scores in float32: claiming either would make
    its known defects (all-zero causal output, the key-64 tail, windowed backward garbage) look
    like the design's limit."""
    holds = BACKENDS[name].design.holds
    assert "gqa_grads_per_head" not in holds and "scores" not in holds, holds


def test_adapters_of_one_kernel_share_its_design():
    assert BACKENDS["te-fa4"].design is BACKENDS["fa4"].design
    assert BACKENDS["te-fa2"].design is BACKENDS["fa2"].design
    assert BACKENDS["te-fused"].design is BACKENDS["torch-sdpa-cudnn"].design
    assert BACKENDS["torch-sdpa-math"].design is BACKENDS["torch-cpu-math"].design
    for planted in ("cp-cpu-planted-window", "cp-cpu-planted-merge"):
        assert BACKENDS[planted].design is BACKENDS["cp-cpu-ring"].design


def test_designs_of_one_name_are_one_design():
    """Emulations are cached by a design's name and claims: one name, one set of claims."""
    by_name: dict[str, frozenset] = {}
    for backend in BACKENDS.values():
        design = backend.design
        assert by_name.setdefault(design.name, design.holds) == design.holds, design.name


def _gqa_cancellation() -> tuple[AttentionCase, AttentionInputs]:
    """A GQA group of two query heads with the same P and opposite dout: each head's dk is about
    2e5, beyond float16's 65504, and the group's dk is exactly 0."""
    case = AttentionCase(seqlen_q=40, seqlen_k=2, num_heads=2, num_heads_kv=1, head_dim=32, dtype="float16")
    q = torch.full((1, 40, 2, 32), 2.0)
    k = torch.full((1, 2, 1, 32), 0.5)
    v = torch.ones(1, 2, 1, 32)
    v[0, 1] = -1.0
    dout = torch.full((1, 40, 2, 32), 1000.0)
    dout[:, :, 1] = -1000.0
    return case, AttentionInputs(*(t.half() for t in (q, k, v, dout)))


def test_the_cpu_kernels_designs_give_what_the_kernels_give_on_a_gqa_overflow():
    """torch-cpu-math sums the group in float32 (dk exactly 0, as its empty design); the CPU flash
    kernel holds per-head dk in float16 (non-finite dk, as its design's emulation)."""
    case, inputs = _gqa_cancellation()
    math_emu = emulate(case, inputs, BACKENDS["torch-cpu-math"].design)
    flash_emu = emulate(case, inputs, BACKENDS["torch-cpu-flash"].design)
    assert torch.equal(math_emu.dk, torch.zeros_like(math_emu.dk))
    assert not torch.isfinite(flash_emu.dk).any()
    math_out = BACKENDS["torch-cpu-math"].run(case, inputs, "is_causal")
    assert torch.equal(math_out.dk, torch.zeros_like(math_out.dk))
    for variant in ("is_causal", "aten_lse"):
        flash_out = BACKENDS["torch-cpu-flash"].run(case, inputs, variant)
        assert not torch.isfinite(flash_out.dk).any(), variant


def test_the_math_design_s_softmax_backward_is_the_kernel_s():
    """torch-cpu-math takes D = rowsum(P dP) from autograd's softmax backward (``delta_from_dp``):
    its emulation gives the kernel's bfloat16 gradients to float32 rounding."""
    case = AttentionCase(seqlen_q=40, seqlen_k=70, num_heads=4, num_heads_kv=2, head_dim=32, dtype="bfloat16",
                         seed=2, dout_distribution="large")
    inputs = make_inputs(case)
    kernel = BACKENDS["torch-cpu-math"].run(case, inputs, "is_causal")
    emulated = emulate(case, inputs, BACKENDS["torch-cpu-math"].design)
    for name in ("dq", "dk"):
        a, e = getattr(kernel, name).double(), getattr(emulated, name).double()
        assert float((a - e).norm() / e.norm()) < 1e-5, name


def test_the_cpu_kernels_keep_float32_subnormal_probabilities_on_a_small_case():
    """Keys at 88.5 nats below a row's maximum have P = 3.8e-39, below float32's smallest normal:
    on this small case both CPU kernels keep those P (their dv and dk are not 0). torch-cpu-math
    claims no ``flush_to_zero``; torch-cpu-flash claims it from a larger case where its bfloat16
    GEMM reads them as zero (the next test): a design's flush is a bound, and a kernel that keeps
    the values is closer to the reference than the flushing emulation, within the rule."""
    case = AttentionCase(seqlen_q=4, seqlen_k=64, num_heads=1, head_dim=16, dtype="bfloat16", softmax_scale=1.0)
    q = torch.zeros(1, 4, 1, 16)
    q[..., 0] = 88.5
    k = torch.zeros(1, 64, 1, 16)
    k[0, 0, 0, 0] = 1.0
    v = torch.randn(1, 64, 1, 16, generator=torch.Generator().manual_seed(0))
    dout = torch.randn(1, 4, 1, 16, generator=torch.Generator().manual_seed(1))
    inputs = AttentionInputs(*(t.to(torch.bfloat16) for t in (q, k, v, dout)))
    assert "flush_to_zero" not in BACKENDS["torch-cpu-math"].design.holds
    assert "flush_to_zero" in BACKENDS["torch-cpu-flash"].design.holds
    for name, variant in (("torch-cpu-math", "is_causal"), ("torch-cpu-flash", "is_causal")):
        output = BACKENDS[name].run(case, inputs, variant)
        assert (output.dv[0, 1:].float() != 0).all(), name
    flushed = emulate(case, inputs, Design("flushed", (Claim("probs", "test"), Claim("flush_to_zero", "test"))))
    assert (flushed.dv[0, 1:].float() == 0).all()


def test_the_cpu_flash_kernel_reads_a_subnormal_bfloat16_p_as_zero_on_a_larger_case():
    """The measurement behind torch-cpu-flash's ``flush_to_zero`` claim (a CPU campaign of
    2026-12-05): bf16, one query, 428 keys, 9/3 heads, massive channels, large dout. Where the
    float64 dv is about 1.5e-36 (P ~ 2e-39 times dO ~ 800, a normal bfloat16) the kernel returns
    exactly 0, and the evaluator calls that ``dv:limit`` of its design (``wrong`` before the claim)."""
    from fuzzer.evaluate import Evaluator
    from fuzzer.severity import severity
    from oracle.reference import reference

    case = AttentionCase(seqlen_q=1, seqlen_k=428, num_heads=9, num_heads_kv=3, head_dim=40, dtype="bfloat16",
                         softmax_scale=1.6149560197329367, seed=7, massive_channels=2, peaked_rows=0.5,
                         dout_distribution="large")
    inputs = make_inputs(case)
    ref = reference(case, inputs)
    output = BACKENDS["torch-cpu-flash"].run(case, inputs, "is_causal")
    tiny = (ref.dv.abs() > 1e-37) & (ref.dv.abs() < 1e-35)
    assert tiny.any() and (output.dv.double()[tiny] == 0).any()  # some, where P itself is subnormal
    flash = BACKENDS["torch-cpu-flash"]
    with Evaluator([(flash, ("is_causal",))], isolation="none") as evaluator:
        (result,) = [r for r in evaluator.evaluate(case).results if r.variant == "is_causal"]
    assert result.status == "fail" and result.signatures == ("dv:limit",), result.signatures
    assert severity(result.signature, result.error_ratio) == "limit"


def test_ds_scaled_softcap_is_the_plain_ds_without_a_softcap():
    """FlashAttention 2 rounds dS * scale / softcap with a softcap and the plain dS without one."""
    case = AttentionCase(seqlen_q=8, seqlen_k=24, num_heads=2, head_dim=32, dtype="float16", seed=3)
    base = make_inputs(case)
    inputs = AttentionInputs(base.q, base.k, base.v, (base.dout.float() * 3e-4).half())
    fa2 = emulate(case, inputs, BACKENDS["fa2"].design)
    plain = emulate(case, inputs, Design("plain-ds", (Claim("probs", "test"), Claim("ds", "test"),
                                                      Claim("gqa_grads_per_head", "test"))))
    for name in ("dq", "dk", "dv"):
        assert torch.equal(getattr(fa2, name), getattr(plain, name)), name


def test_scores_in_the_dtype_round_the_capped_scores_too():
    """TE's unfused softcap is cap * tanh(s / cap) on dtype tensors: the capped scores enter the
    softmax in the dtype."""
    case = AttentionCase(seqlen_q=4, seqlen_k=16, head_dim=16, dtype="float16", softcap=30.0, seed=5,
                         input_distribution="large_logits", backward=False)
    inputs = make_inputs(case)
    claims = (Claim("scores", "test"), Claim("probs", "test"))
    emulated = emulate(case, inputs, Design("scores-probs", claims), record=False)
    s = torch.einsum("bqhd,bkhd->bhqk", inputs.q.float(), inputs.k.float()) * case.softmax_scale
    s = s.half().float()
    s = (30.0 * torch.tanh(s / 30.0)).half().float()
    p = torch.softmax(s, -1).half().float()
    out = torch.einsum("bhqk,bkhd->bqhd", p, inputs.v.float()).half()
    assert torch.equal(emulated.out, out)


ROOT = Path(__file__).resolve().parents[3]


def _lines(path: str, first: int, last: int) -> str:
    return "".join((ROOT / path).read_text(encoding="utf-8").splitlines(keepends=True)[first - 1:last])


def test_the_lines_of_this_repository_that_designs_cite_are_the_cited_code():
    """The claims that cite attnfuzz's own files name lines that still hold that code."""
    import re

    from fuzzer.backends import cp_cpu, sdpa

    first, last = map(int, re.search(r"fuzzer/backends/sdpa\.py:(\d+)-(\d+)", sdpa._ADAPTER_GQA).groups())
    assert _lines("fuzzer/backends/sdpa.py", first, last).count("repeat_interleave(group") == 2
    summary = cp_cpu.CP_CPU_DESIGN.summary
    cited = {
        r"cp_cpu\.py:(\d+)": ".float()",
        r"_block_backward: (\d+)-": "def _block_backward",
        r"_block_backward: \d+-(\d+)": "torch.einsum",
        r"_output: (\d+)": ".to(dtype)",
        r"_delta: (\d+)": "out.to(torch_dtype(case.dtype))",
    }
    for pattern, code in cited.items():
        line = int(re.search(pattern, summary).group(1))
        assert code in _lines("fuzzer/backends/cp_cpu.py", line, line), (pattern, line)
