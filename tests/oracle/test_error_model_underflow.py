"""The float16 underflow term of the error model (`oracle.reference.underflow_floor`).

A kernel that rounds P and dS to float16 (FlashAttention's design, PyTorch's CPU flash kernel)
makes an absolute error of up to 2**-25 on every probability below 2**-14; with a large dout the
gradient of a key with such a probability is in the normal range, so a relative-only model failed
correct kernels (bucket ``torch-cpu-flash / is_causal / dv:tile_mismatch``, minimised to the case
below: P of key 64 ~3.5e-7, a single-row tile).
"""

from __future__ import annotations

import pytest
import torch

import oracle.reference as reference_module
from oracle.calibration import emulated_flash_attention
from oracle.compare import compare_outputs
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import reference


def _case(seed: int) -> AttentionCase:
    return AttentionCase(
        seqlen_q=1, seqlen_k=65, head_dim=64, dtype="float16", qkv_format="sbhd", softmax_scale=0.587,
        dout_distribution="large", seed=seed,
    )


def _judge(case, outputs):
    return compare_outputs(case, reference(case, make_inputs(case)), **outputs)


def test_a_correct_float16_kernel_with_p_rounded_to_float16_passes_on_the_minimised_case():
    case = _case(0)
    verdict = _judge(case, emulated_flash_attention(case, make_inputs(case)))
    assert verdict.passed, verdict.signatures
    assert verdict.tensors["dv"].error_ratio < 0.5


def test_without_the_underflow_term_the_correct_kernel_fails_dv_on_that_tile(monkeypatch):
    monkeypatch.setattr(reference_module, "underflow_floor", lambda dtype: 0.0)
    case = _case(0)
    verdict = _judge(case, emulated_flash_attention(case, make_inputs(case)))
    assert "dv:tile_mismatch" in verdict.signatures
    assert verdict.tensors["dv"].worst_index[1] == 64  # the single-row tile of key 64


@pytest.mark.parametrize("name", ["dv", "dk"])
def test_a_few_ulps_concentrated_in_the_single_row_tile_are_still_caught(name):
    case = _case(2)  # P of key 64 is ~0.009, in float16's normal range: the term does not apply
    outputs = emulated_flash_attention(case, make_inputs(case))
    assert _judge(case, outputs).passed
    planted = outputs[name].clone()
    row = planted[0, 64].float()
    planted[0, 64] = (row * (1 + 6 * 2.0**-10)).to(planted.dtype)  # 6 to 12 ulps on key row 64 only
    verdict = _judge(case, outputs | {name: planted})
    tensor = verdict.tensors[name]
    assert f"{name}:tile_mismatch" in verdict.signatures, tensor
    assert tensor.worst_index[1] == 64
    assert torch.equal(planted[0, :64], outputs[name][0, :64])
