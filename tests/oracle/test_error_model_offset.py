"""The float32 error model on score-offset cases (row lse to +-250): a correct float32
FlashAttention-style kernel passes, and one whose backward normalisation is off by a little more
than the rounding the model allows (`oracle.reference.normalisation_error_scale`) is caught."""

from __future__ import annotations

import math

import pytest
import torch

from oracle.compare import compare_outputs
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference


def flash_style_fp32(q, k, v, dout, scale, lse_bias=0.0):
    """FlashAttention-2 numerics in float32 on ``[1, s, h, d]`` tensors without a mask: forward
    ``out = softmax(s) v`` (normalised by the row sum), ``lse`` in fp32; backward recomputes
    ``P = exp(s - lse - lse_bias)`` from the stored lse, ``D = rowsum(dO * O)``, ``dS = P (dP - D)``
    (arXiv:2307.08691, Algorithm 2). ``lse_bias`` (nats) plants a normalisation error."""
    q, k, v, dout = (x[0].transpose(0, 1).float() for x in (q, k, v, dout))  # [h, s, d]
    s = torch.bmm(q, k.transpose(1, 2)) * scale
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    row_sum = e.sum(-1, keepdim=True)
    out = torch.bmm(e, v) / row_sum
    lse = (m + torch.log(row_sum)).squeeze(-1)
    p = torch.exp(s - (lse + lse_bias)[..., None])
    delta = (dout * out).sum(-1, keepdim=True)
    ds = p * (torch.bmm(dout, v.transpose(1, 2)) - delta)
    dq = torch.bmm(ds, k) * scale
    dk = torch.bmm(ds.transpose(1, 2), q) * scale
    dv = torch.bmm(p.transpose(1, 2), dout)
    back = lambda x: x.transpose(0, 1)[None]  # noqa: E731
    return back(out), lse[None], back(dq), back(dk), back(dv)


def _case(offset, mode):
    return AttentionCase(seqlen_q=64, seqlen_k=48, num_heads=2, head_dim=32, dtype="float32", backward=True,
                         score_offset=offset, score_offset_mode=mode, seed=5)


def _verdict(case, lse_bias=0.0):
    inputs = make_inputs(case)
    ref = reference(case, inputs)
    out, lse, dq, dk, dv = flash_style_fp32(inputs.q, inputs.k, inputs.v, inputs.dout, case.softmax_scale, lse_bias)
    return ref, compare_outputs(case, ref, out=out, lse=lse, dq=dq, dk=dk, dv=dv)


@pytest.mark.parametrize("offset, mode", [(250.0, "head"), (-250.0, "head"), (250.0, "row"), (-250.0, "row")])
def test_a_correct_float32_kernel_passes_with_row_lse_at_250(offset, mode):
    ref, verdict = _verdict(_case(offset, mode))
    finite = ref.lse[torch.isfinite(ref.lse)]
    assert float(finite.abs().max()) > 200  # the case really puts lse far from 0
    assert verdict.passed, verdict.to_json()
    assert verdict.error_ratio < 0.5


@pytest.mark.parametrize("offset, mode", [(250.0, "head"), (-250.0, "row")])
def test_a_normalisation_error_just_above_the_allowance_is_caught(offset, mode):
    case = _case(offset, mode)
    # the gradient errors grow linearly with the planted bias: measure them at a bias well above
    # rounding, then plant the bias that puts the worst gradient at ~1.3x its allowance
    _, probe = _verdict(case, lse_bias=1e-3)
    ratio = max(probe.tensors[n].error_ratio for n in ("dq", "dk", "dv"))
    assert math.isfinite(ratio) and ratio > 1
    bias = 1e-3 * 1.3 / ratio
    assert bias < 64 * 2.0**-16  # < 64 ulps of an fp32 lse of 250 (ulp 2**-16): a rounding-sized defect
    _, caught = _verdict(case, lse_bias=bias)
    assert not caught.passed
    assert {"dk:mismatch", "dv:mismatch", "dk:tile_mismatch", "dv:tile_mismatch"} & set(caught.signatures)
    assert 1.0 < caught.error_ratio < 1.6
    _, below = _verdict(case, lse_bias=bias * 0.5)  # half of it is inside the allowance
    assert below.passed, below.to_json()


# The cases on which the float32 stand-in of the worker tests failed dq before the normalisation
# term (tests/fuzzer/test_worker.py, seed 1): 1-2 keys per row, lse up to -190 nats.
WORKER_CASE = dict(batch_size=1, seqlen_q=4, seqlen_k=2, num_heads=4, num_heads_kv=1, head_dim=8, dtype="float32",
                   causal=True, causal_alignment="bottom_right", backward=True, seed=106,
                   score_offset=242.86479112897177, score_offset_mode="row")


@pytest.mark.parametrize("distribution", ["normal", "large_logits"])
def test_the_float32_standin_passes_on_the_worker_cases_and_needs_the_normalisation_term(distribution, monkeypatch):
    from tests.fuzzer.standins import CorrectBackend
    import oracle.reference as oracle_reference

    case = AttentionCase(input_distribution=distribution, **WORKER_CASE)
    inputs = make_inputs(case)
    got = CorrectBackend().run(case, inputs, "native")

    def judge():
        ref = reference(case, inputs)
        return compare_outputs(case, ref, out=got.out, lse=got.lse, dq=got.dq, dk=got.dk, dv=got.dv)

    verdict = judge()
    assert verdict.passed, verdict.to_json()
    assert verdict.tensors["dq"].error_ratio < 0.5
    # without the term the same correct dq fails: the test exercises it
    monkeypatch.setattr(oracle_reference, "normalisation_error_scale", lambda *, rho, delta, lse, keys: 0 * delta)
    assert judge().tensors["dq"].error_ratio > 1
