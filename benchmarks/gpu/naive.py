"""An independent float64 attention for hand checks: every score matrix materialised, the mask
written again from first principles, gradients by torch autograd.

It shares nothing with `oracle.masks` or `oracle.reference` but the case description and the
inputs, so a failure that the oracle and this computation both see is the kernel's, not the
oracle's. `hand_checks.py` compares each bucket's kernel output with it; on 2026-11-29 it agreed
with the oracle to at most 2.9e-13 in every tensor of every bucket of that campaign
(`docs/gpu-campaigns.md`). Small cases only: memory grows with ``seqlen_q * seqlen_k`` per head.
"""

from __future__ import annotations

import math

import torch

from oracle.config import AttentionCase


def visible(i: int, j: int, len_q: int, len_k: int, c: AttentionCase) -> bool:
    """First principles: may query row i of a sequence attend key j of the same sequence."""
    if not 0 <= j < len_k:
        return False
    diag = i + (len_k - len_q if c.causal_alignment == "bottom_right" else 0)
    if c.causal and j > diag:
        return False
    if not c.causal and c.window_size_right is not None and j > diag + c.window_size_right:
        return False
    if c.window_size_left is not None and j < diag - c.window_size_left:
        return False
    return True


def sequences(c: AttentionCase):
    """(q slice, k slice, len_q, len_k, batch index or None) per sequence in the canonical layout."""
    if c.is_varlen:
        oq = ok = 0
        for lq, lk in zip(c.seqlens_q_list, c.seqlens_k_list):
            yield slice(oq, oq + lq), slice(ok, ok + lk), lq, lk, None
            oq, ok = oq + lq, ok + lk
    else:
        for b in range(c.batch_size):
            yield slice(0, c.seqlen_q), slice(0, c.seqlen_k), c.seqlen_q, c.seqlen_k, b


def naive(c: AttentionCase, inputs, backward: bool | None = None) -> dict:
    """Float64 out, lse and (with backward) dq, dk, dv, materialising every score matrix."""
    backward = c.backward if backward is None else backward
    q, k, v = (t.double().clone().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))
    dout = inputs.dout.double()
    group = c.num_heads // c.num_heads_kv
    outs, lses = [], []
    for sq_, sk_, lq, lk, b in sequences(c):
        qq = q[sq_] if b is None else q[b, sq_]
        kk = k[sk_] if b is None else k[b, sk_]
        vv = v[sk_] if b is None else v[b, sk_]
        mask = torch.tensor([[visible(i, j, lq, lk, c) for j in range(lk)] for i in range(lq)], dtype=torch.bool)
        o_heads, l_heads = [], []
        for h in range(c.num_heads):
            hk = h // group
            s = (qq[:, h, :] @ kk[:, hk, :].T) * c.softmax_scale
            if c.softcap is not None:
                s = c.softcap * torch.tanh(s / c.softcap)
            s = torch.where(mask, s, torch.full_like(s, -math.inf))
            m = torch.where(mask.any(1), s.detach().amax(1), torch.zeros(lq, dtype=torch.float64))
            e = torch.exp(s - m[:, None])
            denom = e.sum(1)
            o = (e @ vv[:, hk, :]) / torch.where(denom > 0, denom, torch.ones_like(denom))[:, None]
            o_heads.append(o)
            l_heads.append(m + torch.log(denom))
        outs.append(torch.stack(o_heads, 1))  # [lq, h, dv]
        lses.append(torch.stack(l_heads, 0))  # [h, lq]
    if c.is_varlen:
        out, lse = torch.cat(outs, 0), torch.cat(lses, 1)
    else:
        out, lse = torch.stack(outs, 0), torch.stack(lses, 0)
    res = {"out": out.detach(), "lse": lse.detach()}
    if backward:
        (out * dout).sum().backward()
        res.update(dq=q.grad, dk=k.grad, dv=v.grad)
    return res
