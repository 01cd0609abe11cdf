"""Tests of `oracle._cuda_fwd`, the optional float64 DMMA forward, against the torch path."""

from __future__ import annotations

import pytest
import torch

import oracle.reference
from oracle import _cuda_fwd, _triton_fwd
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from oracle.reference import ReferenceInputError, reference

FLOAT64_CLOSE = dict(rtol=1e-10, atol=1e-12)
# The error scales (a tolerance, not a verdict) compare looser: in float16 their underflow floor
# max(|x|, 2**-14) keeps an entry that is exactly 0 at 0 (`oracle.reference.underflow_floor`), so
# a dS that is 0 in one engine's float64 and 1e-17 in the other's (one visible key: dS = dP - D,
# which cancels) moves a row's scale by the floor. Seen on the H200 on 2026-12-03 at 24321c7:
# 3.6e-6 relative at one entry of fields3 and fields9, float16 with backward.
SCALES_CLOSE = dict(rtol=1e-4, atol=1e-12)
H100_MAX_DYNAMIC_SMEM_BYTES = 227 * 1024  # cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90

CASES = [
    dict(causal=True, causal_alignment="bottom_right", seqlen_q=37, seqlen_k=20),
    dict(window_size_left=5, window_size_right=3, seqlen_q=50, seqlen_k=70, causal_alignment="bottom_right"),
    dict(num_heads=4, num_heads_kv=2, head_dim_v=24, softcap=2.7, causal=True, seqlen_q=70, seqlen_k=50),
    dict(num_heads=6, num_heads_kv=1, head_dim=20, seqlen_q=70, seqlen_k=30, window_size_left=3, window_size_right=0),
    dict(seqlen_q=1000, seqlen_k=1000, head_dim=128, causal=True),
    dict(seqlen_q=300, seqlen_k=900, head_dim=96, head_dim_v=64),
    dict(seqlen_q=129, seqlen_k=257, head_dim=72, head_dim_v=128, num_heads=8, num_heads_kv=2),
    dict(seqlen_q=200, seqlen_k=200, input_distribution="large_logits", softcap=30.0),
    dict(seqlen_q=200, seqlen_k=200, input_distribution="large_logits"),  # shift bound unsafe: online max
    dict(seqlen_q=1, seqlen_k=1, head_dim=8, causal=True),
    dict(seqlen_q=64, seqlen_k=3, head_dim=64, causal=True),  # top-left causal: rows past the keys
]


def test_cuda_engine_says_why_it_cannot_run_on_cpu():
    case = AttentionCase(seqlen_q=4, seqlen_k=4, head_dim=8)
    assert "not CUDA" in _cuda_fwd.unsupported_reason(case, torch.zeros(1))
    with pytest.raises(ReferenceInputError, match="engine='cuda'"):
        reference(case, make_inputs(case), engine="cuda")


def test_cuda_engine_refuses_head_dim_above_its_register_budget():
    assert "head_dim 256 > 128" in _cuda_fwd.unsupported_reason(AttentionCase(head_dim=256), torch.zeros(1))
    assert "head_dim 160 > 128" in _cuda_fwd.unsupported_reason(AttentionCase(head_dim_v=160), torch.zeros(1))
    thd = AttentionCase(batch_size=2, seqlen_q=3, seqlen_k=3, qkv_format="thd", head_dim=8)
    assert "thd" in _cuda_fwd.unsupported_reason(thd, torch.zeros(1))


@pytest.mark.parametrize("head_dim, head_dim_v", [(8, 8), (64, 64), (128, 128), (72, 128), (128, 24)])
def test_default_tile_fits_hopper_shared_memory(head_dim, head_dim_v):
    config = _cuda_fwd._config()
    assert _cuda_fwd.smem_bytes(head_dim, head_dim_v, config) * config.min_blocks <= H100_MAX_DYNAMIC_SMEM_BYTES
    assert config.block_n % 16 == 0  # P @ V consumes the score tile in k16 chunks


def test_a_failing_cuda_forward_falls_back_and_is_recorded(monkeypatch):
    def broken(dense, want_scales):
        raise RuntimeError("planted NVRTC failure")

    monkeypatch.setattr(oracle.reference, "TRITON_AUTO_DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(oracle.reference, "cuda_fallback_error", None)
    monkeypatch.setattr(_cuda_fwd, "unsupported_reason", lambda case, q: None)
    monkeypatch.setattr(_cuda_fwd, "dense_forward", broken)
    monkeypatch.setattr(_triton_fwd, "unsupported_reason", lambda case, q: "planted: no triton")
    case = AttentionCase(seqlen_q=5, seqlen_k=5, head_dim=8, causal=True)
    inputs = make_inputs(case)
    result = reference(case, inputs)
    assert result.engine == "torch"
    assert "planted NVRTC failure" in oracle.reference.cuda_fallback_error
    torch.testing.assert_close(result.out, reference(case, inputs, engine="torch").out, **FLOAT64_CLOSE)


def test_engine_cuda_raises_instead_of_falling_back(monkeypatch):
    def broken(dense, want_scales):
        raise RuntimeError("planted NVRTC failure")

    monkeypatch.setattr(_cuda_fwd, "unsupported_reason", lambda case, q: None)
    monkeypatch.setattr(_cuda_fwd, "dense_forward", broken)
    case = AttentionCase(seqlen_q=5, seqlen_k=5, head_dim=8)
    with pytest.raises(RuntimeError, match="planted NVRTC failure"):
        reference(case, make_inputs(case), engine="cuda")


def _cuda_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    return _cuda_fwd.unsupported_reason(AttentionCase(head_dim=64), torch.zeros(1, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("backward", [True, False], ids=["dense-with-backward", "direct-forward-only"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("fields", CASES)
def test_cuda_forward_matches_the_torch_path(fields, dtype, backward):
    """Both CUDA paths: with backward the forward runs on the grouped float64 copies
    (`dense_forward`); forward only, straight on the inputs in their own dtype (`direct_forward`)."""
    reason = _cuda_reason()
    if reason:
        pytest.skip(reason)
    case = AttentionCase(**{"batch_size": 2, "num_heads": 2, "head_dim": 32, "backward": backward,
                            "dtype": dtype, **fields})
    inputs = make_inputs(case, "cuda")
    fast, plain = reference(case, inputs), reference(case, inputs, engine="torch")
    assert fast.engine == "cuda", oracle.reference.cuda_fallback_error
    assert torch.equal(torch.isinf(fast.lse), torch.isinf(plain.lse))  # the same rows see no key
    for name in ("out", "lse", "dq", "dk", "dv") if backward else ("out", "lse"):
        torch.testing.assert_close(getattr(fast, name), getattr(plain, name), **FLOAT64_CLOSE)
    assert set(fast.error_scales) == set(plain.error_scales)
    for name, scale in plain.error_scales.items():
        torch.testing.assert_close(fast.error_scales[name], scale, **SCALES_CLOSE)


@pytest.mark.gpu
def test_direct_forward_reads_strided_sbhd_views():
    """An sbhd tensor handed over as a bshd view (batch stride 1 token row) gives the same result."""
    reason = _cuda_reason()
    if reason:
        pytest.skip(reason)
    case = AttentionCase(batch_size=3, seqlen_q=70, seqlen_k=90, num_heads=4, num_heads_kv=2, head_dim=64,
                         causal=True, backward=False)
    inputs = make_inputs(case, "cuda")
    views = [x.transpose(0, 1).contiguous().transpose(0, 1) for x in (inputs.q, inputs.k, inputs.v)]
    assert not views[0].is_contiguous()
    strided = reference(case, type(inputs)(q=views[0], k=views[1], v=views[2], dout=inputs.dout))
    plain = reference(case, inputs, engine="torch")
    assert strided.engine == "cuda", oracle.reference.cuda_fallback_error
    torch.testing.assert_close(strided.out, plain.out, **FLOAT64_CLOSE)
    torch.testing.assert_close(strided.lse, plain.lse, **FLOAT64_CLOSE)


@pytest.mark.gpu
@pytest.mark.parametrize("fields", [CASES[2], CASES[6], CASES[4]])
def test_the_online_maximum_matches_the_torch_path(fields, monkeypatch):
    """``ATTNFUZZ_CUDA_SHIFT=0``: the online maximum in every warp instead of the score bound."""
    reason = _cuda_reason()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("ATTNFUZZ_CUDA_SHIFT", "0")
    case = AttentionCase(**{"batch_size": 2, "num_heads": 2, "head_dim": 32, "backward": False, **fields})
    inputs = make_inputs(case, "cuda")
    fast, plain = reference(case, inputs), reference(case, inputs, engine="torch")
    assert fast.engine == "cuda", oracle.reference.cuda_fallback_error
    torch.testing.assert_close(fast.out, plain.out, **FLOAT64_CLOSE)
    torch.testing.assert_close(fast.lse, plain.lse, **FLOAT64_CLOSE)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("head_dim", [24, 7], ids=["4-element-loads", "scalar-loads"])
def test_kv_float64_copies_exactly_and_takes_the_largest_row_norm(dtype, head_dim):
    reason = _cuda_reason()
    if reason:
        pytest.skip(reason)
    x = torch.randn(3, 40, 2, 5, head_dim, device="cuda").to(dtype)[:, :, 1]  # strided [B, S, H, D] view
    x64, norm_max = _cuda_fwd._kv_float64(x, 32)
    assert x64.dtype == torch.float64 and x64.is_contiguous() and x64.shape == (*x.shape[:3], 32)
    assert torch.equal(x64[..., :head_dim], x.to(torch.float64))
    assert bool((x64[..., head_dim:] == 0).all())  # the padding the kernel copies in 16-byte chunks
    want = torch.linalg.vector_norm(x.to(torch.float64), dim=-1).amax(dim=1)
    torch.testing.assert_close(norm_max, want, rtol=1e-14, atol=0)


def test_launch_refuses_k_v_rows_that_are_not_zero_padded():
    """The kernel copies K/V rows in 16-byte chunks of D_PAD / DV_PAD float64 without a column
    check: a k or v that is not padded (or not 16-byte aligned) must be refused before any launch."""
    q = torch.zeros(1, 4, 1, 20, dtype=torch.bfloat16)
    k_unpadded = torch.zeros(1, 4, 1, 20, dtype=torch.float64)  # D_PAD of 20 is 32
    v = torch.zeros(1, 4, 1, 24, dtype=torch.float64)  # DV_PAD of 24 is 24
    common = dict(batch=1, num_heads_kv=1, group=1, seqlen_q=4, seqlen_k=4, head_dim_v=24,
                  q_strides=(80, 20, 20, 20), v_strides=(96, 24, 24), out=None, o_strides=(0, 0, 0, 0), lse=None,
                  l_strides=(0, 0, 0, 0), rows_shape=(1, 4, 1), r_strides=(0, 0, 0, 0), k_max=None, scale=1.0,
                  softcap=None)
    lo, hi = torch.zeros(4, dtype=torch.int64), torch.full((4,), 4, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="k must have 16-byte aligned rows of 32 float64"):
        _cuda_fwd._launch(q, k_unpadded, v, lo, hi, k_strides=(80, 20, 20), **common)
    k_padded = _cuda_fwd._padded_rows(k_unpadded, 32)
    assert k_padded.shape[-1] == 32 and bool((k_padded[..., 20:] == 0).all())
    odd_rows = torch.zeros(1, 4, 1, 25, dtype=torch.float64)[..., :24]  # row stride 25: not 16-byte aligned
    with pytest.raises(RuntimeError, match="v must have 16-byte aligned rows of 24 float64"):
        _cuda_fwd._launch(q, k_padded, odd_rows, lo, hi, k_strides=(128, 32, 32),
                          **{**common, "v_strides": (100, 25, 25)})
