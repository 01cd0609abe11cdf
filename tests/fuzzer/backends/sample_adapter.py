"""A sample plugin backend, written the way a user writes one: one file, loaded by attnfuzz through
the plugin mechanism (``--backend tests.fuzzer.backends.sample_adapter:SampleBackend``, or the
same string as an ``attnfuzz.backends`` entry point), never imported by attnfuzz itself.

It is plain float32 attention on the CPU (``softmax(q kᵀ * softmax_scale) v``, lse the natural-log
logsumexp of the scaled scores), with two equivalent encodings of the causal mask:

* ``bool_mask``: a ``[seqlen_q, seqlen_k]`` bool tensor of the visible keys;
* ``additive_bias``: a float32 ``[seqlen_q, seqlen_k]`` bias, 0 where visible and ``-inf``
  elsewhere.

It declares a deliberately narrow `Capabilities` block (bfloat16 and bshd only, no GQA, no windows, no
softcap, ``head_dim <= 128``) so that the contract suite (`tests/fuzzer/backends/test_contract.py`) has
something to find outside the declaration. Rows without a visible key (bottom-right alignment with
``seqlen_q > seqlen_k``) give ``out = 0`` and ``lse = -inf``, attnfuzz's convention.
"""

from __future__ import annotations

import math

from fuzzer.backends.base import Backend, BackendOutput, Capabilities, ReproCall, run_with_grad


def visible_keys(seqlen_q: int, seqlen_k: int, causal: bool, causal_alignment: str):
    """``[seqlen_q, seqlen_k]`` bool: key j is visible from query i (causal: ``j <= i + offset``,
    offset 0 for top_left, ``seqlen_k - seqlen_q`` for bottom_right; non-causal: all)."""
    import torch

    if not causal:
        return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    offset = seqlen_k - seqlen_q if causal_alignment == "bottom_right" else 0
    rows = torch.arange(seqlen_q).unsqueeze(1)
    cols = torch.arange(seqlen_k).unsqueeze(0)
    return cols <= rows + offset


def attention(q, k, v, visible, softmax_scale: float, variant: str):
    """Float32 attention of bshd tensors.

    Args:
        q: ``[batch_size, seqlen_q, num_heads, head_dim]``, any float dtype.
        k: ``[batch_size, seqlen_k, num_heads, head_dim]``.
        v: ``[batch_size, seqlen_k, num_heads, head_dim_v]``.
        visible: ``[seqlen_q, seqlen_k]`` bool.
        softmax_scale: multiplies q·kᵀ.
        variant: ``"bool_mask"`` or ``"additive_bias"`` (how ``visible`` is applied).

    Returns:
        ``(out, lse)``: out ``[batch_size, seqlen_q, num_heads, head_dim_v]`` in q's dtype, lse
        ``[batch_size, num_heads, seqlen_q]`` float32.
    """
    import torch

    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * softmax_scale
    if variant == "bool_mask":
        scores = scores.masked_fill(~visible, -math.inf)
    else:
        bias = torch.zeros(visible.shape, dtype=torch.float32).masked_fill(~visible, -math.inf)
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1)
    has_key = visible.any(dim=-1, keepdim=True)  # rows without a visible key: out 0, zero gradient
    probs = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1) * has_key
    out = torch.matmul(probs, vf).transpose(1, 2).to(q.dtype)
    return out, lse


class SampleBackend(Backend):
    """Float32 CPU attention with a bool-mask and an additive-bias encoding of the causal mask."""

    name = "sample-plugin"
    variants = ("bool_mask", "additive_bias")
    device = "cpu"
    packages = ("torch",)
    capabilities = Capabilities(
        dtypes=("bfloat16",),
        qkv_formats=("bshd",),
        max_head_dim=128,
        gqa=False,
        causal_alignments=("top_left", "bottom_right"),
        windows=False,
        softcap=False,
        backward=True,
        lse=True,
        max_seqlen=256,
    )

    def run(self, case, inputs, variant):
        visible = visible_keys(case.seqlen_q, case.seqlen_k, case.causal, case.causal_alignment)

        def call(q, k, v):
            return attention(q, k, v, visible, case.softmax_scale, variant)

        out, lse, dq, dk, dv = run_with_grad(call, case, inputs)
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv)

    def repro(self, case, variant):
        if variant not in self.variants:
            raise ValueError(f"unknown variant {variant!r} of {self.name} (allowed: {', '.join(self.variants)})")
        return ReproCall(source=REPRO_SOURCE, values={"sample_variant": variant}, device="cpu")


REPRO_SOURCE = '''
SAMPLE_VARIANT = $sample_variant


def check_environment():
    pass


def call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k):
    visible = visible_mask(SEQLEN_Q, SEQLEN_K)
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * SOFTMAX_SCALE
    if SAMPLE_VARIANT == "bool_mask":
        scores = scores.masked_fill(~visible, -math.inf)
    else:
        scores = scores + torch.zeros(visible.shape).masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    has_key = visible.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1) * has_key
    return torch.matmul(probs, vf).transpose(1, 2).to(q.dtype), lse
'''
