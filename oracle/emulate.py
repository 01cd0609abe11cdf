"""A float32 emulation of a kernel design (`oracle.design`), and the rule that tells a kernel defect
from the limit of a correct design.

A verdict of ``wrong`` claims that a kernel is worse than any correct kernel of its design would
be. The float64 oracle alone cannot show that: a correct kernel that holds an intermediate in the
case's dtype (the scores, ``P``, ``dP``, ``dS``, per-query-head gradients before a GQA sum)
overflows or loses precision where that intermediate leaves the dtype's range, and the float64
reference does not. So a backend declares its design (`Design`: which intermediates it holds in
the dtype, each with the source of the claim) and, for a tensor that fails the oracle, attnfuzz
runs a float32 emulation of that design on the same inputs (`emulate`) and applies
FlashAttention's own test rule to the kernel against it (`design_rule`, below). A failure the
rule accepts, on a tensor where the emulation fails the oracle too, is the design's limit
(signature ``<tensor>:limit``, or ``<tensor>:unjudgeable`` where the design is beyond any
first-order bound); any other failure keeps its verdict (`explain_failure`).

The intermediates are `oracle.design.INTERMEDIATES`.

The rule (`design_rule`) is FlashAttention's test criterion (``tests/test_flash_attn.py`` of
flash-attention 2, ``tests/cute/test_flash_attn.py`` of FA4: ``(out - out_ref).abs().max() <=
2 * (out_pt - out_ref).abs().max() + atol``, with ``out_pt`` a same-precision PyTorch
implementation), in L2 norms over the whole tensor and over each tile of the oracle
(`oracle.compare.TILE_ROWS` rows), with the float64 reference for ``out_ref``, the design's
emulation for ``out_pt`` and the oracle's allowed error for ``atol``:
``||A - R|| <= 2 ||E - R|| + allowed`` on the entries finite in both, and no entry non-finite in
the kernel where the emulation is finite (`NONFINITE_SLACK` aside: the order of a sum over heads
decides whether ``+inf + -inf`` is met). ``shape``, ``all_zero`` with a non-zero emulation and
``finite_on_masked`` are never a design's limit.

Why an emulation and not an error term added to the allowance: an error term of one design
applied to every backend would hide the defects of the others (an FA4 output that is all zero
passes no rule against an FA emulation that is not), and the emulation reproduces the limits bit
for bit where the design is right (the H200 campaigns of 2026-12-03 at 24321c7 and 79cee67,
`docs/gpu-campaigns.md`: 18 of 28 ``wrong`` groups were reproduced by emulations of the
kernels' designs with the same signature and non-finite counts).

The mechanism (`Explanation.why`) comes from the same emulation run in float64 without rounding
(`emulate` with ``record``): for each claimed intermediate its largest magnitude and the share of
its non-zero entries below the dtype's smallest normal. An intermediate above the dtype's largest
finite value names an overflow ("per-head dk up to 1.3e5 > float16 max 65504 before the GQA
sum"); one whose spacing at its largest magnitude reaches 1 (``scores``: an error of a whole nat
in a softmax exponent, beyond any first-order bound) makes the case not judgeable; else the
largest subnormal share names a precision loss.

Imports nothing of attnfuzz's but `oracle`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from oracle.config import AttentionCase
from oracle.design import DS_ROUNDINGS, PHRASES, REACHES, Design
from oracle.masks import key_bounds

SUBNORMAL_SHARE = 0.01
"""The share of an intermediate's non-zero entries below the smallest normal from which the
mechanism is named a precision loss in the subnormal range (else the rounding itself)."""

FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)
"""float32's smallest normal, 2**-126: below it a flush-to-zero design's P and dS are 0."""

DEFAULT_BLOCK_ENTRIES = {"cpu": 1 << 22, "cuda": 1 << 25}
"""Score entries per query block of the emulation (its memory is a few times this, float32)."""

FA_RULE_FACTOR = 2.0
"""FlashAttention's test rule: the kernel's error at most twice the same-precision reference's,
plus an allowance (``tests/test_flash_attn.py``, flash-attention v2.8: ``assert (out -
out_ref).abs().max().item() <= 2 * (out_pt - out_ref).abs().max().item()``, plus ``atol`` in
its cute tests)."""

NONFINITE_SLACK = 0.01
"""Share of a tensor's unexpected non-finite kernel entries that may sit where the emulation is
finite (at least 2 entries): the order of a sum over heads or keys decides whether an overflowed
``+inf`` meets a ``-inf`` (NaN) or a finite rest, and a kernel's order is not the emulation's."""

# --------------------------------------------------------------------------- the emulation
@dataclass
class IntermediateStats:
    """Magnitudes of one intermediate in the float64 run of `emulate` (``record``).

    Attributes:
        max_abs: the largest finite magnitude (0 when none).
        nonzero: entries that are not zero (finite).
        below_normal: non-zero entries below the dtype's smallest normal (subnormal or flushed).
    """

    max_abs: float = 0.0
    nonzero: int = 0
    below_normal: int = 0

    def add(self, x: torch.Tensor, tiny: float) -> None:
        a = x.detach().abs()
        a = torch.where(torch.isfinite(a), a, 0.0)
        if a.numel() == 0:
            return
        nz = a > 0
        figures = torch.stack([a.max(), nz.sum().to(a.dtype), (nz & (a < tiny)).sum().to(a.dtype)]).tolist()
        self.max_abs = max(self.max_abs, figures[0])
        self.nonzero += int(figures[1])
        self.below_normal += int(figures[2])

    @property
    def below_normal_share(self) -> float:
        return self.below_normal / self.nonzero if self.nonzero else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"max_abs": self.max_abs, "nonzero": self.nonzero, "below_normal": self.below_normal}


@dataclass
class Emulation:
    """What `emulate` returns.

    Attributes:
        out, lse, dq, dk, dv: canonical layout (`oracle.inputs.AttentionInputs`); the case dtype
            (lse float32) when rounding, float64 in a ``record`` run; gradients None without
            backward.
        stats: with ``record``, per claimed intermediate (and per output gradient before the GQA
            sum), its `IntermediateStats`.
        spread: with ``record`` and the ``scores`` claim, per forward tensor (``out``, ``lse``; their
            layouts, float64) the first-order bound of how far two correct kernels of the design
            may lie apart where one score of a row rounds the other way (a float32 sum order
            decides a rounding near a midpoint; rare, so one score per row, the most sensitive):
            ``|delta s_j| = 2u |s_j|`` moves ``lse_i`` by ``P_ij 2u |s_ij|`` and ``out_i`` by at most
            ``P_ij 2u |s_ij| (max_l |v_l| + |out_i|)`` (``delta P_il = P_il (delta_lj - P_ij)
            delta s_ij``), maximised over ``j``. With a peaked softmax that one score decides the
            error, and the emulation's own error may be near 0 by luck: `design_rule` adds this
            bound to it.
    """

    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    stats: dict[str, IntermediateStats] = field(default_factory=dict)
    spread: dict[str, torch.Tensor] = field(default_factory=dict)

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {"out": self.out, "lse": self.lse, "dq": self.dq, "dk": self.dk, "dv": self.dv}


def _sequences(case: AttentionCase):
    """Yield ``(q_index, k_index)`` per sequence: ``inputs.q[q_index]`` is its ``[len_q, H, D]``
    queries (a batch index for bshd/sbhd, a token slice for thd), likewise for k, v and dout."""
    if not case.is_varlen:
        yield from ((b, b) for b in range(case.batch_size))
        return
    cu_q = [0, *itertools.accumulate(case.seqlens_q_list)]
    cu_k = [0, *itertools.accumulate(case.seqlens_k_list)]
    for b in range(case.batch_size):
        yield slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])


def _partial_rounding(rnd, stats: IntermediateStats | None, tiny: float):
    """The rounding of one gradient's partial sums under ``grads_accumulated``: recorded in
    ``stats`` (that gradient's own, in a float64 run) besides the claim's."""

    def apply(t: torch.Tensor) -> torch.Tensor:
        if stats is not None:
            stats.add(t, tiny)
        return rnd(t, "grads_accumulated")

    return apply


def _accumulate_in_blocks(x, p, qg, kg, vg, do, scale, block_q, block_k, rnd, *, heads_in_running_sum=True, rnd_head=None):
    """dq, dk and dv as a kernel accumulates them in its dtype outputs (the ``grads_accumulated``
    claim; PyTorch's CPU flash backward, ``FlashAttentionKernel.cpp`` ``cpu_flash_attention_backward``:
    for each query head of a kv head, for each query block, for each key block, three GEMMs with
    ``beta = 1`` into the dtype outputs, each partial sum rounded by ``rnd``).

    Args:
        x: ``[Hkv, G, Sq, Sk]`` the dS the GEMMs read (rounded as the design holds it).
        p: ``[Hkv, G, Sq, Sk]`` the P they read.
        qg, do: ``[Hkv, G, Sq, D]`` / ``[Hkv, G, Sq, Dv]``; kg, vg: ``[Hkv, Sk, D]`` / ``[Hkv, Sk, Dv]``.
        scale: what the dS GEMMs are multiplied by (their ``alpha``).
        block_q, block_k: the kernel's query and key blocks.
        rnd: ``{"dq": f, "dk": f, "dv": f}``, the rounding of each gradient's partial sums (the
            dtype's; recording only, in a float64 run).

        heads_in_running_sum: the group's heads add into one running dk and dv; else each head
            runs its own, rounded by ``rnd_head`` (per-head gradients in the dtype) and summed after.

    Returns:
        ``(dq [Hkv, G, Sq, D], dk [Hkv, Sk, D], dv [Hkv, Sk, Dv])``, dk and dv summed over the group.
    """
    heads_kv, group, len_q, len_k = x.shape
    dq = torch.zeros_like(qg)
    dk = torch.zeros(heads_kv, len_k, kg.shape[-1], dtype=x.dtype, device=x.device)
    dv = torch.zeros(heads_kv, len_k, vg.shape[-1], dtype=x.dtype, device=x.device)
    dk_sum, dv_sum = torch.zeros_like(dk), torch.zeros_like(dv)
    for r in range(group):
        if not heads_in_running_sum and r > 0:  # the next head's own accumulators
            dk_sum, dv_sum = dk_sum + rnd_head(dk), dv_sum + rnd_head(dv)
            dk, dv = torch.zeros_like(dk), torch.zeros_like(dv)
        for m0 in range(0, len_q, block_q):
            m1 = min(len_q, m0 + block_q)
            for n0 in range(0, len_k, block_k):
                n1 = min(len_k, n0 + block_k)
                xs = x[:, r, m0:m1, n0:n1]
                dv[:, n0:n1] = rnd["dv"](dv[:, n0:n1] + torch.matmul(p[:, r, m0:m1, n0:n1].transpose(-1, -2), do[:, r, m0:m1]))
                dq[:, r, m0:m1] = rnd["dq"](dq[:, r, m0:m1] + scale * torch.matmul(xs, kg[:, n0:n1]))
                dk[:, n0:n1] = rnd["dk"](dk[:, n0:n1] + scale * torch.matmul(xs.transpose(-1, -2), qg[:, r, m0:m1]))
    if not heads_in_running_sum and group > 1:
        dk, dv = dk_sum + rnd_head(dk), dv_sum + rnd_head(dv)
    return dq, dk, dv


def emulate(
    case: AttentionCase,
    inputs: Any,
    design: Design,
    *,
    backward: bool | None = None,
    record: bool = False,
    block_entries: int | None = None,
    heads_in_running_sum: bool = True,
) -> Emulation:
    """Attention of ``inputs`` as a correct kernel of ``design`` computes it: float32 arithmetic
    (float64 with ``record``), the claimed intermediates rounded to the case dtype where the
    design holds them there (none with ``record``), outputs rounded to the dtype.

    Formulas (`oracle.reference`'s): ``s = softmax_scale * q k^T``, with a softcap ``s = softcap *
    tanh(s / softcap)`` (rounded to the dtype again when the design holds ``scores``), masked after
    the softcap (`oracle.masks.key_bounds`); ``P = softmax(s)``, ``out = P V``, ``lse = max +
    log(sum)`` (``-inf`` and ``out = 0`` on a row that sees no key); ``dP = dO V^T``, ``D =
    rowsum(dO * out)`` (from the rounded out, as FlashAttention-2 does), ``dS = P (dP - D)`` (times
    ``1 - tanh^2`` with a softcap), ``dq = softmax_scale dS k``, ``dk = softmax_scale dS^T q``, ``dv
    = P^T dO`` (``D = rowsum(P dP)`` with the claim ``delta_from_dp``); dk and dv of the query
    heads of one kv head summed (FlashAttention-2, arXiv:2307.08691, Algorithm 2).

    Args:
        case: the case.
        inputs: its `oracle.inputs.AttentionInputs` (any device; the emulation runs there).
        design: what to round.
        backward: compute the gradients for ``inputs.dout``; default ``case.backward``.
        record: run in float64 without rounding and record each claimed intermediate's
            magnitudes (`Emulation.stats`): the figures that name a mechanism.
        block_entries: score entries per query block (memory bound); default by device
            (`DEFAULT_BLOCK_ENTRIES`).
        heads_in_running_sum: under ``grads_accumulated``, the query heads of a GQA group add into
            one running dk and dv (a kernel that reduces the group itself, e.g. PyTorch's CPU flash
            kernel with ``enable_gqa``); else each head's gradient is accumulated on its own and
            the heads are summed after (k and v expanded over the group before the kernel).

    Returns:
        `Emulation`.
    """
    backward = case.backward if backward is None else backward
    device = inputs.q.device
    dtype = getattr(torch, case.dtype)
    work = torch.float64 if record else torch.float32
    holds = design.holds if not record else frozenset()
    claimed = design.holds
    tiny = torch.finfo(dtype).tiny
    stats: dict[str, IntermediateStats] = {name: IntermediateStats() for name in claimed} if record else {}
    if record:
        for name in ("dk_per_head", "dv_per_head", "dq_partial", "dk_partial", "dv_partial"):
            stats[name] = IntermediateStats()
    accumulated = design.claim("grads_accumulated") if backward else None
    if block_entries is None:
        block_entries = DEFAULT_BLOCK_ENTRIES.get(device.type, DEFAULT_BLOCK_ENTRIES["cuda"])

    def rnd(x: torch.Tensor, name: str) -> torch.Tensor:
        if record and name in stats:
            stats[name].add(x, tiny)
        if name in holds:
            return x.to(dtype).to(work)
        return x

    heads, heads_kv = case.num_heads, case.num_heads_kv
    group = heads // heads_kv
    scale = case.softmax_scale
    cap = case.softcap
    ds_name = next((n for n in DS_ROUNDINGS if n in claimed), "ds")
    # ds_scaled_softcap without a softcap rounds the plain dS, as FlashAttention 2 does (oracle.design)
    ds_factor = {"ds": 1.0, "ds_scaled": scale, "ds_scaled_softcap": scale / cap if cap else 1.0}[ds_name]
    rest = scale / ds_factor  # what the GEMM results x @ k and x^T @ q are multiplied by

    spread_scores = record and "scores" in claimed
    two_u = float(torch.finfo(dtype).eps)  # 2u: the spacing of the dtype relative to a value
    spread_out = torch.zeros(inputs.q.shape[:-1] + (case.head_dim_v,), dtype=work, device=device) if spread_scores else None
    spread_lse = torch.zeros(inputs.q.shape[:-1], dtype=work, device=device) if spread_scores else None
    out_all = torch.zeros(inputs.q.shape[:-1] + (case.head_dim_v,), dtype=work, device=device)
    lse_rows = torch.full(inputs.q.shape[:-1], -math.inf, dtype=work, device=device)  # [.., Sq, H]
    dq_all = torch.zeros(inputs.q.shape, dtype=work, device=device) if backward else None
    dk_all = torch.zeros(inputs.k.shape, dtype=work, device=device) if backward else None
    dv_all = torch.zeros(inputs.v.shape, dtype=work, device=device) if backward else None
    dout = inputs.dout if backward else None

    for iq, ik in _sequences(case):
        q = inputs.q[iq].to(work)  # [Sq, H, D]
        k = inputs.k[ik].to(work)  # [Sk, Hkv, D]
        v = inputs.v[ik].to(work)
        len_q, len_k = q.shape[0], k.shape[0]
        lo, hi = key_bounds(case, len_q, len_k, device)
        # [Hkv, G, Sq, D] and [Hkv, Sk, D]
        qg = q.reshape(len_q, heads_kv, group, -1).permute(1, 2, 0, 3)
        kg = k.permute(1, 0, 2)
        vg = v.permute(1, 0, 2)
        do = dout[iq].to(work).reshape(len_q, heads_kv, group, -1).permute(1, 2, 0, 3) if backward else None
        cols = torch.arange(len_k, device=device)
        rows_per_block = max(1, block_entries // max(1, heads * len_k))
        out_g = torch.zeros(heads_kv, group, len_q, case.head_dim_v, dtype=work, device=device)
        lse_g = torch.full((heads_kv, group, len_q), -math.inf, dtype=work, device=device)
        spread_og = torch.zeros_like(out_g) if spread_scores else None
        spread_lg = torch.zeros(heads_kv, group, len_q, dtype=work, device=device) if spread_scores else None
        dq_g = torch.zeros_like(qg) if backward else None
        dk_h = torch.zeros(heads_kv, group, len_k, case.head_dim, dtype=work, device=device) if backward else None
        dv_h = torch.zeros(heads_kv, group, len_k, case.head_dim_v, dtype=work, device=device) if backward else None
        # grads_accumulated: the GEMM inputs of the whole sequence, summed in the kernel's order after the blocks
        x_all = torch.zeros(heads_kv, group, len_q, len_k, dtype=work, device=device) if accumulated else None
        p_all = torch.zeros_like(x_all) if accumulated else None
        for i0 in range(0, len_q, rows_per_block):
            i1 = min(len_q, i0 + rows_per_block)
            visible = (cols[None, :] >= lo[i0:i1, None]) & (cols[None, :] < hi[i0:i1, None])  # [r, Sk]
            s = torch.matmul(qg[:, :, i0:i1], kg[:, None].transpose(-1, -2)) * scale  # [Hkv, G, r, Sk]
            s = rnd(s, "scores")
            if cap is not None:
                t = torch.tanh(s / cap)
                s = cap * t
                if "scores" in holds:  # the capped scores are written in the dtype too
                    s = s.to(dtype).to(work)
            s = s.masked_fill(~visible, -math.inf)
            m = s.amax(-1, keepdim=True)
            m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(s - m_safe)
            total = e.sum(-1, keepdim=True)
            p = torch.where(total > 0, e / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(e))
            if "flush_to_zero" in claimed:
                if record:
                    stats["flush_to_zero"].add(p, FLOAT32_TINY)
                else:
                    p = torch.where(p < FLOAT32_TINY, 0.0, p)
            lse_g[:, :, i0:i1] = torch.where(total[..., 0] > 0, (m_safe + torch.log(total))[..., 0], -math.inf)
            p_r = rnd(p, "probs")
            o = torch.matmul(p_r, vg[:, None])  # [Hkv, G, r, Dv]
            out_g[:, :, i0:i1] = o
            if spread_scores:  # the Emulation.spread bound of one ulp of the row's most sensitive score
                w = torch.where(visible, p * s.abs() * two_u, 0.0).amax(-1, keepdim=True)  # [Hkv, G, r, 1]
                spread_lg[:, :, i0:i1] = w[..., 0]
                spread_og[:, :, i0:i1] = w * (vg.abs().amax(-2)[:, None, None, :] + o.abs())
            if not backward:
                continue
            o_r = o.to(dtype).to(work) if not record else o
            do_blk = do[:, :, i0:i1]
            dp = torch.matmul(do_blk, vg[:, None].transpose(-1, -2))
            dp = rnd(dp, "dp")
            p_b = rnd(p, "probs_for_ds")
            if "delta_from_dp" in claimed:
                d = (p_b * dp).sum(-1, keepdim=True)
            else:
                d = (do_blk * o_r).sum(-1, keepdim=True)
            ds = torch.where(visible, p_b * (dp - d), 0.0)  # a kernel computes no dS of a masked key
            if "flush_to_zero" in claimed and not record:
                ds = torch.where(ds.abs() < FLOAT32_TINY, 0.0, ds)
            if cap is not None:
                ds = ds * (1 - t * t)
            x = rnd(ds * ds_factor, ds_name)  # rounded only where the design claims it
            if accumulated is not None:
                x_all[:, :, i0:i1] = x
                p_all[:, :, i0:i1] = p_r
                continue
            dq_g[:, :, i0:i1] = torch.matmul(x, kg[:, None])
            dk_h += torch.matmul(x.transpose(-1, -2), qg[:, :, i0:i1])
            dv_h += torch.matmul(p_r.transpose(-1, -2), do_blk)
        if accumulated is not None:
            dq_g, dk_s, dv_s = _accumulate_in_blocks(
                x_all, p_all, qg, kg, vg, do, rest, accumulated.query_block(len_q), accumulated.block_k,
                {name: _partial_rounding(rnd, stats.get(f"{name}_partial"), tiny) for name in ("dq", "dk", "dv")},
                heads_in_running_sum=heads_in_running_sum,
                rnd_head=lambda t: rnd(t, "gqa_grads_per_head") if "gqa_grads_per_head" in claimed else t,
            )
            dq_all[iq] = dq_g.permute(2, 0, 1, 3).reshape(len_q, heads, -1)
            dk_all[ik] = dk_s.permute(1, 0, 2)
            dv_all[ik] = dv_s.permute(1, 0, 2)
        elif backward:
            # the GEMM results (x @ k, x^T @ q, summed over the query blocks in float32) times what
            # is left of softmax_scale; with pre_scale_grads they are written in the dtype first
            dq_g = rnd(dq_g, "pre_scale_grads")
            dk_h = rnd(dk_h, "pre_scale_grads")
            dq_g = dq_g * rest
            dk_h = dk_h * rest
            if record:
                stats["dk_per_head"].add(dk_h, tiny)
                stats["dv_per_head"].add(dv_h, tiny)
            if "gqa_grads_per_head" in claimed and group > 1:
                dk_h = rnd(dk_h, "gqa_grads_per_head")
                dv_h = rnd(dv_h, "gqa_grads_per_head")
            dk_s = dk_h.sum(1)  # [Hkv, Sk, D]
            dv_s = dv_h.sum(1)
            dq_all[iq] = dq_g.permute(2, 0, 1, 3).reshape(len_q, heads, -1)
            dk_all[ik] = dk_s.permute(1, 0, 2)
            dv_all[ik] = dv_s.permute(1, 0, 2)
        out_all[iq] = out_g.permute(2, 0, 1, 3).reshape(len_q, heads, -1)
        lse_rows[iq] = lse_g.permute(2, 0, 1).reshape(len_q, heads)
        if spread_scores:
            spread_out[iq] = spread_og.permute(2, 0, 1, 3).reshape(len_q, heads, -1)
            spread_lse[iq] = spread_lg.permute(2, 0, 1).reshape(len_q, heads)

    if case.is_varlen:
        lse = lse_rows.permute(1, 0)  # [H, total_q]
    else:
        lse = lse_rows.permute(0, 2, 1)  # [B, H, Sq]
    if record:
        spread = {}
        if spread_scores:
            spread = {"out": spread_out, "lse": (spread_lse.permute(1, 0) if case.is_varlen else spread_lse.permute(0, 2, 1)).contiguous()}
        return Emulation(out_all, lse.contiguous(), dq_all, dk_all, dv_all, stats, spread)

    def to_dtype(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x.to(dtype)

    return Emulation(to_dtype(out_all), lse.to(torch.float32).contiguous(), to_dtype(dq_all), to_dtype(dk_all), to_dtype(dv_all))


# --------------------------------------------------------------------------- the rule
@dataclass(frozen=True)
class RuleFigures:
    """`design_rule` of one tensor.

    Attributes:
        ratio: ``||A - R|| / (FA_RULE_FACTOR ||E - R|| + allowed)`` at the worst place (the whole
            tensor or a tile), over the entries finite in both; ``<= 1`` holds.
        nonfinite_outside: entries non-finite in the kernel (unexpectedly: NaN, or an infinity
            the oracle does not accept) where the emulation is finite.
        nonfinite_kernel: the kernel's unexpected non-finite entries.
        nonfinite_emulation: the emulation's.
    """

    ratio: float
    nonfinite_outside: int
    nonfinite_kernel: int
    nonfinite_emulation: int

    @property
    def holds(self) -> bool:
        return self.ratio <= 1.0 and self.nonfinite_in_place

    @property
    def nonfinite_in_place(self) -> bool:
        """The kernel's unexpected non-finite entries lie where the emulation has them (within
        `NONFINITE_SLACK`)."""
        slack = max(2, int(NONFINITE_SLACK * self.nonfinite_kernel))
        return self.nonfinite_outside <= slack

    def to_json(self) -> dict[str, Any]:
        from oracle.compare import json_float

        return {
            "ratio": json_float(self.ratio), "holds": self.holds, "nonfinite_outside": self.nonfinite_outside,
            "nonfinite_kernel": self.nonfinite_kernel, "nonfinite_emulation": self.nonfinite_emulation,
        }


@torch.inference_mode()
def design_rule(prepared: Any, actual: torch.Tensor, emulated: torch.Tensor, spread: torch.Tensor | None = None) -> RuleFigures:
    """FlashAttention's test rule of a kernel tensor against the emulation of its design (the
    module docstring): float64 sums on the reference's device.

    Args:
        prepared: the tensor's `oracle.compare.PreparedTensor`.
        actual: the kernel's tensor (the reference's shape).
        emulated: the emulation's tensor (the same shape).
        spread: `Emulation.spread` of the tensor (the same shape) or None: added to the
            emulation's error (``||A - R|| <= 2 (||E - R|| + ||spread||) + allowed``, per tile and
            over the tensor).

    Returns:
        `RuleFigures`; a shape that differs from the reference's gives an infinite ratio.
    """
    from oracle.compare import _non_finite_masks

    p = prepared
    if tuple(actual.shape) != p.shape or tuple(emulated.shape) != p.shape:
        return RuleFigures(math.inf, 0, 0, 0)
    a = p.to_grid_float64(actual)
    e = p.to_grid_float64(emulated)
    judged = p.ref_finite if p.judged is None else p.judged
    _, a_nan, a_pos, a_neg, _ = _non_finite_masks(p, a)
    _, e_nan, e_pos, e_neg, _ = _non_finite_masks(p, e)
    a_bad = a_nan | a_pos | a_neg
    e_bad = e_nan | e_pos | e_neg
    both = judged & torch.isfinite(a) & torch.isfinite(e)
    ek2 = torch.where(both, (a - p.ref_v).square(), 0.0).sum(-1)
    ee2 = torch.where(both, (e - p.ref_v).square(), 0.0).sum(-1)
    if spread is not None and tuple(spread.shape) == p.shape:
        sp = p.to_grid_float64(spread)
        sp2 = torch.where(judged & torch.isfinite(sp), sp.square(), 0.0).sum(-1)
        ee2_spread = (ee2.sqrt() + sp2.sqrt()).square()  # per row: the emulation's error plus the spread
        ee2 = ee2_spread
    ek_t, ee_t = p.tiles(ek2).sqrt(), p.tiles(ee2).sqrt()
    bound_t = FA_RULE_FACTOR * ee_t + p.allowed_tiles
    ratio_t = torch.where(ek_t > 0, ek_t / bound_t, torch.zeros_like(ek_t))
    figures = torch.stack([
        ek2.sum().sqrt(), ee2.sum().sqrt(), ratio_t.max() if ratio_t.numel() else torch.zeros((), dtype=ek2.dtype, device=ek2.device),
        (a_bad & ~e_bad).sum().to(torch.float64), a_bad.sum().to(torch.float64), e_bad.sum().to(torch.float64),
    ]).tolist()
    ek_g, ee_g, worst_tile, outside, bad_a, bad_e = figures
    ratio_g = ek_g / (FA_RULE_FACTOR * ee_g + p.allowed_global) if ek_g > 0 else 0.0
    return RuleFigures(max(ratio_g, worst_tile), int(outside), int(bad_a), int(bad_e))


# --------------------------------------------------------------------------- the explanation
LIMIT_KINDS = ("limit", "unjudgeable")
"""Signature kinds of a failure a correct kernel of the backend's design shares
(``<tensor>:limit``) or cannot be judged on (``<tensor>:unjudgeable``)."""
PRECISION_KINDS = frozenset({"mismatch", "tile_mismatch"})
"""Kinds of a failure that may be the design's limit even where its emulation passes the oracle:
a kernel error within FlashAttention's rule (at most twice the emulation's plus the allowance) is
one its own test suite accepts, the emulation's error being near the allowance (a non-finite,
all-zero or shape failure needs the emulation to fail the same way)."""
NEVER_A_LIMIT = frozenset({"shape", "finite_on_masked"})
"""Kinds no design explains: a wrong shape, a finite lse on a row that sees no key."""


@dataclass(frozen=True)
class Explanation:
    """What `explain_failure` found for one failing kernel result.

    Attributes:
        design: the design emulated.
        verdict: ``"defect"`` (some failing tensor is worse than the design's emulation),
            ``"limit"`` (every failing tensor is within the rule and the emulation fails it
            too) or ``"unjudgeable"`` (a limit whose intermediate is beyond any first-order bound).
        explained: failing tensor -> ``"limit"`` or ``"unjudgeable"``, for those within the rule.
        why: the mechanism in a sentence ("" for a defect).
        mechanism: the intermediate named (None for a defect).
        emulation: the emulation's oracle verdict (`oracle.compare.Verdict.to_json`, short).
        rule: per failing tensor, `RuleFigures.to_json`.
        intermediates: per claimed intermediate, the float64 magnitudes (`IntermediateStats`).
        signatures: the result's signatures after the explanation: unexplained ones first (as the
            oracle ordered them), then ``<tensor>:limit``/``<tensor>:unjudgeable``.
    """

    design: Design
    verdict: str
    explained: dict[str, str]
    why: str
    mechanism: str | None
    emulation: dict[str, Any]
    rule: dict[str, dict[str, Any]]
    intermediates: dict[str, dict[str, Any]]
    signatures: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "design": self.design.name,
            "design_summary": self.design.summary,
            "verdict": self.verdict,
            "explained": dict(self.explained),
            "why": self.why,
            "mechanism": self.mechanism,
            "source": self.design.source_of(self.mechanism) if self.mechanism else "",
            "emulation": self.emulation,
            "rule": self.rule,
            "intermediates": self.intermediates,
        }


def _fmt(x: float) -> str:
    """A magnitude for a sentence: ``65,504``, ``2.4e5``, ``0.00041``."""
    if not math.isfinite(x):
        return "inf" if x > 0 else ("-inf" if x < 0 else "nan")
    if 1e3 <= abs(x) < 1e5:
        return f"{x:,.0f}"
    return f"{x:.2g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def _what(name: str, tensor: str, phrase) -> str:
    """How a sentence names intermediate ``name`` where it moves ``tensor``."""
    if name == "gqa_grads_per_head":
        return f"per-head {tensor}"
    if name == "grads_accumulated":
        return f"partial sums of {tensor} (accumulated block by block in the dtype)"
    return phrase(name)


def _mechanism(
    case: AttentionCase, tensor: str, design: Design, stats: dict[str, IntermediateStats], sufficient: list[str] | None = None
) -> tuple[str | None, str, bool]:
    """``(intermediate, sentence, beyond first order)`` naming why ``tensor`` of a correct kernel
    of ``design`` fails on this case, from the float64 magnitudes; among ``sufficient`` (the
    claims whose rounding alone makes the emulation fail the tensor, `explain_failure`) when
    some are."""
    dtype = getattr(torch, case.dtype)
    info = torch.finfo(dtype)
    largest, tiny, u = float(info.max), float(info.tiny), float(info.eps) / 2
    reach = [n for n in REACHES.get(tensor, ()) if n in design.holds]

    def phrase(name: str) -> str:
        if name == "ds_scaled_softcap" and case.softcap is None:
            return PHRASES["ds"]  # the plain dS without a softcap
        return PHRASES[name]

    def figures(name: str) -> IntermediateStats:
        if name == "gqa_grads_per_head" and tensor in ("dk", "dv"):
            return stats.get(f"{tensor}_per_head", IntermediateStats())
        if name == "grads_accumulated" and tensor in ("dq", "dk", "dv"):
            return stats.get(f"{tensor}_partial", IntermediateStats())
        return stats.get(name, IntermediateStats())

    # beyond any first-order bound: decided on every claim that reaches the tensor, so that the
    # signature (limit or unjudgeable) does not depend on whether the mechanism was ablated
    scores = figures("scores")
    beyond = "scores" in reach and 2 * u * scores.max_abs >= 1.0
    if sufficient:
        reach = [n for n in reach if n in sufficient] or reach

    over = sorted(((figures(n).max_abs, n) for n in reach if figures(n).max_abs > largest), reverse=True)
    if over:
        parts = []
        for value, name in over:
            what = _what(name, tensor, phrase)
            where = " before the GQA sum" if name == "gqa_grads_per_head" else ""
            parts.append(f"{what} up to {_fmt(value)}{where}")
        return over[0][1], f"{', '.join(parts)} > {case.dtype} max {_fmt(largest)}", beyond
    if beyond:
        spacing = 2.0 ** math.floor(math.log2(scores.max_abs)) * 2 * u
        return "scores", (f"{case.dtype} scores up to {_fmt(scores.max_abs)}: spacing {_fmt(spacing)} nat there, "
                          "beyond any first-order error bound"), True
    sub = [(figures(n).below_normal_share, n) for n in reach if figures(n).below_normal_share >= SUBNORMAL_SHARE]
    if sub:
        share, name = max(sub)
        if name == "flush_to_zero":
            return name, (f"float32 P below float32's smallest normal {_fmt(FLOAT32_TINY)} in {share:.2g} of its "
                          "non-zero entries, flushed to zero"), beyond
        what = _what(name, tensor, phrase)
        return name, f"{what} below {case.dtype}'s smallest normal {_fmt(tiny)} in {share:.0%} of its non-zero entries", False
    if reach:
        value, name = max((figures(n).max_abs * u, n) for n in reach)
        what = _what(name, tensor, phrase)
        unit = " nat" if name == "scores" else ""
        return name, f"rounding of {what} to {case.dtype} (up to {_fmt(figures(name).max_abs)}, spacing {_fmt(2 * value)}{unit} there)", False
    return None, f"the {case.dtype} rounding of the design's outputs", False


def _emulation_json(verdict: Any) -> dict[str, Any]:
    from oracle.compare import json_float

    return {
        "passed": verdict.passed,
        "signatures": list(verdict.signatures),
        "error_ratio": json_float(verdict.error_ratio),
        "tensors": {n: {"signatures": list(t.signatures), "error_ratio": json_float(t.error_ratio),
                        "nan_count": t.nan_count, "posinf_count": t.posinf_count, "neginf_count": t.neginf_count}
                    for n, t in verdict.tensors.items()},
    }


def _sufficient_claims(case: AttentionCase, prepared_reference: Any, inputs: Any, design: Design, tensor: str, cache: dict) -> list[str]:
    """The claims of ``design`` that reach ``tensor`` and whose rounding alone (every other step in
    float32) makes the emulation fail ``tensor`` on this case: the mechanism's candidates. Each
    single-claim emulation is run once per case (cached); none when one claim reaches the tensor."""
    from oracle.compare import compare_outputs

    reach = [c for c in design.claims if c.intermediate in REACHES.get(tensor, ())]
    if len(reach) < 2:
        return [c.intermediate for c in reach]
    found = []
    for claim in reach:
        key = ("single", claim.intermediate, case.dtype)
        if key not in cache:
            single = Design(f"{design.name}/{claim.intermediate}", (claim,))
            emu = emulate(case, inputs, single, backward=tensor in ("dq", "dk", "dv"))
            names = ("out", "dq", "dk", "dv") if tensor != "lse" else ("out", "lse")
            given = {n: t for n, t in emu.tensors().items() if n in names and t is not None}
            cache[key] = compare_outputs(case, prepared_reference, **given)
        verdict = cache[key].tensors.get(tensor)
        if verdict is not None and not verdict.passed:
            found.append(claim.intermediate)
    return found


GRADIENTS = ("dq", "dk", "dv")
"""The tensors of the backward pass: an emulation runs it only where one of them is judged."""


def design_for(design: Design, tensors: list[str] | tuple[str, ...]) -> Design:
    """``design`` with only the claims that reach some tensor of ``tensors``
    (`oracle.design.REACHES`): an emulation of it gives those tensors exactly as the whole
    design's emulation does (the other intermediates do not enter them), for less work (no
    backward pass where only ``out``/``lse`` are asked)."""
    reach = {name for tensor in tensors for name in REACHES.get(tensor, ())}
    claims = tuple(c for c in design.claims if c.intermediate in reach)
    if len(claims) == len(design.claims):
        return design
    return Design(design.name, claims, design.summary)


@dataclass(frozen=True)
class _PartialVerdict:
    """The emulation's verdict on the tensors judged (the fields `_emulation_json` reads of an
    `oracle.compare.Verdict`)."""

    tensors: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tensors.values())

    @property
    def signatures(self) -> list[str]:
        return [s for t in self.tensors.values() for s in t.signatures]

    @property
    def error_ratio(self) -> float:
        return max((t.error_ratio for t in self.tensors.values()), default=0.0)


def _partial_verdict(tensors: dict[str, Any]) -> _PartialVerdict:
    return _PartialVerdict(tensors)


def _orders(case: AttentionCase, design: Design, backward: bool) -> tuple[bool, ...]:
    """The orders of a GQA group's sums that a correct kernel of ``design`` may take, as
    `emulate`'s ``heads_in_running_sum``: both where the design accumulates its gradients in the
    dtype (``grads_accumulated``) on a GQA case (the group reduced inside the kernel, or k and v
    expanded before it: one backend's variants do either, and a kernel is a defect only when it
    is worse than every correct order), else the one."""
    if backward and design.claim("grads_accumulated") is not None and case.num_heads != case.num_heads_kv:
        return (True, False)
    return (True,)


def emulation_cache(prepared_reference: Any) -> dict:
    """The per-case cache of emulations and their verdicts, kept on the
    `oracle.compare.PreparedReference` (one per case, shared by its backends)."""
    cache = getattr(prepared_reference, "_design_cache", None)
    if cache is None:
        cache = {}
        prepared_reference._design_cache = cache
    return cache


def explain_failure(
    case: AttentionCase,
    prepared_reference: Any,
    kernel: dict[str, Any],
    verdict: Any,
    design: Design,
    inputs: Any = None,
    *,
    ablate: bool = True,
    complete: bool = True,
) -> Explanation:
    """Tell a defect from the limit of ``design`` for a failing kernel result.

    Args:
        case: the case.
        prepared_reference: its `oracle.compare.PreparedReference` (with ``inputs``, or pass them).
        kernel: the kernel's tensors by name (``out``, ``lse`` after the backend's masked-row
            convention, ``dq``, ``dk``, ``dv``; None where absent), as judged.
        verdict: the kernel's failing `oracle.compare.Verdict`.
        design: the backend's design.
        inputs: the case's `oracle.inputs.AttentionInputs` (default: the prepared reference's).
        ablate: name the mechanism among the claims whose rounding alone makes the emulation
            fail the tensor (one more emulation per claim that reaches it); else from the float64
            magnitudes of every claim alone.
        complete: emulate the whole design and judge every tensor of ``verdict`` (the second
            opinion of a bucket: the emulation's verdict on the case as a whole). Else only the
            failing tensors are emulated and judged, with only the claims that reach them
            (`design_for`): the forward alone where no gradient fails. The verdict on each failing
            tensor is the same either way (an intermediate outside `oracle.design.REACHES` of a
            tensor does not change it, and the emulation judges each tensor on its own).

    Returns:
        `Explanation`. The emulations are computed once per case, set of claims and direction
        (`emulation_cache`: backends whose designs agree on the claims that matter share them),
        each tensor judged once; the float64 magnitudes only when a tensor is within the rule.

    Raises:
        ValueError: no inputs are given or kept with the reference.
    """
    from oracle.compare import compare_outputs_batch

    inputs = prepared_reference.inputs if inputs is None else inputs
    if inputs is None:
        raise ValueError("inputs: explain_failure needs the case's inputs (none kept with the prepared reference)")
    cache = emulation_cache(prepared_reference)
    failing = [n for n, t in verdict.tensors.items() if not t.passed]
    judged = list(verdict.tensors) if complete or not failing else failing
    emulated = design if complete else design_for(design, judged)
    backward = bool(set(judged) & set(GRADIENTS))
    orders = _orders(case, emulated, backward)
    runs = []  # per order of a correct kernel's sums: (emulation, its verdicts by tensor)
    for order in orders:
        key = ("emulation", emulated.emulation_key, backward, order)
        if key not in cache:
            cache[key] = (emulate(case, inputs, emulated, backward=backward, heads_in_running_sum=order), {})
        emu, judged_tensors = cache[key]
        missing = {n: t for n, t in emu.tensors().items() if n in judged and n not in judged_tensors and t is not None}
        if missing:  # each tensor judged on its own (compare_outputs' verdict of a tensor does not depend on the others)
            judged_tensors.update(compare_outputs_batch(case, prepared_reference, [missing])[0].tensors)
        runs.append((emu, judged_tensors))
    emu, first = runs[0]
    emu_verdict = _partial_verdict({n: first[n] for n in judged if n in first})
    explained: dict[str, str] = {}
    rule: dict[str, dict[str, Any]] = {}
    candidates: list[str] = []  # failing tensors the emulation fails too, whose rule does not hold
    why, mechanism = "", None
    skey = ("record", emulated.emulation_key, backward)
    spread: dict[str, torch.Tensor] = {}
    if "scores" in emulated.holds and {"out", "lse"} & set(failing):  # Emulation.spread of the forward
        if skey not in cache:
            cache[skey] = emulate(case, inputs, emulated, backward=backward, record=True)
        spread = cache[skey].spread
    for name in failing:
        tv = verdict.tensors[name]
        actual = kernel.get(name)
        kinds = {s.partition(":")[2] for s in tv.signatures}
        if actual is None or kinds & NEVER_A_LIMIT:
            continue
        best = None
        for order, (run_emu, run_tensors) in zip(orders, runs):
            ev = run_tensors.get(name)
            if ev is None or ("all_zero" in kinds and not ev.is_all_zero):
                continue
            if ev.passed and not kinds <= PRECISION_KINDS:  # only a precision failure passes beside a passing emulation
                continue
            figures = design_rule(prepared_reference.tensor(name), actual, run_emu.tensors()[name], spread.get(name))
            if best is None or (figures.holds, -figures.ratio) > (best[1].holds, -best[1].ratio):
                best = (order, figures)
        if best is None:
            continue
        order, figures = best
        rule[name] = figures.to_json() | ({"heads_in_running_sum": order} if len(orders) > 1 else {})
        if figures.holds:
            explained[name] = "limit"
        elif figures.nonfinite_in_place and "scores" in emulated.holds:
            candidates.append(name)
    intermediates: dict[str, dict[str, Any]] = {}
    if explained or candidates:
        if skey not in cache:
            cache[skey] = emulate(case, inputs, emulated, backward=backward, record=True)
        stats = cache[skey].stats
        # beyond any first-order bound (scores in the dtype at a spacing of a nat or more) the rule
        # against one emulation says nothing: a failure the emulation shares is not judgeable
        for name in candidates:
            if _mechanism(case, name, emulated, stats)[2]:
                explained[name] = "unjudgeable"
    if explained:
        intermediates = {n: s.to_json() for n, s in stats.items()}
        sentences = []
        for name in explained:
            sufficient = _sufficient_claims(case, prepared_reference, inputs, emulated, name, cache) if ablate else None
            mech, sentence, beyond = _mechanism(case, name, emulated, stats, sufficient)
            if beyond:
                explained[name] = "unjudgeable"
            if mechanism is None:
                mechanism = mech
            if sentence not in sentences:
                sentences.append(sentence)
        why = "; ".join(sentences)
    unexplained = [s for s in verdict.signatures if s.partition(":")[0] not in explained]
    limits = [f"{name}:{kind}" for name, kind in explained.items()]
    if unexplained:
        outcome = "defect"
    elif any(k == "unjudgeable" for k in explained.values()):
        outcome = "unjudgeable"
    else:
        outcome = "limit"
    return Explanation(
        design=design, verdict=outcome, explained=explained, why=why if outcome != "defect" or explained else "",
        mechanism=mechanism, emulation=_emulation_json(emu_verdict), rule=rule, intermediates=intermediates,
        signatures=tuple(unexplained + limits),
    )


__all__ = [
    "FA_RULE_FACTOR", "GRADIENTS", "LIMIT_KINDS", "NEVER_A_LIMIT", "NONFINITE_SLACK", "Emulation", "Explanation",
    "IntermediateStats", "RuleFigures", "design_for", "design_rule", "emulate", "emulation_cache", "explain_failure",
]
