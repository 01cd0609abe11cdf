"""Float64 attention forward and backward: the oracle every kernel output and gradient is judged by.

Semantics (the conventions are those of `oracle.config`; the mask is `oracle.masks.key_bounds`):

* ``s = (q . k^T) * softmax_scale``; with ``softcap``: ``s = softcap * tanh(s / softcap)``; keys
  outside ``[lo[i], hi[i])`` are masked (``-inf``) *after* the softcap.
* ``lse[i] = log(sum_j exp(s[i, j]))`` (natural log), ``P = exp(s - lse)``, ``out = P v``.
* GQA/MQA: query head ``h`` reads kv head ``h // group_size``; ``dk``/``dv`` sum over the group.
* thd: every sequence is attended separately with its own lengths and bottom-right offset.
* **Empty rows** (no visible key): ``out = 0``, ``lse = -inf`` and their contribution to every
  gradient is 0 (``dq = 0``). This is the limit of a row whose keys all have score ``-> -inf``,
  and what FlashAttention returns for ``out`` ("If the row of the mask is all zero, the output
  will be zero", FA2 README); what kernels return for their ``lse`` varies and is judged in
  `oracle.compare`.

Backward (for a given ``dout``): ``D = rowsum(dout * out)``, ``dP = dout v^T``,
``dS = P * (dP - D)`` (times ``1 - tanh^2(s_raw / softcap)`` with a softcap),
``dq = softmax_scale * dS k``, ``dk = softmax_scale * dS^T q``, ``dv = P^T dout``.
Source: Dao, "FlashAttention-2", arXiv:2307.08691, Algorithm 2 (backward pass), lines 11-16;
the recomputation of ``P`` from the stored logsumexp is its Section 3.1.2 / Algorithm 1 line 12.

Implementation: everything is float64 on the inputs' device (float64 matmuls never use TF32 or
reduced-precision reductions; ``torch.backends.cuda.matmul.allow_tf32`` only affects float32, so
it is left untouched). Queries are processed in blocks of ``block_q`` rows for all batch*heads
at once, laid out as ``[batch_size * num_heads_kv, block_q * group_size, head_dim]`` so that each
kv head is one ``bmm`` operand (no ``repeat_interleave``). Each block computes scores only for the
key range ``[min lo, max hi)`` its rows can see (skipping fully masked key blocks halves causal
work) and applies the mask only to the edge columns that some row of the block cannot see. The
softmax shift is the Cauchy-Schwarz bound `shift_bound` (folded into the score gemm with
``baddbmm``) instead of the exact row maximum whenever that cannot underflow, which saves a pass.
Peak extra memory is ``O(batch_size * num_heads * block_q * seqlen_k)``, chosen from a memory
budget; never ``O(seqlen_q * seqlen_k)`` per head. On CUDA the forward runs by default in a
compiled kernel (``engine="auto"``): the float64 DMMA kernel of `oracle._cuda_fwd` on sm_90+, else
the Triton one of `oracle._triton_fwd`.

Error scales: besides the values, the reference returns for every output row a first-order
estimate of the rounding error a low-precision kernel commits there (``error_scales``; see
`ReferenceResult` and `oracle.compare`). They are cheap by-products of the same blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from oracle.config import AttentionCase, torch_dtype
from oracle.errors import AttnFuzzError
from oracle.inputs import AttentionInputs
from oracle.masks import key_bounds

ENGINES = ("auto", "torch", "triton", "cuda")
DEFAULT_MEMORY_BUDGET_BYTES = {"cpu": 256 * 2**20, "cuda": 2 * 2**30}
FLOAT32_UNIT_ROUNDOFF = 2.0**-24

# Device types on which engine="auto" tries the compiled forwards first (CUDA DMMA, then Triton).
TRITON_AUTO_DEVICE_TYPES = ("cuda",)
# Set when the Triton forward was tried and failed (the torch path was used instead): the text of
# the exception, for diagnostics; None when it never failed in this process.
triton_fallback_error: str | None = None
# Likewise for the CUDA DMMA forward (`oracle._cuda_fwd`; Triton or torch ran instead).
cuda_fallback_error: str | None = None


class ReferenceInputError(AttnFuzzError, ValueError):
    """The tensors handed to the reference do not match the case (shape, layout, device)."""


@dataclass
class ReferenceResult:
    """The float64 reference for one case.

    Attributes:
        out: ``[batch_size, seqlen_q, num_heads, head_dim_v] float64`` (thd:
            ``[total_q, num_heads, head_dim_v]``).
        lse: natural-log logsumexp, ``[batch_size, num_heads, seqlen_q] float64`` (thd:
            ``[num_heads, total_q]``); ``-inf`` on rows without a visible key.
        dq: like q, float64; None without backward.
        dk: like k, float64; None without backward.
        dv: like v, float64; None without backward.
        error_scales: per tensor name, the per-row error scale ``sigma`` (float64, the tensor's
            shape without its last dim; for ``lse`` its own shape): a kernel that rounds like
            FlashAttention (fp32 accumulation, ``P``/``dS`` and outputs rounded to the case dtype)
            is expected to err by about ``u * sigma`` in L2 norm over the row, ``u`` the unit
            roundoff of the tensor's dtype. Empty when not requested.
        engine: ``"torch"``, ``"triton"`` or ``"cuda"``: what computed the forward.
    """

    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    error_scales: dict[str, torch.Tensor] = field(default_factory=dict)
    engine: str = "torch"


# --------------------------------------------------------------------------- layout helpers
def _grouped_rows(x: torch.Tensor, num_heads_kv: int) -> torch.Tensor:
    """``[B, S, H, F]`` (any dtype) -> ``[B * Hkv, S * G, F] float64``, rows ordered (token, group)."""
    batch, seqlen, heads, feat = x.shape
    group = heads // num_heads_kv
    out = torch.empty(batch, num_heads_kv, seqlen, group, feat, dtype=torch.float64, device=x.device)
    out.copy_(x.reshape(batch, seqlen, num_heads_kv, group, feat).permute(0, 2, 1, 3, 4))
    return out.view(batch * num_heads_kv, seqlen * group, feat)


def _ungroup_rows(y: torch.Tensor, batch: int, seqlen: int, num_heads_kv: int) -> torch.Tensor:
    """Inverse of `_grouped_rows`: ``[B * Hkv, S * G, F]`` -> ``[B, S, H, F]`` (contiguous)."""
    feat = y.shape[-1]
    group = y.shape[1] // seqlen
    grouped = y.view(batch, num_heads_kv, seqlen, group, feat).permute(0, 2, 1, 3, 4)
    return grouped.reshape(batch, seqlen, num_heads_kv * group, feat)


def _ungroup_row_values(y: torch.Tensor, batch: int, seqlen: int, num_heads_kv: int, lse_layout: bool):
    """``[B * Hkv, S * G]`` -> ``[B, S, H]`` (or ``[B, H, S]`` with ``lse_layout``)."""
    group = y.shape[1] // seqlen
    grouped = y.view(batch, num_heads_kv, seqlen, group)
    if lse_layout:
        return grouped.permute(0, 1, 3, 2).reshape(batch, num_heads_kv * group, seqlen)
    return grouped.permute(0, 2, 1, 3).reshape(batch, seqlen, num_heads_kv * group)


def _kv_rows(x: torch.Tensor) -> torch.Tensor:
    """``[B, S, Hkv, F]`` -> ``[B * Hkv, S, F] float64``."""
    batch, seqlen, heads, feat = x.shape
    out = torch.empty(batch, heads, seqlen, feat, dtype=torch.float64, device=x.device)
    out.copy_(x.permute(0, 2, 1, 3))
    return out.view(batch * heads, seqlen, feat)


def _unkv_rows(y: torch.Tensor, batch: int) -> torch.Tensor:
    """Inverse of `_kv_rows`: ``[B * Hkv, S, F]`` -> ``[B, S, Hkv, F]`` (contiguous)."""
    _, seqlen, feat = y.shape
    return y.view(batch, -1, seqlen, feat).permute(0, 2, 1, 3).contiguous()


# --------------------------------------------------------------------------- block schedule
@dataclass(frozen=True)
class _Block:
    """Query rows ``[i0, i1)``; visible keys within ``[j0, j1)``; columns ``[j0, left_end)`` and
    ``[right_start, j1)`` need masking; ``empty``: the whole block sees no key."""

    i0: int
    i1: int
    j0: int
    j1: int
    left_end: int
    right_start: int
    empty: bool


def _schedule(lo: torch.Tensor, hi: torch.Tensor, block_q: int) -> list[_Block]:
    lo_list, hi_list = lo.tolist(), hi.tolist()
    blocks = []
    for i0 in range(0, len(lo_list), block_q):
        i1 = min(i0 + block_q, len(lo_list))
        rows = [(a, b) for a, b in zip(lo_list[i0:i1], hi_list[i0:i1]) if a < b]
        if not rows:
            blocks.append(_Block(i0, i1, 0, 0, 0, 0, True))
            continue
        j0, j1 = min(a for a, _ in rows), max(b for _, b in rows)
        left_end = min(max(max(lo_list[i0:i1]), j0), j1)
        right_start = max(min(min(hi_list[i0:i1]), j1), j0)
        blocks.append(_Block(i0, i1, j0, j1, left_end, right_start, False))
    return blocks


def _mask_edges(scores: torch.Tensor, blk: _Block, lo: torch.Tensor, hi: torch.Tensor, group: int) -> None:
    """Set masked entries of a ``[BHkv, nb * G, j1 - j0]`` score block to ``-inf``, in place."""
    nb = blk.i1 - blk.i0
    view = scores.view(scores.shape[0], nb, group, blk.j1 - blk.j0)
    device = scores.device
    if blk.left_end > blk.j0:
        cols = torch.arange(blk.j0, blk.left_end, device=device)
        hidden = cols[None, :] < lo[blk.i0 : blk.i1, None]
        view[..., : blk.left_end - blk.j0].masked_fill_(hidden[:, None, :], -math.inf)
    if blk.right_start < blk.j1:
        cols = torch.arange(blk.right_start, blk.j1, device=device)
        hidden = cols[None, :] >= hi[blk.i0 : blk.i1, None]
        view[..., blk.right_start - blk.j0 :].masked_fill_(hidden[:, None, :], -math.inf)


def choose_block_q(
    batch_size: int, num_heads: int, seqlen_q: int, seqlen_k: int, buffers: int, memory_budget_bytes: int
) -> int:
    """Query rows per block so that ``buffers`` float64 score blocks fit in the budget.

    Args:
        batch_size: sequences processed together.
        num_heads: query heads.
        seqlen_q: query rows, tokens.
        seqlen_k: keys, tokens (the widest a block can be).
        buffers: score-sized float64 buffers alive at once.
        memory_budget_bytes: the budget, bytes.

    Returns:
        ``block_q`` in ``[1, seqlen_q]``, a multiple of 64 when at least 64 fit.
    """
    per_row = buffers * batch_size * num_heads * max(seqlen_k, 1) * 8
    rows = max(1, memory_budget_bytes // per_row)
    if rows >= 64:
        rows = rows // 64 * 64
    return int(min(rows, seqlen_q))


# --------------------------------------------------------------------------- dense (equal-length) core
@dataclass
class _Dense:
    """One batch of equal-length sequences, in the grouped float64 layout.

    ``q`` is pre-multiplied by softmax_scale: ``[B*Hkv, Sq*G, D]``; ``k`` ``[B*Hkv, Sk, D]``; ``v``
    ``[B*Hkv, Sk, Dv]``; ``lo``/``hi`` ``[Sq] int64`` on the device.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    blocks: list[_Block]
    batch_size: int
    seqlen_q: int
    seqlen_k: int
    num_heads_kv: int
    group: int
    scale: float
    softcap: float | None
    rho: float  # float32 unit roundoff / unit roundoff of the case dtype
    # Smallest normal of the case dtype where rounding P and dS to it can underflow (float16,
    # 2**-14; `underflow_floor`), else 0: the backward's error scales then use max(|x|, tiny).
    underflow: float = 0.0


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1)


def shift_bound(d: _Dense) -> torch.Tensor:
    """An upper bound ``M_i >= max_j s_ij`` per grouped row, ``[BHkv, Sq*G]``: the Cauchy-Schwarz
    bound ``||q_i|| c max||k||``, or ``softcap`` if smaller. Since also ``s_ij >= -M_i``,
    ``exp(s_ij - M_i)`` of the largest score is ``>= exp(-2 M_i)``: with ``M_i <= SAFE_SHIFT_BOUND``
    neither it nor its square underflows, so ``M_i`` can replace the exact row maximum as the
    softmax shift (saving a pass over the scores and letting ``baddbmm`` subtract it)."""
    bound = _score_bound(d)
    return bound.clamp(max=d.softcap) if d.softcap is not None else bound


SAFE_SHIFT_BOUND = 170.0  # exp(-2 * 170)**2 ~ 1e-296 > the smallest normal float64


def _safe_blocks(d: _Dense, bound: torch.Tensor) -> list[bool]:
    """Per block: may `shift_bound` replace the exact row maximum (one device sync for all)."""
    if not d.blocks:
        return []
    per_block = torch.stack([bound[:, b.i0 * d.group : b.i1 * d.group].amax() for b in d.blocks])
    return (per_block <= SAFE_SHIFT_BOUND).tolist()


@torch.no_grad()
def _dense_forward(d: _Dense, want_scales: bool) -> dict[str, torch.Tensor]:
    """Forward over the blocks; returns grouped ``out [BHkv, Sq*G, Dv]``, ``lse [BHkv, Sq*G]``,
    and with ``want_scales`` the row norms of P (``p_norm``) and the error scales."""
    rows_total = d.seqlen_q * d.group
    bh = d.q.shape[0]
    out = torch.zeros(bh, rows_total, d.v.shape[-1], dtype=torch.float64, device=d.q.device)
    lse = torch.full((bh, rows_total), -math.inf, dtype=torch.float64, device=d.q.device)
    p_norm = torch.zeros(bh, rows_total, dtype=torch.float64, device=d.q.device) if want_scales else None
    bound = shift_bound(d)
    for blk, safe in zip(d.blocks, _safe_blocks(d, bound)):
        if blk.empty:
            continue
        r0, r1 = blk.i0 * d.group, blk.i1 * d.group
        k_t = d.k[:, blk.j0 : blk.j1].transpose(1, 2)
        shift = bound[:, r0:r1, None]
        if safe and d.softcap is None:
            scores = torch.baddbmm(shift.neg(), d.q[:, r0:r1], k_t)  # s - M_i in one gemm
            _mask_edges(scores, blk, d.lo, d.hi, d.group)
        else:
            scores = torch.bmm(d.q[:, r0:r1], k_t)
            if d.softcap is not None:
                scores.div_(d.softcap).tanh_().mul_(d.softcap)
            _mask_edges(scores, blk, d.lo, d.hi, d.group)  # before the maximum: only visible keys count
            if not safe:  # the exact row maximum; empty rows shift by 0
                shift = scores.amax(dim=-1, keepdim=True).nan_to_num_(neginf=0.0)
            scores.sub_(shift)
        probs = scores.exp_()
        row_sum = probs.sum(dim=-1, keepdim=True)  # 0 exactly for rows without a visible key
        denominator = torch.where(row_sum > 0, row_sum, 1.0)
        out[:, r0:r1] = torch.bmm(probs, d.v[:, blk.j0 : blk.j1]).div_(denominator)
        lse[:, r0:r1] = (shift + row_sum.log()).squeeze(-1)
        if want_scales:
            p_norm[:, r0:r1] = _row_norms(probs).div_(denominator.squeeze(-1))
    result = {"out": out, "lse": lse}
    if want_scales:
        result.update(_forward_scales(d, out, lse, p_norm))
    return result


def _score_bound(d: _Dense) -> torch.Tensor:
    """Cauchy-Schwarz bound ``||q_i|| * softmax_scale * max_j ||k_j||`` on ``|s_ij|``: ``[BHkv, Sq*G]``."""
    return _row_norms(d.q) * _row_norms(d.k).amax(dim=1, keepdim=True)


def _visible_counts(d: _Dense) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys each grouped query row sees ``[Sq*G]`` and grouped rows seeing each key ``[Sk]``, float64."""
    per_row = (d.hi - d.lo).clamp(min=0)
    delta = torch.zeros(d.seqlen_k + 1, dtype=torch.int64, device=d.lo.device)
    nonempty = d.lo < d.hi
    delta.index_add_(0, d.lo[nonempty], torch.ones_like(d.lo[nonempty]))
    delta.index_add_(0, d.hi[nonempty], -torch.ones_like(d.hi[nonempty]))
    per_key = delta.cumsum(0)[:-1] * d.group
    return per_row.repeat_interleave(d.group).to(torch.float64), per_key.to(torch.float64)


def forward_scale_formulas(
    *,
    rho: float,
    p_norm: torch.Tensor,
    v_max: torch.Tensor,
    score_bound: torch.Tensor,
    accumulation: torch.Tensor,
    out_norm: torch.Tensor,
    lse: torch.Tensor,
    lse_bound: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out_scale, lse_scale)``: the error scales of out and lse (see `oracle.compare`), in any
    layout whose tensors broadcast together.

    Per row ``i`` with ``S_i`` the score bound, ``n_i`` its visible keys and ``rho`` = fp32 unit
    roundoff / dtype unit roundoff: ``out``: ``||P_i|| max||v|| (1 + rho (S_i + sqrt n_i)) +
    ||out_i|| (1 + rho sqrt n_i)``; ``lse`` (in fp32 units): ``|lse_i| + S_i + sqrt n_i``, 0 where
    no key is visible.

    Args:
        p_norm, v_max, score_bound, accumulation (``sqrt n_i``), out_norm: per output row (``out``'s
            layout without its last dim, or broadcastable to it).
        lse: natural-log logsumexp, in its own layout.
        lse_bound: ``S_i + sqrt n_i`` in ``lse``'s layout.
    """
    out_scale = p_norm * v_max * (1.0 + rho * (score_bound + accumulation)) + out_norm * (1.0 + rho * accumulation)
    lse_scale = torch.where(torch.isfinite(lse), lse.abs() + lse_bound, 0.0)
    return out_scale, lse_scale


def normalisation_error_scale(*, rho: float, delta: torch.Tensor, lse: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``rho |D_i| L_i`` with ``L_i = 2 |lse_i| + ln n_i + 1`` (0 on rows without a visible key):
    the error, in units of the case dtype's unit roundoff, that the normalisation of the backward's
    recomputed probabilities adds to ``D_i = rowsum(dO_i * O_i)``.

    A kernel recomputes ``P~_ij = exp(fl(s_ij) - fl(lse_i))`` from the stored fp32 lse
    (FlashAttention-2, arXiv:2307.08691, Algorithm 2 line 11). The condition number of ``exp`` at
    ``z`` is ``|z|``, so the absolute errors of the fp32 values ``fl(s_ij)`` (``u32 |s_ij|``, their
    rounding) and ``fl(lse_i)`` (``u32 |lse_i|``) become relative errors of ``P~_ij``, and ``sum_j
    P~_ij = 1 + eps_i`` with ``|eps_i| <~ u32 (sum_j P_ij |s_ij| + |lse_i| + 1) <= u32 L_i``
    (``s_ij = lse_i + ln P_ij`` and the entropy ``-sum_j P_ij ln P_ij <= ln n_i``; the ``1``: the
    rounding of ``exp`` itself). This is the error of softmax written as ``exp(x_i - lse)``, whose
    bound grows with ``|x_i|`` and ``|lse|`` (Blanchard, Higham and Mary, "Accurate computation of
    the log-sum-exp and softmax functions", IMA J. Numer. Anal. 41 (2021); Higham, "Accuracy and
    Stability of Numerical Algorithms", 2nd ed., Sec. 1.6 and 2.2). ``D_i`` comes from the
    normalised ``O``, so ``sum_j dS~_ij = eps_i D_i`` is no longer 0: ``dq_i = c sum_j dS_ij k_j``
    gets ``c eps_i D_i sum_j P_ij k_j`` (large along a channel every key shares, as with a score
    offset, `oracle.inputs`, where ``|lse_i|`` reaches ~250 and the true ``dq`` there is 0), and
    ``dk_j`` gets ``c sum_i eps_i D_i P_ij q_i``. `_dense_backward` adds both with the norms
    ``||sum_j P_ij k_j||`` and ``(sum_i (P_ij |eps_i D_i| ||q_i||)^2)^(1/2)`` (root-sum-square).
    Not included: the accumulation error of ``q . k`` (``<~ u32 S_i``), which cancels between
    forward and backward when both sum in the same order. For bfloat16/float16 ``rho = 2**-16`` /
    ``2**-13`` makes the term negligible.

    Args:
        rho: fp32 unit roundoff / the case dtype's unit roundoff.
        delta: ``D_i``; lse: ``lse_i`` (natural log, ``-inf`` on empty rows); keys: ``n_i``, the
            keys row ``i`` sees; one layout (``[BHkv, Sq*G]`` here), float64.
    """
    visible = torch.isfinite(lse)
    spread = 2.0 * lse.abs() + keys.clamp(min=1.0).log() + 1.0
    return torch.where(visible, rho * delta.abs() * torch.where(visible, spread, 0.0), 0.0)


UNDERFLOW_SCALE_MIN = 2.0**-64  # smallest normals below this (bf16, fp32: ~1e-38) make the term negligible


def underflow_floor(dtype: str) -> float:
    """The smallest normal ``lambda`` of ``dtype`` (float16: ``2**-14``), or 0 where it is below
    ``UNDERFLOW_SCALE_MIN`` (bfloat16, float32, float64 share float32's exponent range or more).

    With gradual underflow, rounding ``x`` to the dtype errs by ``|fl(x) - x| <= u max(|x|,
    lambda)`` (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Sec. 2.1, the
    model ``fl(x) = x (1 + delta) + eta`` with ``|eta| <= u lambda``, half the subnormal spacing).
    A kernel that rounds the probabilities ``P`` and ``dS`` to float16 before its matmuls (the
    FlashAttention design, PyTorch's CPU flash kernel) therefore has an *absolute* error of up to
    ``2**-25`` on every entry below ``2**-14`` (a probability of 3e-7 is only ~5 subnormal steps:
    a relative error of several %), which the relative model ``u |P|`` misses. It appears in
    ``dv = P^T dO`` times ``|dO|`` (why ``dout_distribution="large"`` exposed it: the gradient is
    then in the normal range while the ``P`` behind it is subnormal) and in ``dq``/``dk`` through
    ``dS``. `_dense_backward` therefore uses ``max(|P_ij|, lambda)`` and ``max(|dS_ij|, lambda)``
    (on entries that are not exactly 0) in the dv, dq and dk error scales. ``out`` needs no such
    term: its kernels round the unnormalised ``exp(s - m) / l``, ``l >= 1``, and the term is below
    ``lambda sqrt(n_i) <= 2%`` of the ``||P_i|| max||v||`` term for ``n_i <= 1e5`` keys.
    """
    tiny = float(torch.finfo(torch_dtype(dtype)).tiny)
    return tiny if tiny >= UNDERFLOW_SCALE_MIN else 0.0


def _forward_scales(d: _Dense, out: torch.Tensor, lse: torch.Tensor, p_norm: torch.Tensor) -> dict[str, torch.Tensor]:
    """Error scales of out and lse (`forward_scale_formulas`) from grouped out, lse and ``||P_i||``."""
    score_bound = _score_bound(d)
    accumulation = _visible_counts(d)[0].sqrt()  # fp32 summation over n_i terms grows like sqrt(n_i)
    out_scale, lse_scale = forward_scale_formulas(
        rho=d.rho,
        p_norm=p_norm,
        v_max=_row_norms(d.v).amax(dim=1, keepdim=True),  # [BHkv, 1]
        score_bound=score_bound,
        accumulation=accumulation,
        out_norm=_row_norms(out),
        lse=lse,
        lse_bound=score_bound + accumulation,
    )
    return {"p_norm": p_norm, "score_bound": score_bound, "out_scale": out_scale, "lse_scale": lse_scale}


@torch.no_grad()
def _dense_backward(d: _Dense, fwd: dict[str, torch.Tensor], dout: torch.Tensor, want_scales: bool):
    """Backward over the blocks, for grouped ``dout [BHkv, Sq*G, Dv]``; returns grouped dq, dk, dv
    and with ``want_scales`` their error scales."""
    out, lse = fwd["out"], fwd["lse"]
    bh, _, head_dim = d.q.shape
    delta = (dout * out).sum(dim=-1)  # D_i = rowsum(dO_i * O_i), FA2 Alg. 2 line 4 / eq. (4)
    lse_safe = torch.where(torch.isfinite(lse), lse, math.inf)  # empty rows: P = exp(s - inf) = 0
    neg_lse = lse_safe.neg()
    dq = torch.zeros_like(d.q)
    dk = torch.zeros_like(d.k)
    dv = torch.zeros_like(d.v)
    if want_scales:
        growth = 1.0 + d.rho * fwd["score_bound"]  # [BHkv, Sq*G]
        dout_norm = _row_norms(dout)
        renorm = normalisation_error_scale(rho=d.rho, delta=delta, lse=lse, keys=_visible_counts(d)[0])  # eps_i D_i / u
        row_weights = torch.stack(  # weights of the column sums of P^2
            [(dout_norm * _row_norms(out)) ** 2, (dout_norm * growth) ** 2, dout_norm**2, (renorm * _row_norms(d.q)) ** 2],
            dim=1,
        )  # [BHkv, 4, Sq*G]
        col_p = torch.zeros(bh, 4, d.seqlen_k, dtype=torch.float64, device=d.q.device)
        pk_norm = torch.zeros_like(lse)  # ||sum_j P_ij k_j||
        col_ds = torch.zeros(bh, 1, d.seqlen_k, dtype=torch.float64, device=d.q.device)
        row_ds = torch.zeros_like(lse)
    for blk in d.blocks:
        if blk.empty:
            continue
        r0, r1 = blk.i0 * d.group, blk.i1 * d.group
        q_blk, dout_blk = d.q[:, r0:r1], dout[:, r0:r1]
        k_blk, v_blk = d.k[:, blk.j0 : blk.j1], d.v[:, blk.j0 : blk.j1]
        if d.softcap is None:
            scores = torch.baddbmm(neg_lse[:, r0:r1, None], q_blk, k_blk.transpose(1, 2))  # s - lse
        else:
            tanh = torch.bmm(q_blk, k_blk.transpose(1, 2)).div_(d.softcap).tanh_()
            scores = (tanh * d.softcap).sub_(lse_safe[:, r0:r1, None])
        _mask_edges(scores, blk, d.lo, d.hi, d.group)
        probs = scores.exp_()
        dv[:, blk.j0 : blk.j1].baddbmm_(probs.transpose(1, 2), dout_blk)
        dscores = torch.bmm(dout_blk, v_blk.transpose(1, 2)).sub_(delta[:, r0:r1, None]).mul_(probs)
        if d.softcap is not None:
            dscores.mul_(tanh.square_().neg_().add_(1.0))  # d(c tanh(x / c)) / dx = 1 - tanh^2
        dq[:, r0:r1] = torch.bmm(dscores, k_blk)
        dk[:, blk.j0 : blk.j1].baddbmm_(dscores.transpose(1, 2), q_blk)
        if want_scales:
            pk_norm[:, r0:r1] = _row_norms(torch.bmm(probs, k_blk))
            squared_p = probs.square_()
            col_p[:, :, blk.j0 : blk.j1] += torch.bmm(row_weights[:, :, r0:r1], squared_p)
            squared_ds = dscores.square_()
            if d.underflow:  # P and dS rounded to float16 err by u max(|x|, tiny) (`underflow_floor`)
                tiny2 = d.underflow**2
                lifted_p = (tiny2 - squared_p).clamp_(min=0.0).mul_(squared_p > 0)  # max(P, tiny)^2 - P^2
                col_p[:, 1:2, blk.j0 : blk.j1] += torch.bmm(row_weights[:, 1:2, r0:r1], lifted_p)
                squared_ds = torch.where(squared_ds > 0, squared_ds.clamp(min=tiny2), squared_ds)
            row_ds[:, r0:r1] = squared_ds.sum(dim=-1)
            col_ds[:, :, blk.j0 : blk.j1] += torch.bmm(growth[:, None, r0:r1] ** 2, squared_ds)
    dq.mul_(d.scale)  # dS is w.r.t. the scaled scores; k is unscaled. q was pre-scaled for dk.
    result = {"dq": dq, "dk": dk, "dv": dv}
    if want_scales:
        # Error scales (see `oracle.compare`); the sqrt(count) factors: fp32 summation error growth.
        k_max = _row_norms(d.k).amax(dim=1, keepdim=True)
        v_max = _row_norms(d.v).amax(dim=1, keepdim=True)
        q_max = _row_norms(d.q).amax(dim=1, keepdim=True) / d.scale  # unscaled q
        keys_per_row, rows_per_key = (count.sqrt() for count in _visible_counts(d))
        dq_base = d.scale * k_max * (
            row_ds.sqrt() * growth + dout_norm * _row_norms(out) + d.rho * fwd["p_norm"] * dout_norm * v_max
        ) + d.scale * renorm * pk_norm
        dk_base = d.scale * q_max * (
            col_ds[:, 0].sqrt() + col_p[:, 0].sqrt() + d.rho * _row_norms(d.v) * col_p[:, 2].sqrt()
        ) + col_p[:, 3].sqrt()
        dv_base = col_p[:, 1].sqrt()
        result["dq_scale"] = (dq_base + _row_norms(dq)) * (d.rho * keys_per_row) + dq_base
        result["dk_scale"] = (dk_base + _row_norms(dk)) * (d.rho * rows_per_key) + dk_base
        result["dv_scale"] = (dv_base + _row_norms(dv)) * (d.rho * rows_per_key) + dv_base
    return result


# --------------------------------------------------------------------------- public API
def _check_inputs(case: AttentionCase, q, k, v, dout) -> None:
    if case.is_varlen:
        want = {
            "q": (case.total_q, case.num_heads, case.head_dim),
            "k": (case.total_k, case.num_heads_kv, case.head_dim),
            "v": (case.total_k, case.num_heads_kv, case.head_dim_v),
            "dout": (case.total_q, case.num_heads, case.head_dim_v),
        }
    else:
        want = {
            "q": (case.batch_size, case.seqlen_q, case.num_heads, case.head_dim),
            "k": (case.batch_size, case.seqlen_k, case.num_heads_kv, case.head_dim),
            "v": (case.batch_size, case.seqlen_k, case.num_heads_kv, case.head_dim_v),
            "dout": (case.batch_size, case.seqlen_q, case.num_heads, case.head_dim_v),
        }
    for name, tensor in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        if tensor is None:
            continue
        if tuple(tensor.shape) != want[name]:
            raise ReferenceInputError(f"{name} has shape {tuple(tensor.shape)}, the case needs {want[name]}")
        if tensor.device != q.device:
            raise ReferenceInputError(f"{name} is on {tensor.device}, q on {q.device}")


def _segments(case: AttentionCase):
    """``(q_start, q_len, k_start, k_len)`` per sequence for thd, one entry covering all for bshd."""
    if not case.is_varlen:
        return [(None, case.seqlen_q, None, case.seqlen_k)]
    segments, q_start, k_start = [], 0, 0
    for len_q, len_k in zip(case.seqlens_q_list, case.seqlens_k_list):
        segments.append((q_start, len_q, k_start, len_k))
        q_start, k_start = q_start + len_q, k_start + len_k
    return segments


def _compiled_forward(name: str):
    """The module of a compiled forward engine (imported lazily: both are optional)."""
    if name == "cuda":
        from oracle import _cuda_fwd

        return _cuda_fwd
    from oracle import _triton_fwd

    return _triton_fwd


def _fall_back(name: str, engine: str, exc: Exception) -> None:
    """The compiled forward ``name`` failed with ``exc``: re-raise it if ``engine`` asked for it by
    name, else record it (``cuda_fallback_error``/``triton_fallback_error``) and let the next
    engine run."""
    global triton_fallback_error, cuda_fallback_error
    if engine == name:
        raise exc
    text = f"{type(exc).__name__}: {exc}"
    if name == "cuda":
        cuda_fallback_error = text
    else:
        triton_fallback_error = text


@torch.no_grad()
def _run(
    case: AttentionCase,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor | None,
    *,
    block_q: int | None,
    memory_budget_bytes: int | None,
    error_scales: bool,
    engine: str,
) -> ReferenceResult:
    if engine not in ENGINES:
        raise ReferenceInputError(f"engine must be one of {ENGINES}, got {engine!r}")
    _check_inputs(case, q, k, v, dout)
    device = q.device
    budget = memory_budget_bytes or DEFAULT_MEMORY_BUDGET_BYTES.get(device.type, DEFAULT_MEMORY_BUDGET_BYTES["cpu"])
    buffers = 2 if dout is None else (4 if case.softcap is not None else 3)
    rho = FLOAT32_UNIT_ROUNDOFF / (torch.finfo(torch_dtype(case.dtype)).eps / 2)
    varlen = case.is_varlen
    hkv = case.num_heads_kv

    # The compiled forwards to try, in order: engine="auto" on CUDA tries the DMMA kernel, then Triton.
    compiled: list[str] = []
    auto = engine == "auto" and device.type in TRITON_AUTO_DEVICE_TYPES and not varlen
    for name in ("cuda", "triton"):
        if engine == name or auto:
            module = _compiled_forward(name)
            reason = module.unsupported_reason(case, q)
            if reason is None:
                compiled.append(name)
            elif engine == name:
                raise ReferenceInputError(f"engine={name!r} cannot run this case: {reason}")

    if compiled and compiled[0] == "cuda" and dout is None and not varlen:
        # Forward only: the DMMA kernel reads the canonical tensors directly (no grouped copies).
        from oracle import _cuda_fwd

        lo, hi = key_bounds(case, case.seqlen_q, case.seqlen_k, device)
        try:
            fwd = _cuda_fwd.direct_forward(case, q, k, v, lo, hi, rho, error_scales)
        except Exception as exc:  # noqa: BLE001 - any failure falls back to the next engine
            _fall_back("cuda", engine, exc)
            compiled.pop(0)
        else:
            result = ReferenceResult(out=fwd["out"], lse=fwd["lse"], engine="cuda")
            if error_scales:
                result.error_scales = {"out": fwd["out_scale"], "lse": fwd["lse_scale"]}
            return result

    parts: dict[str, list[torch.Tensor]] = {}
    engine_used = "torch"
    for q_start, len_q, k_start, len_k in _segments(case):
        if varlen:
            q_seg = q[q_start : q_start + len_q].unsqueeze(0)
            k_seg = k[k_start : k_start + len_k].unsqueeze(0)
            v_seg = v[k_start : k_start + len_k].unsqueeze(0)
            dout_seg = None if dout is None else dout[q_start : q_start + len_q].unsqueeze(0)
        else:
            q_seg, k_seg, v_seg, dout_seg = q, k, v, dout
        batch = q_seg.shape[0]
        lo, hi = key_bounds(case, len_q, len_k, device)
        rows = block_q or choose_block_q(batch, case.num_heads, len_q, len_k, buffers, budget)
        grouped_q = _grouped_rows(q_seg, hkv).mul_(case.softmax_scale)
        dense = _Dense(
            q=grouped_q,
            k=_kv_rows(k_seg),
            v=_kv_rows(v_seg),
            lo=lo,
            hi=hi,
            blocks=_schedule(lo, hi, rows),
            batch_size=batch,
            seqlen_q=len_q,
            seqlen_k=len_k,
            num_heads_kv=hkv,
            group=case.group_size,
            scale=case.softmax_scale,
            softcap=case.softcap,
            rho=rho,
            underflow=underflow_floor(case.dtype),
        )
        fwd = None
        while compiled and fwd is None:
            name = compiled[0]
            try:
                fwd = _compiled_forward(name).dense_forward(dense, error_scales)
                engine_used = name
            except Exception as exc:  # noqa: BLE001 - any failure falls back to the next engine
                _fall_back(name, engine, exc)
                compiled.pop(0)
        if fwd is None:
            fwd = _dense_forward(dense, error_scales)
        grouped = dict(fwd)
        if dout_seg is not None:
            grouped.update(_dense_backward(dense, fwd, _grouped_rows(dout_seg, hkv), error_scales))
        # back to the canonical layout of this segment
        seg = {
            "out": _ungroup_rows(grouped["out"], batch, len_q, hkv),
            "lse": _ungroup_row_values(grouped["lse"], batch, len_q, hkv, lse_layout=True),
        }
        if error_scales:
            seg["out_scale"] = _ungroup_row_values(grouped["out_scale"], batch, len_q, hkv, lse_layout=False)
            seg["lse_scale"] = _ungroup_row_values(grouped["lse_scale"], batch, len_q, hkv, lse_layout=True)
        if dout_seg is not None:
            seg["dq"] = _ungroup_rows(grouped["dq"], batch, len_q, hkv)
            seg["dk"] = _unkv_rows(grouped["dk"], batch)
            seg["dv"] = _unkv_rows(grouped["dv"], batch)
            if error_scales:
                seg["dq_scale"] = _ungroup_row_values(grouped["dq_scale"], batch, len_q, hkv, lse_layout=False)
                seg["dk_scale"] = grouped["dk_scale"].view(batch, hkv, len_k).transpose(1, 2).contiguous()
                seg["dv_scale"] = grouped["dv_scale"].view(batch, hkv, len_k).transpose(1, 2).contiguous()
        for name, value in seg.items():
            parts.setdefault(name, []).append(value)

    def assemble(name: str) -> torch.Tensor:
        values = parts[name]
        if not varlen:
            return values[0]
        if name in ("lse", "lse_scale"):  # [1, H, len_q] per sequence -> [H, total_q]
            return torch.cat([x[0] for x in values], dim=1)
        return torch.cat([x[0] for x in values], dim=0)  # [1, len, ...] -> [total, ...]

    result = ReferenceResult(out=assemble("out"), lse=assemble("lse"), engine=engine_used)
    if dout is not None:
        result.dq, result.dk, result.dv = assemble("dq"), assemble("dk"), assemble("dv")
    if error_scales:
        names = ("out", "lse", "dq", "dk", "dv") if dout is not None else ("out", "lse")
        result.error_scales = {name: assemble(f"{name}_scale") for name in names}
    return result


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    case: AttentionCase,
    *,
    block_q: int | None = None,
    memory_budget_bytes: int | None = None,
    error_scales: bool = True,
    engine: str = "auto",
) -> ReferenceResult:
    """Float64 attention forward of canonical tensors.

    Args:
        q: ``[batch_size, seqlen_q, num_heads, head_dim]`` (thd: ``[total_q, num_heads, head_dim]``),
            any float dtype, any device; converted to float64 here.
        k: ``[batch_size, seqlen_k, num_heads_kv, head_dim]`` (thd: ``[total_k, ...]``), q's device.
        v: ``[batch_size, seqlen_k, num_heads_kv, head_dim_v]`` (thd: ``[total_k, ...]``).
        case: the case (mask, scale, softcap, layout, varlen lengths).
        block_q: query rows per block; default from ``memory_budget_bytes``.
        memory_budget_bytes: bytes of score blocks alive at once; default
            ``DEFAULT_MEMORY_BUDGET_BYTES[device type]``.
        error_scales: also compute ``ReferenceResult.error_scales`` for out and lse.
        engine: ``"torch"``, ``"triton"`` (the fused float64 Triton kernel; CUDA, bshd/sbhd only),
            ``"cuda"`` (the float64 DMMA kernel of `oracle._cuda_fwd`; sm_90+, head_dim <= 128,
            bshd/sbhd only) or ``"auto"`` (on CUDA: the DMMA kernel, else Triton, else torch,
            each tried where it applies and the next used if it fails).

    Returns:
        `ReferenceResult` with ``out``, ``lse`` (float64, on q's device) and no gradients.

    Raises:
        ReferenceInputError: a tensor's shape or device does not match the case, an unknown
            ``engine``, or ``engine="triton"``/``"cuda"`` where it cannot run.
    """
    return _run(
        case, q, k, v, None, block_q=block_q, memory_budget_bytes=memory_budget_bytes,
        error_scales=error_scales, engine=engine,
    )


def attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    case: AttentionCase,
    *,
    block_q: int | None = None,
    memory_budget_bytes: int | None = None,
    error_scales: bool = True,
    engine: str = "auto",
) -> ReferenceResult:
    """Float64 attention forward and backward (``dq, dk, dv`` for the given ``dout``).

    Args:
        q, k, v: as in `attention_forward`.
        dout: ``[batch_size, seqlen_q, num_heads, head_dim_v]`` (thd: ``[total_q, ...]``), q's device.
        case, block_q, memory_budget_bytes, error_scales, engine: as in `attention_forward`
            (``engine`` applies to the forward; the backward always runs on the torch path).

    Returns:
        `ReferenceResult` with out, lse, dq, dk, dv (float64, on q's device).

    Raises:
        ReferenceInputError: as in `attention_forward`.
    """
    return _run(
        case, q, k, v, dout, block_q=block_q, memory_budget_bytes=memory_budget_bytes,
        error_scales=error_scales, engine=engine,
    )


def reference(
    case: AttentionCase,
    inputs: AttentionInputs,
    *,
    backward: bool | None = None,
    block_q: int | None = None,
    memory_budget_bytes: int | None = None,
    error_scales: bool = True,
    engine: str = "auto",
) -> ReferenceResult:
    """The float64 reference of a case for its inputs, on the inputs' device.

    Args:
        case: the attention case.
        inputs: `AttentionInputs` (from `oracle.inputs.make_inputs` or equivalent), any device.
        backward: compute ``dq, dk, dv`` for ``inputs.dout``; default ``case.backward``.
        block_q, memory_budget_bytes, error_scales, engine: as in `attention_forward`.

    Returns:
        `ReferenceResult` (float64, on the inputs' device).

    Raises:
        ReferenceInputError: as in `attention_forward`.
    """
    backward = case.backward if backward is None else backward
    return _run(
        case, inputs.q, inputs.k, inputs.v, inputs.dout if backward else None, block_q=block_q,
        memory_budget_bytes=memory_budget_bytes, error_scales=error_scales, engine=engine,
    )


__all__ = [
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "ENGINES",
    "SAFE_SHIFT_BOUND",
    "TRITON_AUTO_DEVICE_TYPES",
    "ReferenceInputError",
    "ReferenceResult",
    "attention_backward",
    "attention_forward",
    "choose_block_q",
    "reference",
    "shift_bound",
]
