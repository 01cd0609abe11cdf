"""Correct attention implementations of four designs, as plugins (``--backend
tests.fuzzer.design_plugins:Fp32Inside``): what issue 34's acceptance fuzzes to show that a correct
kernel of a design that holds intermediates in the dtype gets no ``wrong`` bucket.

* `Fp32Inside` ("design-fp32"): q, k, v cast to float32 first; everything in float32 (autograd);
  out and the gradients rounded to the dtype at the end. Declares no intermediate in the dtype.
* `FlashStyle` ("design-flash"): FlashAttention-2's Algorithm 2 written out (arXiv:2307.08691):
  float32 scores and accumulators, ``P`` rounded to the dtype before ``P @ V`` and ``P^T dO``,
  ``dS`` rounded to the dtype before ``dS k`` and ``dS^T q``, per-query-head dk and dv written
  in the dtype before the GQA sum (as flash-attention 2's ``dk_expanded`` does).
* `TEUnfusedStyle` ("design-te-unfused"): TransformerEngine's ``UnfusedDotProductAttention``
  structure in PyTorch ops of the dtype: k and v expanded over the GQA group in the dtype, scores
  by ``torch.baddbmm(alpha=softmax_scale)`` in the dtype, the softmax in float32 rounded to the
  dtype, ``P @ V`` in the dtype; backward by autograd (so ``dP``, ``dS`` and the GEMM results
  before the ``alpha`` scaling are in the dtype).
* `GqaExpandInDtype` ("design-gqa-fp16"): the implementation a user wrote in issue 34: k and v
  expanded over the GQA group in the dtype, then cast to float32; float32 inside; backward by
  autograd (so the per-head dk and dv are rounded to the dtype and summed by
  ``repeat_interleave``'s backward in the dtype). Declares no design: it is emulated as
  `oracle.design.UNDECLARED`.

Masks come from `oracle.masks.visible_mask` (causal in both alignments, windows); softcap where
the design has one. Dense layouts only; small cases (``max_seqlen`` 512).
"""

from __future__ import annotations

import math

import torch

from fuzzer.backends.base import Backend, BackendOutput, Capabilities, run_with_grad
from oracle.design import Claim, Design
from oracle.masks import visible_mask

HERE = "tests/fuzzer/design_plugins.py"

CAPS = Capabilities(
    dtypes=("float32", "bfloat16", "float16"),
    qkv_formats=("bshd", "sbhd"),
    max_head_dim=256,
    head_dim_v_differs=True,
    windows=True,
    softcap=True,
    lse=True,
    max_seqlen=512,
)


def _mask(case, device) -> torch.Tensor:
    """``[sq, sk]`` bool: True where a query sees a key."""
    return visible_mask(case, case.seqlen_q, case.seqlen_k, device)


def _softmax_lse(s: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 softmax over the last dim of masked scores, and its natural-log lse (``-inf``,
    ``P = 0`` on a row that sees no key)."""
    s = s.masked_fill(~mask, -math.inf)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    p = torch.where(total > 0, e / total.clamp(min=torch.finfo(s.dtype).tiny), torch.zeros_like(e))
    lse = torch.where(total[..., 0] > 0, (m + torch.log(total))[..., 0], torch.full_like(m[..., 0], -math.inf))
    return p, lse


class Fp32Inside(Backend):
    """Everything in float32 (see the module docstring)."""

    name = "design-fp32"
    variants = ("default",)
    environment = "design-plugins"
    capabilities = CAPS
    design = Design("fp32-inside", (), "q, k, v cast to float32 first; every step in float32")

    def run(self, case, inputs, variant):
        group = case.num_heads // case.num_heads_kv

        def fn(q, k, v):
            q32, k32, v32 = q.float(), k.float().repeat_interleave(group, 2), v.float().repeat_interleave(group, 2)
            s = torch.einsum("bqhd,bkhd->bhqk", q32, k32) * case.softmax_scale
            if case.softcap is not None:
                s = case.softcap * torch.tanh(s / case.softcap)
            p, lse = _softmax_lse(s, _mask(case, q.device))
            out = torch.einsum("bhqk,bkhd->bqhd", p, v32)
            return out.to(q.dtype), lse

        out, lse, dq, dk, dv = run_with_grad(fn, case, inputs)
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv)


class _FlashFunction(torch.autograd.Function):
    """FlashAttention-2's forward and backward, dense (FA2 paper Algorithm 1 and 2)."""

    @staticmethod
    def forward(ctx, q, k, v, case):
        dtype = q.dtype
        group = case.num_heads // case.num_heads_kv
        q32, k32, v32 = q.float(), k.float().repeat_interleave(group, 2), v.float().repeat_interleave(group, 2)
        raw = torch.einsum("bqhd,bkhd->bhqk", q32, k32) * case.softmax_scale
        s = case.softcap * torch.tanh(raw / case.softcap) if case.softcap is not None else raw
        p, lse = _softmax_lse(s, _mask(case, q.device))
        p_r = p.to(dtype).float()  # P in the dtype for the P @ V GEMM
        out = torch.einsum("bhqk,bkhd->bqhd", p_r, v32).to(dtype)
        ctx.save_for_backward(q, k, v, out, raw, p, p_r)
        ctx.case = case
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, raw, p, p_r = ctx.saved_tensors
        case = ctx.case
        dtype = q.dtype
        group = case.num_heads // case.num_heads_kv
        q32, k32, v32 = q.float(), k.float().repeat_interleave(group, 2), v.float().repeat_interleave(group, 2)
        do = dout.float()
        dp = torch.einsum("bqhd,bkhd->bhqk", do, v32)
        d = (do * out.float()).sum(-1).permute(0, 2, 1)[..., None]  # D from the rounded out
        ds = p * (dp - d)
        if case.softcap is not None:
            ds = ds * (1 - torch.tanh(raw / case.softcap) ** 2)
        ds_r = ds.to(dtype).float()  # dS in the dtype for the dq and dk GEMMs
        dq = torch.einsum("bhqk,bkhd->bqhd", ds_r, k32) * case.softmax_scale
        dk_heads = (torch.einsum("bhqk,bqhd->bkhd", ds_r, q32) * case.softmax_scale).to(dtype)  # per query head, dtype
        dv_heads = torch.einsum("bhqk,bqhd->bkhd", p_r, do).to(dtype)
        b, sk = k.shape[0], k.shape[1]
        dk = dk_heads.float().view(b, sk, case.num_heads_kv, group, -1).sum(3)
        dv = dv_heads.float().view(b, sk, case.num_heads_kv, group, -1).sum(3)
        return dq.to(dtype), dk.to(dtype), dv.to(dtype), None


class FlashStyle(Backend):
    """FlashAttention-2's numerics, written out (see the module docstring)."""

    name = "design-flash"
    variants = ("default",)
    environment = "design-plugins"
    capabilities = CAPS
    design = Design(
        "flash-per-head",
        (
            Claim("probs", f"{HERE}: _FlashFunction.forward, p.to(dtype) before the P @ V einsum"),
            Claim("ds", f"{HERE}: _FlashFunction.backward, ds.to(dtype) before the dq and dk einsums"),
            Claim("gqa_grads_per_head", f"{HERE}: _FlashFunction.backward, dk_heads and dv_heads .to(dtype) before the sum"),
        ),
        "FlashAttention-2 numerics with per-query-head dk and dv in the dtype before the GQA sum",
    )

    def run(self, case, inputs, variant):
        out, lse, dq, dk, dv = run_with_grad(lambda q, k, v: _FlashFunction.apply(q, k, v, case), case, inputs)
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv)


class TEUnfusedStyle(Backend):
    """TransformerEngine's unfused attention structure (see the module docstring)."""

    name = "design-te-unfused"
    variants = ("default",)
    environment = "design-plugins"
    capabilities = Capabilities(**{**CAPS.__dict__, "softcap": False, "lse": False})  # TE's unfused path returns no lse
    design = Design(
        "te-unfused-style",
        (
            Claim("scores", f"{HERE}: TEUnfusedStyle.run, torch.baddbmm(alpha=softmax_scale) with a dtype output"),
            Claim("probs", f"{HERE}: TEUnfusedStyle.run, the float32 softmax rounded to the dtype"),
            Claim("dp", f"{HERE}: autograd of torch.bmm(p, v) in the dtype: dP = dO v^T in the dtype"),
            Claim("delta_from_dp", f"{HERE}: autograd of torch.softmax: D = rowsum(P * dP)"),
            Claim("ds", f"{HERE}: autograd of the dtype softmax: dS in the dtype"),
            Claim("pre_scale_grads", f"{HERE}: autograd of baddbmm: the bmm result in the dtype before * alpha"),
            Claim("gqa_grads_per_head", f"{HERE}: k.repeat_interleave in the dtype: per-head gradients summed in the dtype"),
        ),
        "scores, P, dP and dS in the dtype; GEMM results rounded before the scaling; GQA expansion in the dtype",
    )

    def run(self, case, inputs, variant):
        group = case.num_heads // case.num_heads_kv

        def fn(q, k, v):
            b, sq, h, d = q.shape
            sk = k.shape[1]
            ke, ve = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
            qb = q.permute(0, 2, 1, 3).reshape(b * h, sq, d)
            kb = ke.permute(0, 2, 1, 3).reshape(b * h, sk, d)
            vb = ve.permute(0, 2, 1, 3).reshape(b * h, sk, -1)
            empty = torch.empty(b * h, sq, sk, dtype=q.dtype, device=q.device)
            s = torch.baddbmm(empty, qb, kb.transpose(1, 2), beta=0.0, alpha=case.softmax_scale)
            mask = _mask(case, q.device)
            s32 = s.float().masked_fill(~mask, -math.inf)
            m = s32.amax(-1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(s32 - m)
            total = e.sum(-1, keepdim=True)
            p = torch.softmax(s32.masked_fill(~mask, -1e30), -1).masked_fill(~mask, 0.0)
            p = torch.where(total > 0, p, torch.zeros_like(p)).to(q.dtype)
            out = torch.bmm(p, vb).view(b, h, sq, -1).permute(0, 2, 1, 3)
            return out, None

        out, _, dq, dk, dv = run_with_grad(fn, case, inputs)
        return BackendOutput(out=out.contiguous(), dq=dq, dk=dk, dv=dv)


class GqaExpandInDtype(Backend):
    """k and v expanded over the GQA group in the dtype, float32 inside; no design declared (see
    the module docstring)."""

    name = "design-gqa-fp16"
    variants = ("default",)
    environment = "design-plugins"
    capabilities = CAPS

    def run(self, case, inputs, variant):
        group = case.num_heads // case.num_heads_kv

        def fn(q, k, v):
            ke, ve = k.repeat_interleave(group, 2).float(), v.repeat_interleave(group, 2).float()
            s = torch.einsum("bqhd,bkhd->bhqk", q.float(), ke) * case.softmax_scale
            if case.softcap is not None:
                s = case.softcap * torch.tanh(s / case.softcap)
            p, lse = _softmax_lse(s, _mask(case, q.device))
            return torch.einsum("bhqk,bkhd->bqhd", p, ve).to(q.dtype), lse

        out, lse, dq, dk, dv = run_with_grad(fn, case, inputs)
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv)
