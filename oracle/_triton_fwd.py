"""Optional float64 attention forward on CUDA with Triton: the ``engine="triton"`` of `oracle.reference`.

`oracle.reference` uses it for the forward when the tensors are on CUDA, Triton imports, the case
is bshd/sbhd and the CUDA DMMA engine (`oracle._cuda_fwd`) cannot run (``engine="auto"``), falling
back to the torch path on any exception (recorded in ``oracle.reference.triton_fallback_error``); the backward always runs on the torch path. Both
variants compute what the torch path computes, in float64 throughout, on the same grouped layout
(`oracle._dense.Dense`: rows ordered (token, group), q pre-multiplied by softmax_scale), so GQA,
``head_dim_v``, softcap, windows and both alignments come for free: the mask is the per-row
``[lo, hi)`` of `oracle.masks.key_bounds`, and only key blocks inside ``[min lo, max hi)`` of a
block's rows are visited.

* ``fused``: one FlashAttention-style kernel, ``tl.dot`` on float64 (DMMA ``m8n8k4`` on sm80+, which
  an H200 runs at half its float64 tensor rate: on sm_90 `oracle._cuda_fwd` comes first).
  Each program handles ``BLOCK_M`` grouped rows of one (batch, kv head). When the softmax shift is
  known in advance (`oracle._dense.shift_bound`, an upper bound of every score of the row) the
  loop needs no running maximum and no rescaling; otherwise it runs the online softmax.
* ``hybrid``: cuBLAS float64 gemms for ``q k^T`` and ``P v`` per query block, with one Triton pass
  in between (softcap, mask, ``exp(s - shift)``, row sums of ``p`` and ``p**2``, in place).

Measured on an H200 (b4 s4096 h16 causal, bf16 inputs, with error scales, ms): head_dim 64: fused
9.3, hybrid 11.3, torch 16.1; head_dim 128: fused 13.1, hybrid 13.9, torch 18.8; head_dim 256
(b2): fused 18.5, hybrid 11.3, torch 14.2. `default_variant` picks accordingly. The fused kernel
reaches about 21 TFLOP/s of float64 at head_dim 128 (DMMA peak is about 67).

Source: Dao, "FlashAttention-2", arXiv:2307.08691, Algorithm 1 (online softmax with rescaling by
``exp(m_old - m_new)``); the running sum of ``p**2`` (for ``||P_i||``) is rescaled by the square
of the same factor.
"""

from __future__ import annotations

import os

import torch

from oracle._dense import SAFE_SHIFT_BOUND, forward_scales, shift_bound
from oracle._dense import dense_forward as torch_dense_forward

try:  # Triton is optional: without it `unsupported_reason` says so and the torch path runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None

MAX_HEAD_DIM = 256


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def unsupported_reason(case, q: torch.Tensor) -> str | None:
    """None when the fused kernel can run ``case`` on ``q``'s device, else why not."""
    if triton is None:
        return "triton is not installed"
    if case.is_varlen:
        return "qkv_format thd is not supported by the Triton forward"
    if q.device.type != "cuda" and not _interpreting():
        return f"tensors are on {q.device.type}, not CUDA (set TRITON_INTERPRET=1 to interpret on CPU)"
    if max(case.head_dim, case.head_dim_v) > MAX_HEAD_DIM:
        return f"head_dim {max(case.head_dim, case.head_dim_v)} > {MAX_HEAD_DIM}"
    return None


if triton is not None:

    @triton.jit
    def _tanh(x):
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)

    @triton.jit
    def _attention_forward_f64(
        Q, K, V, LO, HI, OUT, LSE, PNORM, SOFTCAP, SHIFT,
        rows_total, seqlen_k, group,
        HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_SOFTCAP: tl.constexpr, SHIFT_GIVEN: tl.constexpr,
    ):
        """One block of rows; with ``SHIFT_GIVEN`` the softmax shift is a known upper bound of the
        row's scores (`oracle._dense.shift_bound`) and no running maximum or rescaling is needed."""
        pid_m = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < rows_total
        token = rows // group
        lo = tl.load(LO + token, mask=row_ok, other=0)
        hi = tl.load(HI + token, mask=row_ok, other=0)
        nonempty = row_ok & (lo < hi)
        key_start = tl.min(tl.where(nonempty, lo, seqlen_k), axis=0)
        key_end = tl.max(tl.where(nonempty, hi, 0), axis=0)
        key_start = (key_start // BLOCK_N) * BLOCK_N

        d = tl.arange(0, BLOCK_D)
        dv = tl.arange(0, BLOCK_DV)
        q_ptrs = Q + bh * rows_total * HEAD_DIM + rows[:, None] * HEAD_DIM + d[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)

        if SHIFT_GIVEN:
            shift = tl.load(SHIFT + bh * rows_total + rows, mask=row_ok, other=0.0)
        m_i = tl.full([BLOCK_M], -float("inf"), tl.float64)
        l_i = tl.zeros([BLOCK_M], tl.float64)
        l2_i = tl.zeros([BLOCK_M], tl.float64)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float64)
        k_base = K + bh * seqlen_k * HEAD_DIM
        v_base = V + bh * seqlen_k * HEAD_DIM_V
        for start_n in range(key_start, key_end, BLOCK_N):
            cols = start_n + tl.arange(0, BLOCK_N)
            col_ok = cols < seqlen_k
            k = tl.load(k_base + cols[:, None] * HEAD_DIM + d[None, :],
                        mask=col_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
            s = tl.dot(q, tl.trans(k))
            if HAS_SOFTCAP:
                softcap = tl.load(SOFTCAP)  # float64 (a Python float argument would arrive as fp32)
                s = softcap * _tanh(s / softcap)
            visible = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
            s = tl.where(visible, s, -float("inf"))
            v = tl.load(v_base + cols[:, None] * HEAD_DIM_V + dv[None, :],
                        mask=col_ok[:, None] & (dv[None, :] < HEAD_DIM_V), other=0.0)
            if SHIFT_GIVEN:
                p = tl.exp(s - shift[:, None])
                l_i += tl.sum(p, axis=1)
                l2_i += tl.sum(p * p, axis=1)
                acc += tl.dot(p, v)
            else:
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_use = tl.where(m_new == -float("inf"), 0.0, m_new)  # rows with nothing visible yet
                p = tl.exp(s - m_use[:, None])
                alpha = tl.exp(m_i - m_use)
                l_i = l_i * alpha + tl.sum(p, axis=1)
                l2_i = l2_i * (alpha * alpha) + tl.sum(p * p, axis=1)
                acc = acc * alpha[:, None] + tl.dot(p, v)
                m_i = m_new

        empty = l_i == 0.0
        l_safe = tl.where(empty, 1.0, l_i)
        out = acc / l_safe[:, None]
        if SHIFT_GIVEN:
            lse = tl.where(empty, -float("inf"), shift + tl.log(l_safe))
        else:
            lse = tl.where(empty, -float("inf"), m_i + tl.log(l_safe))
        out_ptrs = OUT + bh * rows_total * HEAD_DIM_V + rows[:, None] * HEAD_DIM_V + dv[None, :]
        tl.store(out_ptrs, out, mask=row_ok[:, None] & (dv[None, :] < HEAD_DIM_V))
        tl.store(LSE + bh * rows_total + rows, lse, mask=row_ok)
        tl.store(PNORM + bh * rows_total + rows, tl.sqrt(l2_i) / l_safe, mask=row_ok)

    @triton.jit
    def _exp_rows_f64(
        S, SHIFT, LO, HI, ROWSUM, ROWSUMSQ, SOFTCAP,
        num_rows, num_cols, first_token, first_key, group,
        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    ):
        """In place on a score block ``S [BHkv, num_rows, num_cols]``: ``p = exp(s - shift)`` on
        visible entries (softcap applied to ``s`` first when given), 0 on masked ones; writes the
        row sums of ``p`` and ``p**2``. One read and one write of ``S``."""
        pid_r = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        row_ok = rows < num_rows
        token = first_token + rows // group
        lo = tl.load(LO + token, mask=row_ok, other=0)
        hi = tl.load(HI + token, mask=row_ok, other=0)
        shift = tl.load(SHIFT + bh * num_rows + rows, mask=row_ok, other=0.0)
        if HAS_SOFTCAP:
            softcap = tl.load(SOFTCAP)
        row_sum = tl.zeros([BLOCK_R], tl.float64)
        row_sumsq = tl.zeros([BLOCK_R], tl.float64)
        base = S + bh * num_rows * num_cols
        # A reduction makes the bound 0-d: Triton 3.6's interpreter passes scalars as 1-d arrays,
        # which `range` cannot take.
        col_end = tl.max(tl.full([1], num_cols, tl.int32), axis=0)
        for c0 in range(0, col_end, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            inside = row_ok[:, None] & (cols[None, :] < num_cols)
            ptrs = base + rows[:, None].to(tl.int64) * num_cols + cols[None, :]
            s = tl.load(ptrs, mask=inside, other=0.0)
            if HAS_SOFTCAP:
                s = softcap * _tanh(s / softcap)
            s = s - shift[:, None]
            key = first_key + cols
            visible = inside & (key[None, :] >= lo[:, None]) & (key[None, :] < hi[:, None])
            p = tl.where(visible, tl.exp(s), 0.0)
            tl.store(ptrs, p, mask=inside)
            row_sum += tl.sum(p, axis=1)
            row_sumsq += tl.sum(p * p, axis=1)
        tl.store(ROWSUM + bh * num_rows + rows, row_sum, mask=row_ok)
        tl.store(ROWSUMSQ + bh * num_rows + rows, row_sumsq, mask=row_ok)


def _config(head_dim: int, head_dim_v: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)``; override with ``ATTNFUZZ_TRITON_CONFIG=M,N,W,S``."""
    override = os.environ.get("ATTNFUZZ_TRITON_CONFIG")
    if override:
        block_m, block_n, warps, stages = (int(x) for x in override.split(","))
        return block_m, block_n, warps, stages
    # Measured on an H200 (b4 s4096 h16 causal; configs that spill registers excluded).
    if max(head_dim, head_dim_v) <= 64:
        return 32, 32, 4, 2
    if max(head_dim, head_dim_v) <= 128:
        return 32, 64, 8, 2
    return 16, 16, 4, 2


VARIANTS = ("hybrid", "fused")


def default_variant(head_dim: int, head_dim_v: int) -> str:
    """The faster variant on an H200 (b4 s4096 h16 causal, ms with error scales): head_dim 64:
    fused 9.3, hybrid 11.3; 128: fused 13.1, hybrid 13.9; 256: fused 18.5, hybrid 11.3."""
    return "fused" if max(head_dim, head_dim_v) <= 128 else "hybrid"


@torch.no_grad()
def dense_forward(d, want_scales: bool, variant: str | None = None) -> dict[str, torch.Tensor]:
    """The Triton forward of one `oracle._dense.Dense`: same outputs as `oracle._dense.dense_forward`.

    Args:
        d: the prepared batch (grouped float64 layout).
        want_scales: also return the error scales.
        variant: ``"hybrid"`` (float64 cuBLAS gemms for ``q k^T`` and ``P v`` around one fused
            Triton pass for mask, softcap, exp and row sums) or ``"fused"`` (one flash-attention
            kernel with ``tl.dot`` on float64); default ``ATTNFUZZ_TRITON_VARIANT`` or
            `default_variant`.

    Raises:
        RuntimeError: Triton is missing or a launch fails (the caller falls back to torch).
    """
    if triton is None:
        raise RuntimeError("triton is not installed")
    variant = variant or os.environ.get("ATTNFUZZ_TRITON_VARIANT") or default_variant(d.q.shape[-1], d.v.shape[-1])
    if variant not in VARIANTS:
        raise RuntimeError(f"unknown Triton variant {variant!r}, expected one of {VARIANTS}")
    if variant == "fused":
        out, lse, p_norm = _fused_forward(d)
    else:
        result = _hybrid_forward(d)
        if result is None:  # scores too large for the bound shift: the torch path's exact maximum
            return torch_dense_forward(d, want_scales)
        out, lse, p_norm = result
    result = {"out": out, "lse": lse}
    if want_scales:
        result.update(forward_scales(d, out, lse, p_norm))
    return result


def _softcap_tensor(d, device) -> torch.Tensor:
    # A Python float kernel argument would arrive as fp32; a one-element float64 tensor does not.
    return torch.tensor([d.softcap if d.softcap is not None else 1.0], dtype=torch.float64, device=device)


def _fused_forward(d):
    bound = shift_bound(d).contiguous()
    shift_given = not d.blocks or float(bound.max()) <= SAFE_SHIFT_BOUND
    bh, rows_total, head_dim = d.q.shape
    head_dim_v = d.v.shape[-1]
    q, k, v = d.q.contiguous(), d.k.contiguous(), d.v.contiguous()
    out = torch.empty(bh, rows_total, head_dim_v, dtype=torch.float64, device=q.device)
    lse = torch.empty(bh, rows_total, dtype=torch.float64, device=q.device)
    p_norm = torch.empty(bh, rows_total, dtype=torch.float64, device=q.device)
    block_m, block_n, warps, stages = _config(head_dim, head_dim_v)
    grid = (triton.cdiv(rows_total, block_m), bh)
    _attention_forward_f64[grid](
        q, k, v, d.lo.contiguous(), d.hi.contiguous(), out, lse, p_norm, _softcap_tensor(d, q.device), bound,
        rows_total, d.seqlen_k, d.group,
        HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_DV=max(16, triton.next_power_of_2(head_dim_v)),
        BLOCK_M=block_m, BLOCK_N=block_n, HAS_SOFTCAP=d.softcap is not None, SHIFT_GIVEN=shift_given,
        num_warps=warps, num_stages=stages,
    )
    return out, lse, p_norm


def _hybrid_forward(d):
    """cuBLAS float64 gemms plus one Triton pass per block; None if the shift bound is unsafe."""
    bound = shift_bound(d)
    if d.blocks and float(bound.max()) > SAFE_SHIFT_BOUND:
        return None
    bh, rows_total, _ = d.q.shape
    device = d.q.device
    out = torch.zeros(bh, rows_total, d.v.shape[-1], dtype=torch.float64, device=device)
    lse = torch.full((bh, rows_total), -float("inf"), dtype=torch.float64, device=device)
    p_norm = torch.zeros(bh, rows_total, dtype=torch.float64, device=device)
    softcap = _softcap_tensor(d, device)
    lo, hi = d.lo.contiguous(), d.hi.contiguous()
    for blk in d.blocks:
        if blk.empty:
            continue
        r0, r1 = blk.i0 * d.group, blk.i1 * d.group
        k_t = d.k[:, blk.j0 : blk.j1].transpose(1, 2)
        shift = bound[:, r0:r1].contiguous()
        scores = torch.bmm(d.q[:, r0:r1], k_t)  # (baddbmm with a broadcast shift costs two more passes)
        num_rows, num_cols = scores.shape[1], scores.shape[2]
        row_sum = torch.empty(bh, num_rows, dtype=torch.float64, device=device)
        row_sumsq = torch.empty_like(row_sum)
        grid = (triton.cdiv(num_rows, EXP_BLOCK_ROWS), bh)
        _exp_rows_f64[grid](
            scores, shift, lo, hi, row_sum, row_sumsq, softcap,
            num_rows, num_cols, blk.i0, blk.j0, d.group,
            BLOCK_R=EXP_BLOCK_ROWS, BLOCK_C=EXP_BLOCK_COLS, HAS_SOFTCAP=d.softcap is not None, num_warps=4,
        )
        denominator = torch.where(row_sum > 0, row_sum, 1.0)
        out[:, r0:r1] = torch.bmm(scores, d.v[:, blk.j0 : blk.j1]).div_(denominator[..., None])
        lse[:, r0:r1] = shift + row_sum.log()
        p_norm[:, r0:r1] = row_sumsq.sqrt().div_(denominator)
    return out, lse, p_norm


EXP_BLOCK_ROWS = 4
EXP_BLOCK_COLS = 256


__all__ = ["MAX_HEAD_DIM", "VARIANTS", "default_variant", "dense_forward", "unsupported_reason"]
