"""Low-precision attention implementations and the measurement that calibrates `oracle.compare`.

Three "kernels" of known quality produce outputs in the canonical layout (`oracle.config`):

* `sdpa_attention(..., backend="math")`: PyTorch ``scaled_dot_product_attention`` with
  ``SDPBackend.MATH`` (boolean mask from `oracle.masks`, ``enable_gqa``); gradients by autograd.
* `sdpa_attention(..., backend="flash")`: PyTorch's CPU flash kernel (``SDPBackend.FLASH_ATTENTION``,
  additive ``-inf`` mask, kv heads repeated for GQA), lse from
  ``aten._scaled_dot_product_flash_attention_for_cpu``.
* `emulated_flash_attention`: FlashAttention-2's numerics in plain torch: fp32 scores and
  accumulators, the unnormalised ``P`` rounded to the dtype before ``P V``, ``dS`` rounded before
  ``dS K`` and ``dS^T Q``, ``D`` from the rounded output, ``lse = +inf`` on empty rows (FA2's
  convention). It covers what SDPA cannot (softcap).

`calibrate` runs random cases through them and reports the largest error ratio per dtype and
tensor with every tolerance factor set to 1; ``benchmarks/oracle_calibrate.py`` prints it. The
module docstring of `oracle.compare` records the figures the factors were set from.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from oracle.config import AttentionCase, torch_dtype
from oracle.inputs import AttentionInputs, make_inputs
from oracle.masks import visible_mask

KERNELS = ("sdpa_math", "sdpa_flash", "emulated_fa2")
EDGE_LENGTHS = (1, 2, 3, 16, 17, 63, 64, 65, 113, 127, 128, 129, 255, 256, 257, 511, 512, 513, 799, 1023, 1024)

Outputs = dict[str, torch.Tensor | None]


def _per_sequence(case: AttentionCase, inputs: AttentionInputs, run) -> Outputs | None:
    """Run a bshd implementation ``run(case, inputs)`` on each thd sequence and concatenate."""
    if not case.is_varlen:
        return run(case, inputs)
    parts: list[Outputs] = []
    q_start = k_start = 0
    for len_q, len_k in zip(case.seqlens_q_list, case.seqlens_k_list):
        sub_case = case.replace(
            qkv_format="bshd", batch_size=1, seqlen_q=len_q, seqlen_k=len_k, seqlens_q=None, seqlens_k=None
        )
        sub_inputs = AttentionInputs(
            q=inputs.q[q_start : q_start + len_q][None],
            k=inputs.k[k_start : k_start + len_k][None],
            v=inputs.v[k_start : k_start + len_k][None],
            dout=inputs.dout[q_start : q_start + len_q][None],
        )
        part = run(sub_case, sub_inputs)
        if part is None:
            return None
        parts.append(part)
        q_start, k_start = q_start + len_q, k_start + len_k
    merged: Outputs = {}
    for name in parts[0]:
        if parts[0][name] is None:
            merged[name] = None
        elif name == "lse":
            merged[name] = torch.cat([p[name][0] for p in parts], dim=1)
        else:
            merged[name] = torch.cat([p[name][0] for p in parts], dim=0)
    return merged


def _mask(case: AttentionCase, device) -> torch.Tensor:
    return visible_mask(case, device=device)  # [seqlen_q, seqlen_k]


def emulated_flash_attention(case: AttentionCase, inputs: AttentionInputs, *, backward: bool = True) -> Outputs:
    """FlashAttention-2's rounding, emulated with fp32 torch ops on materialised scores.

    Args:
        case: the case (any layout; thd runs per sequence).
        inputs: canonical inputs in the case dtype.
        backward: also return dq, dk, dv for ``inputs.dout``.

    Returns:
        ``{"out", "lse", "dq", "dk", "dv"}``: out and grads in the case dtype, lse float32
        (``+inf`` on rows without a visible key); grads None without backward.

    Source: FA2 ``csrc/flash_attn/src/flash_fwd_kernel.h`` (``convert_type<Element>(acc_s)`` before
    the P V gemm) and ``flash_bwd_kernel.h`` (dS converted before the dQ/dK gemms); Dao,
    arXiv:2307.08691, Algorithms 1 and 2.
    """
    return _per_sequence(case, inputs, lambda c, i: _emulated_dense(c, i, backward))


def _emulated_dense(case: AttentionCase, inputs: AttentionInputs, backward: bool) -> Outputs:
    dtype = torch_dtype(case.dtype)
    group = case.group_size
    q = inputs.q.float().transpose(1, 2)  # [B, H, Sq, D]
    k = inputs.k.float().transpose(1, 2).repeat_interleave(group, dim=1)
    v = inputs.v.float().transpose(1, 2).repeat_interleave(group, dim=1)
    raw = (q @ k.transpose(-1, -2)) * case.softmax_scale
    tanh = None
    if case.softcap is not None:
        tanh = torch.tanh(raw / case.softcap)
        scores = case.softcap * tanh
    else:
        scores = raw
    mask = _mask(case, q.device)
    scores = scores.masked_fill(~mask, -math.inf)
    row_max = scores.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
    unnormalised = torch.exp(scores - row_max)
    row_sum = unnormalised.sum(-1, keepdim=True)
    out32 = (unnormalised.to(dtype).float() @ v) / torch.where(row_sum == 0, 1.0, row_sum)
    out = out32.to(dtype)
    lse = torch.where(row_sum == 0, math.inf, row_max + torch.log(row_sum)).squeeze(-1)
    result: Outputs = {"out": out.transpose(1, 2).contiguous(), "lse": lse, "dq": None, "dk": None, "dv": None}
    if not backward:
        return result
    dout = inputs.dout.float().transpose(1, 2)
    lse_safe = torch.where(torch.isfinite(lse), lse, math.inf)[..., None]
    probs = torch.exp(scores - lse_safe)
    delta = (dout * out.float()).sum(-1, keepdim=True)
    dscores = probs * (dout @ v.transpose(-1, -2) - delta)
    if tanh is not None:
        dscores = dscores * (1 - tanh.square())
    dscores_low = dscores.to(dtype).float()
    dv = probs.to(dtype).float().transpose(-1, -2) @ dout
    dq = (dscores_low @ k) * case.softmax_scale
    dk = (dscores_low.transpose(-1, -2) @ q) * case.softmax_scale
    batch, heads, seqlen_k = dk.shape[:3]

    def group_sum(x: torch.Tensor) -> torch.Tensor:  # [B, H, Sk, F] -> [B, Sk, Hkv, F]
        return x.view(batch, heads // group, group, seqlen_k, -1).sum(2).transpose(1, 2)

    result["dq"] = dq.transpose(1, 2).to(dtype).contiguous()
    result["dk"] = group_sum(dk).to(dtype).contiguous()
    result["dv"] = group_sum(dv).to(dtype).contiguous()
    return result


def sdpa_attention(
    case: AttentionCase, inputs: AttentionInputs, *, backend: str = "math", backward: bool = True
) -> Outputs | None:
    """PyTorch ``scaled_dot_product_attention`` on canonical inputs (thd per sequence).

    Args:
        case: the case.
        inputs: canonical inputs in the case dtype.
        backend: ``"math"`` or ``"flash"`` (the CPU flash kernel on CPU).
        backward: also return dq, dk, dv (autograd with ``inputs.dout``).

    Returns:
        ``{"out", "lse", "dq", "dk", "dv"}`` in the canonical layout (lse: flash only, float32;
        None for math), or None when SDPA cannot express the case (softcap; flash with
        ``head_dim_v != head_dim``).
    """
    if case.softcap is not None or (backend == "flash" and case.head_dim_v != case.head_dim):
        return None
    return _per_sequence(case, inputs, lambda c, i: _sdpa_dense(c, i, backend, backward))


def _sdpa_dense(case: AttentionCase, inputs: AttentionInputs, backend: str, backward: bool) -> Outputs:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = inputs.q.transpose(1, 2).detach().requires_grad_(backward)
    k = inputs.k.transpose(1, 2).detach().requires_grad_(backward)
    v = inputs.v.transpose(1, 2).detach().requires_grad_(backward)
    mask = _mask(case, q.device)
    lse = None
    if backend == "math":
        with sdpa_kernel(SDPBackend.MATH), torch.enable_grad():
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=case.softmax_scale, enable_gqa=True
            )
    else:
        additive = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, -math.inf)
        k_rep = k.repeat_interleave(case.group_size, dim=1)
        v_rep = v.repeat_interleave(case.group_size, dim=1)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.enable_grad():
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k_rep, v_rep, attn_mask=additive, scale=case.softmax_scale
            )
        with torch.no_grad():
            lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q.detach(), k_rep.detach(), v_rep.detach(), 0.0, False, attn_mask=additive[None, None],
                scale=case.softmax_scale,
            )[1]
    result: Outputs = {"out": out.detach().transpose(1, 2).contiguous(), "lse": lse, "dq": None, "dk": None, "dv": None}
    if backward:
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), inputs.dout.transpose(1, 2))
        result.update(
            dq=dq.transpose(1, 2).contiguous(), dk=dk.transpose(1, 2).contiguous(), dv=dv.transpose(1, 2).contiguous()
        )
    return result


def run_kernel(name: str, case: AttentionCase, inputs: AttentionInputs, *, backward: bool = True) -> Outputs | None:
    """Run kernel ``name`` of ``KERNELS``; None when it cannot express the case."""
    if name == "emulated_fa2":
        return emulated_flash_attention(case, inputs, backward=backward)
    return sdpa_attention(case, inputs, backend=name.removeprefix("sdpa_"), backward=backward)


def _length(rng: random.Random, max_seqlen: int) -> int:
    if rng.random() < 0.6:
        return min(rng.choice(EDGE_LENGTHS), max_seqlen)
    return rng.randint(1, max_seqlen)


def random_case(rng: random.Random, *, max_seqlen: int = 1024, dtype: str | None = None) -> AttentionCase:
    """A random case for calibration: every feature the oracle models, lengths near tile edges.

    Args:
        rng: the source of randomness.
        max_seqlen: longest sequence, tokens.
        dtype: fix the dtype (default: drawn from bf16, fp16, fp32).

    Returns:
        A valid `AttentionCase` with ``backward=True`` and at most ~4M score entries.
    """
    num_heads_kv = rng.choice((1, 1, 2))
    group = rng.choice((1, 1, 2, 4))
    head_dim = rng.choice((8, 16, 32, 64, 80, 96, 128))
    head_dim_v = head_dim if rng.random() < 0.8 else rng.choice((8, 16, 32, 64, 128))
    fields: dict[str, Any] = dict(
        num_heads=num_heads_kv * group,
        num_heads_kv=num_heads_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        dtype=dtype or rng.choice(("bfloat16", "float16", "float32")),
        input_distribution=rng.choice(("normal", "large_logits", "outliers", "near_constant")),
        seed=rng.randrange(2**32),
        softcap=rng.choice((5.0, 15.0, 30.0, 50.0)) if rng.random() < 0.2 else None,
    )
    mask_kind = rng.choice(("none", "causal", "causal", "window", "causal_window"))
    if mask_kind in ("causal", "causal_window"):
        fields["causal"] = True
    if mask_kind in ("window", "causal_window"):
        fields["window_size_left"] = rng.choice((None, 0, 1, 7, 64, 255, rng.randint(0, max_seqlen)))
        fields["window_size_right"] = rng.choice((None, 0, 1, 7, 64, 255, rng.randint(0, max_seqlen)))
    fields["causal_alignment"] = rng.choice(("top_left", "bottom_right"))
    if rng.random() < 0.2:
        batch_size = rng.randint(1, 3)
        seqlens_q = tuple(_length(rng, max_seqlen // 2) for _ in range(batch_size))
        seqlens_k = seqlens_q if rng.random() < 0.5 else tuple(_length(rng, max_seqlen // 2) for _ in range(batch_size))
        fields.update(
            qkv_format="thd", batch_size=batch_size, seqlens_q=seqlens_q, seqlens_k=seqlens_k,
            seqlen_q=max(seqlens_q), seqlen_k=max(seqlens_k),
        )
    else:
        seqlen_q = _length(rng, max_seqlen)
        seqlen_k = seqlen_q if rng.random() < 0.5 else _length(rng, max_seqlen)
        batch_size = rng.randint(1, 2)
        fields.update(batch_size=batch_size, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    return AttentionCase(**fields)


def calibrate(num_cases: int, *, seed: int = 0, max_seqlen: int = 1024, kernels: tuple[str, ...] = KERNELS):
    """Largest error ratio (all factors 1) per kernel, dtype and tensor over random cases.

    Args:
        num_cases: random cases to draw.
        seed: seed of the case generator.
        max_seqlen: longest sequence, tokens.
        kernels: names from ``KERNELS``.

    Returns:
        ``{(kernel, dtype, tensor): {"max_ratio": float, "cases": int, "worst_case": str}}``.
    """
    from oracle.compare import compare_outputs, tolerance_factor
    from oracle.reference import reference

    rng = random.Random(seed)
    table: dict[tuple[str, str, str], dict[str, Any]] = {}
    for _ in range(num_cases):
        case = random_case(rng, max_seqlen=max_seqlen)
        inputs = make_inputs(case)
        expected = reference(case, inputs, backward=True)
        has_empty_rows = bool(torch.isinf(expected.lse).any())
        for kernel in kernels:
            outputs = run_kernel(kernel, case, inputs)
            if outputs is None:
                continue
            if kernel == "sdpa_flash" and has_empty_rows:
                outputs["lse"] = None  # PyTorch's CPU flash kernel writes lse = 0 there (finite_on_masked)
            verdict = compare_outputs(case, expected, **outputs)
            for name, tensor_verdict in verdict.tensors.items():
                ratio = tensor_verdict.error_ratio * tolerance_factor(case.dtype, name)  # as if factor were 1
                entry = table.setdefault((kernel, case.dtype, name), {"max_ratio": 0.0, "cases": 0, "worst_case": ""})
                entry["cases"] += 1
                if ratio > entry["max_ratio"]:
                    entry["max_ratio"] = ratio
                    entry["worst_case"] = case.describe()
    return table


__all__ = [
    "EDGE_LENGTHS",
    "KERNELS",
    "calibrate",
    "emulated_flash_attention",
    "random_case",
    "run_kernel",
    "sdpa_attention",
]
