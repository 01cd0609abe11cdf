"""The grouped float64 layout of equal-length sequences and the torch forward over it: what
`oracle.reference` and its compiled forward engines (`oracle._cuda_fwd`, `oracle._triton_fwd`)
share, so that none of them imports another's private names.

Layout (`Dense`): the queries of one kv head and its ``G = num_heads / num_heads_kv`` query heads
are one ``bmm`` operand, rows ordered (token, group): ``q [batch_size * num_heads_kv, seqlen_q *
G, head_dim]`` float64, pre-multiplied by softmax_scale; ``k [batch_size * num_heads_kv, seqlen_k,
head_dim]``, ``v [..., head_dim_v]`` float64; ``lo``/``hi`` ``[seqlen_q] int64`` key bounds of
`oracle.masks.key_bounds` (key ``j`` is visible from query ``i`` iff ``lo[i] <= j < hi[i]``).
`grouped_rows`/`kv_rows` make it from the canonical ``[batch_size, seqlen, heads, dim]``
tensors, `ungroup_rows`/`ungroup_row_values`/`unkv_rows` undo it.

Queries go in blocks of rows (`schedule`, `Block`); each block computes scores only for the key
range its rows can see and masks only the edge columns (`mask_edges`). The softmax shift is the
Cauchy-Schwarz bound `shift_bound` whenever it cannot underflow (`SAFE_SHIFT_BOUND`), else the
exact row maximum. `dense_forward` returns grouped ``out [B*Hkv, Sq*G, Dv]`` and natural-log
``lse [B*Hkv, Sq*G]`` (``-inf`` and ``out = 0`` on rows without a visible key) and, on request,
the first-order error scales of out and lse (`forward_scales`, `forward_scale_formulas`; the
error model is `oracle.compare`'s). The engines return exactly these keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# --------------------------------------------------------------------------- layout helpers
def grouped_rows(x: torch.Tensor, num_heads_kv: int) -> torch.Tensor:
    """``[B, S, H, F]`` (any dtype) -> ``[B * Hkv, S * G, F] float64``, rows ordered (token, group)."""
    batch, seqlen, heads, feat = x.shape
    group = heads // num_heads_kv
    out = torch.empty(batch, num_heads_kv, seqlen, group, feat, dtype=torch.float64, device=x.device)
    out.copy_(x.reshape(batch, seqlen, num_heads_kv, group, feat).permute(0, 2, 1, 3, 4))
    return out.view(batch * num_heads_kv, seqlen * group, feat)


def ungroup_rows(y: torch.Tensor, batch: int, seqlen: int, num_heads_kv: int) -> torch.Tensor:
    """Inverse of `grouped_rows`: ``[B * Hkv, S * G, F]`` -> ``[B, S, H, F]`` (contiguous)."""
    feat = y.shape[-1]
    group = y.shape[1] // seqlen
    grouped = y.view(batch, num_heads_kv, seqlen, group, feat).permute(0, 2, 1, 3, 4)
    return grouped.reshape(batch, seqlen, num_heads_kv * group, feat)


def ungroup_row_values(y: torch.Tensor, batch: int, seqlen: int, num_heads_kv: int, lse_layout: bool):
    """``[B * Hkv, S * G]`` -> ``[B, S, H]`` (or ``[B, H, S]`` with ``lse_layout``)."""
    group = y.shape[1] // seqlen
    grouped = y.view(batch, num_heads_kv, seqlen, group)
    if lse_layout:
        return grouped.permute(0, 1, 3, 2).reshape(batch, num_heads_kv * group, seqlen)
    return grouped.permute(0, 2, 1, 3).reshape(batch, seqlen, num_heads_kv * group)


def kv_rows(x: torch.Tensor) -> torch.Tensor:
    """``[B, S, Hkv, F]`` -> ``[B * Hkv, S, F] float64``."""
    batch, seqlen, heads, feat = x.shape
    out = torch.empty(batch, heads, seqlen, feat, dtype=torch.float64, device=x.device)
    out.copy_(x.permute(0, 2, 1, 3))
    return out.view(batch * heads, seqlen, feat)


def unkv_rows(y: torch.Tensor, batch: int) -> torch.Tensor:
    """Inverse of `kv_rows`: ``[B * Hkv, S, F]`` -> ``[B, S, Hkv, F]`` (contiguous)."""
    _, seqlen, feat = y.shape
    return y.view(batch, -1, seqlen, feat).permute(0, 2, 1, 3).contiguous()


# --------------------------------------------------------------------------- block schedule
@dataclass(frozen=True)
class Block:
    """Query rows ``[i0, i1)``; visible keys within ``[j0, j1)``; columns ``[j0, left_end)`` and
    ``[right_start, j1)`` need masking; ``empty``: the whole block sees no key."""

    i0: int
    i1: int
    j0: int
    j1: int
    left_end: int
    right_start: int
    empty: bool


def schedule(lo: torch.Tensor, hi: torch.Tensor, block_q: int) -> list[Block]:
    lo_list, hi_list = lo.tolist(), hi.tolist()
    blocks = []
    for i0 in range(0, len(lo_list), block_q):
        i1 = min(i0 + block_q, len(lo_list))
        rows = [(a, b) for a, b in zip(lo_list[i0:i1], hi_list[i0:i1]) if a < b]
        if not rows:
            blocks.append(Block(i0, i1, 0, 0, 0, 0, True))
            continue
        j0, j1 = min(a for a, _ in rows), max(b for _, b in rows)
        left_end = min(max(max(lo_list[i0:i1]), j0), j1)
        right_start = max(min(min(hi_list[i0:i1]), j1), j0)
        blocks.append(Block(i0, i1, j0, j1, left_end, right_start, False))
    return blocks


def mask_edges(scores: torch.Tensor, blk: Block, lo: torch.Tensor, hi: torch.Tensor, group: int) -> None:
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


# --------------------------------------------------------------------------- dense (equal-length) core
@dataclass
class Dense:
    """One batch of equal-length sequences, in the grouped float64 layout.

    ``q`` is pre-multiplied by softmax_scale: ``[B*Hkv, Sq*G, D]``; ``k`` ``[B*Hkv, Sk, D]``; ``v``
    ``[B*Hkv, Sk, Dv]``; ``lo``/``hi`` ``[Sq] int64`` on the device.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    blocks: list[Block]
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


def row_norms(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1)


def shift_bound(d: Dense) -> torch.Tensor:
    """An upper bound ``M_i >= max_j s_ij`` per grouped row, ``[BHkv, Sq*G]``: the Cauchy-Schwarz
    bound ``||q_i|| c max||k||``, or ``softcap`` if smaller. Since also ``s_ij >= -M_i``,
    ``exp(s_ij - M_i)`` of the largest score is ``>= exp(-2 M_i)``: with ``M_i <= SAFE_SHIFT_BOUND``
    neither it nor its square underflows, so ``M_i`` can replace the exact row maximum as the
    softmax shift (saving a pass over the scores and letting ``baddbmm`` subtract it)."""
    bound = score_bound(d)
    return bound.clamp(max=d.softcap) if d.softcap is not None else bound


SAFE_SHIFT_BOUND = 170.0  # exp(-2 * 170)**2 ~ 1e-296 > the smallest normal float64


def safe_blocks(d: Dense, bound: torch.Tensor) -> list[bool]:
    """Per block: may `shift_bound` replace the exact row maximum (one device sync for all)."""
    if not d.blocks:
        return []
    per_block = torch.stack([bound[:, b.i0 * d.group : b.i1 * d.group].amax() for b in d.blocks])
    return (per_block <= SAFE_SHIFT_BOUND).tolist()


@torch.no_grad()
def dense_forward(d: Dense, want_scales: bool) -> dict[str, torch.Tensor]:
    """Forward over the blocks; returns grouped ``out [BHkv, Sq*G, Dv]``, ``lse [BHkv, Sq*G]``,
    and with ``want_scales`` the row norms of P (``p_norm``) and the error scales."""
    rows_total = d.seqlen_q * d.group
    bh = d.q.shape[0]
    out = torch.zeros(bh, rows_total, d.v.shape[-1], dtype=torch.float64, device=d.q.device)
    lse = torch.full((bh, rows_total), -math.inf, dtype=torch.float64, device=d.q.device)
    p_norm = torch.zeros(bh, rows_total, dtype=torch.float64, device=d.q.device) if want_scales else None
    bound = shift_bound(d)
    for blk, safe in zip(d.blocks, safe_blocks(d, bound)):
        if blk.empty:
            continue
        r0, r1 = blk.i0 * d.group, blk.i1 * d.group
        k_t = d.k[:, blk.j0 : blk.j1].transpose(1, 2)
        shift = bound[:, r0:r1, None]
        if safe and d.softcap is None:
            scores = torch.baddbmm(shift.neg(), d.q[:, r0:r1], k_t)  # s - M_i in one gemm
            mask_edges(scores, blk, d.lo, d.hi, d.group)
        else:
            scores = torch.bmm(d.q[:, r0:r1], k_t)
            if d.softcap is not None:
                scores.div_(d.softcap).tanh_().mul_(d.softcap)
            mask_edges(scores, blk, d.lo, d.hi, d.group)  # before the maximum: only visible keys count
            if not safe:  # the exact row maximum; empty rows shift by 0
                shift = scores.amax(dim=-1, keepdim=True).nan_to_num_(neginf=0.0)
            scores.sub_(shift)
        probs = scores.exp_()
        row_sum = probs.sum(dim=-1, keepdim=True)  # 0 exactly for rows without a visible key
        denominator = torch.where(row_sum > 0, row_sum, 1.0)
        out[:, r0:r1] = torch.bmm(probs, d.v[:, blk.j0 : blk.j1]).div_(denominator)
        lse[:, r0:r1] = (shift + row_sum.log()).squeeze(-1)
        if want_scales:
            p_norm[:, r0:r1] = row_norms(probs).div_(denominator.squeeze(-1))
    result = {"out": out, "lse": lse}
    if want_scales:
        result.update(forward_scales(d, out, lse, p_norm))
    return result


def score_bound(d: Dense) -> torch.Tensor:
    """Cauchy-Schwarz bound ``||q_i|| * softmax_scale * max_j ||k_j||`` on ``|s_ij|``: ``[BHkv, Sq*G]``."""
    return row_norms(d.q) * row_norms(d.k).amax(dim=1, keepdim=True)


def visible_counts(d: Dense) -> tuple[torch.Tensor, torch.Tensor]:
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


def forward_scales(d: Dense, out: torch.Tensor, lse: torch.Tensor, p_norm: torch.Tensor) -> dict[str, torch.Tensor]:
    """Error scales of out and lse (`forward_scale_formulas`) from grouped out, lse and ``||P_i||``."""
    bound = score_bound(d)
    accumulation = visible_counts(d)[0].sqrt()  # fp32 summation over n_i terms grows like sqrt(n_i)
    out_scale, lse_scale = forward_scale_formulas(
        rho=d.rho,
        p_norm=p_norm,
        v_max=row_norms(d.v).amax(dim=1, keepdim=True),  # [BHkv, 1]
        score_bound=bound,
        accumulation=accumulation,
        out_norm=row_norms(out),
        lse=lse,
        lse_bound=bound + accumulation,
    )
    return {"p_norm": p_norm, "score_bound": bound, "out_scale": out_scale, "lse_scale": lse_scale}
