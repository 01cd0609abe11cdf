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
softmax shift is the Cauchy-Schwarz bound `oracle._dense.shift_bound` (folded into the score gemm with
``baddbmm``) instead of the exact row maximum whenever that cannot underflow, which saves a pass.
Peak extra memory is ``O(batch_size * num_heads * block_q * seqlen_k)``, chosen from a memory
budget; never ``O(seqlen_q * seqlen_k)`` per head. On CUDA the forward runs by default in a
compiled kernel (``engine="auto"``): the float64 DMMA kernel of `oracle._cuda_fwd` on sm_90+, else
the Triton one of `oracle._triton_fwd`.
The grouped layout, the block schedule and the torch forward, which those engines share with this
module, are `oracle._dense`; this module keeps the public API, the backward and its error terms.

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
from oracle._dense import (
    Dense,
    dense_forward,
    grouped_rows,
    kv_rows,
    mask_edges,
    row_norms,
    schedule,
    ungroup_row_values,
    ungroup_rows,
    unkv_rows,
    visible_counts,
)

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

    def numel(self) -> int:
        """Entries of every tensor held (``out``, ``lse``, the gradients, the error scales)."""
        return sum(t.numel() for t in self._tensors().values())

    def _tensors(self) -> dict[str, torch.Tensor]:
        named = {"out": self.out, "lse": self.lse, "dq": self.dq, "dk": self.dk, "dv": self.dv}
        named.update({f"error_scales.{k}": v for k, v in self.error_scales.items()})
        return {k: v for k, v in named.items() if v is not None}

    def to_host(self) -> ReferenceResult:
        """This result with every tensor on the CPU, moved in one device-to-host transfer (the
        float64 tensors flattened into one buffer on the device, copied once, and viewed back in
        their shapes: one host synchronisation instead of one per tensor). Values and dtypes are
        unchanged; the host tensors are contiguous views of one buffer (read them, do not write).
        A result already on the CPU is returned as it is. A tensor that is not float64 is copied
        on its own."""
        tensors = self._tensors()
        if all(t.device.type == "cpu" for t in tensors.values()):
            return self
        flat = [t for t in tensors.values() if t.dtype == torch.float64]
        host_flat = torch.cat([t.reshape(-1) for t in flat]).cpu() if flat else None
        moved: dict[str, torch.Tensor] = {}
        offset = 0
        for name, t in tensors.items():
            if t.dtype == torch.float64:
                moved[name] = host_flat[offset : offset + t.numel()].view(t.shape)
                offset += t.numel()
            else:
                moved[name] = t.cpu()
        scales = {k.split(".", 1)[1]: v for k, v in moved.items() if k.startswith("error_scales.")}
        return ReferenceResult(
            out=moved["out"], lse=moved["lse"], dq=moved.get("dq"), dk=moved.get("dk"), dv=moved.get("dv"),
            error_scales=scales, engine=self.engine,
        )


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


# --------------------------------------------------------------------------- error-model terms of the backward

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


ALIGNED_SCORE_MIN_RHO = 2.0**-4
"""`aligned_score_growth` applies where ``rho`` (fp32 unit roundoff / the case dtype's) is at least
this: float32. In bfloat16/float16 (``rho = 2**-16``, ``2**-13``) it would move no error scale by
more than 4.2% (float16 dv on the aligned case of `tests/oracle/test_error_model_aligned.py`; at
most 1.6% over 300 random cases) and cost a GEMM and a few passes over every score block."""


def partial_sum_weights(head_dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``d - m`` for channel ``m = 0 .. d-1`` (``[d]``): how many of the partial sums of a dot
    product summed in channel order hold the product of channel ``m``; ``sum_m (d - m) x_m y_m``
    is the sum of the partial sums (`aligned_score_growth`)."""
    return torch.arange(head_dim, 0, -1, dtype=dtype, device=device)


def aligned_score_growth(partial_sums: torch.Tensor, probs: torch.Tensor, growth: torch.Tensor, aligned: float) -> torch.Tensor:
    """``g_ij = 1 + max(rho S_i, rho (e_ij (1 - P_ij) + sum_{l != j} P_il e_il))`` per visible
    entry, ``e_ij = |sum_m T_ijm| / sqrt(d)``: the relative error, in units of the case dtype's
    unit roundoff, of the ``P_ij`` a float32 kernel computes, where the model's ``1 + rho S_i``
    (``growth``) holds for score sums whose partial sums stay small.

    A kernel sums ``s_ij = c sum_m q_im k_jm`` over the ``d`` = head_dim channels in float32, in
    channel order (a GEMM's inner loop, an MMA's k blocks). By Higham's analysis of recursive
    summation ("Accuracy and Stability of Numerical Algorithms", 2nd ed., Sec. 4.2: the error is
    ``sum_m delta_m T_m``, ``|delta_m| <= u``, over the partial sums ``T_ijm``; in statistical,
    root-sum-square form ``u (sum_m T_ijm^2)^(1/2)``) the score's error depends on its partial
    sums, and ``(sum_m T_ijm^2)^(1/2) >= |sum_m T_ijm| / sqrt(d)`` (Cauchy-Schwarz), with
    ``sum_m T_ijm = c sum_m (d - m) q_im k_jm`` one GEMM (`partial_sum_weights`). Products of
    both signs keep the partial sums near ``c sum_m |q_im k_jm| <= S_i`` (the model's score
    term; ``e_ij`` is then smaller); products of one sign carried from the first channels on (q
    aligned with a key, as in a peaked row or at an attention sink, whose channel is 0:
    `oracle.inputs`) make every partial sum large, and ``e_ij`` reaches ``|s_ij| sqrt(d) / 2`` and
    more, while a large product in the last channel (the score offset's) enters one partial sum
    and keeps ``e_ij`` small. Softmax turns score errors into ``delta ln P_ij = delta s_ij (1 -
    P_ij) - sum_{l != j} P_il delta s_il`` (first order; the shift and the normalisation cancel
    the rest), bounded term by term: the error of the row's dominant score reaches every other
    probability of the row as a *relative* error, while in the dominant key's own ``P`` (~1) it
    cancels. So the whole tensor, dominated by that key, does not show it, but a tile of keys the
    row barely attends does, in full. The larger of the two regimes is taken, so entries whose
    partial sums stay small keep ``1 + rho S_i`` exactly.

    Measured (torch 2.13 CPU, 2026-12-06): float32, b2 sq5 sk129 h2/2 d128, bottom-right causal,
    qk_rank 5, attention sink, peaked rows 0.5, large dout, seed 1350629696: the dominant score of
    row 4 (the sink key, 32.37 nats, all 128 products positive, 12 nats of them in channel 0) is
    off by -396 u32 in PyTorch's math SDPA (a sequential float32 sum of the pre-scaled q and k
    gives the same -396), so its ``P`` of key 128 (3.1e-12) is off by 409 u32 and the single-row
    dv tile of that key (8.9e-13 of the tensor's norm) failed at 1.15x its allowance (``1 + rho
    S_4 = 49``).

    Args:
        partial_sums: ``sum_m T_ijm`` (float64 ``[BHkv, r, c]``), overwritten.
        probs: ``P_ij``, same shape (0 on masked entries).
        growth: ``1 + rho S_i``, ``[BHkv, r]``.
        aligned: ``rho / sqrt(d)`` (``rho``: fp32 unit roundoff / the case dtype's unit roundoff).

    Returns:
        ``[BHkv, r, c]`` float64 (``partial_sums``' storage).
    """
    errors = partial_sums.abs_().mul_(aligned)  # rho e_ij
    weighted = probs * errors  # rho P_il e_il
    row = weighted.sum(dim=-1, keepdim=True)
    spread = errors.sub_(weighted.mul_(2.0)).add_(row)  # rho (e_ij (1 - P_ij) + sum_{l != j} P_il e_il)
    return torch.maximum(spread, growth[..., None] - 1.0).add_(1.0)


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


@torch.no_grad()
def _dense_backward(d: Dense, fwd: dict[str, torch.Tensor], dout: torch.Tensor, want_scales: bool):
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
        aligned = d.rho / math.sqrt(head_dim) if d.rho >= ALIGNED_SCORE_MIN_RHO else 0.0  # `aligned_score_growth`
        k_partial = d.k * partial_sum_weights(head_dim, d.k.dtype, d.k.device) if aligned else None  # (d - m) k_jm
        dout_norm = row_norms(dout)
        renorm = normalisation_error_scale(rho=d.rho, delta=delta, lse=lse, keys=visible_counts(d)[0])  # eps_i D_i / u
        row_weights = torch.stack(  # weights of the column sums of P^2
            [(dout_norm * row_norms(out)) ** 2, dout_norm**2, (renorm * row_norms(d.q)) ** 2],
            dim=1,
        )  # [BHkv, 3, Sq*G]
        col_p = torch.zeros(bh, 3, d.seqlen_k, dtype=torch.float64, device=d.q.device)
        col_pg = torch.zeros(bh, 1, d.seqlen_k, dtype=torch.float64, device=d.q.device)  # E_j^2
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
        mask_edges(scores, blk, d.lo, d.hi, d.group)
        probs = scores.exp_()
        if want_scales and aligned:  # g_ij^2, g_ij the relative error of P_ij (`aligned_score_growth`)
            partial = torch.bmm(q_blk, k_partial[:, blk.j0 : blk.j1].transpose(1, 2))
            squared_weight = aligned_score_growth(partial, probs, growth[:, r0:r1], aligned).square_()
        elif want_scales:
            squared_weight = growth[:, r0:r1, None] ** 2
        dv[:, blk.j0 : blk.j1].baddbmm_(probs.transpose(1, 2), dout_blk)
        dscores = torch.bmm(dout_blk, v_blk.transpose(1, 2)).sub_(delta[:, r0:r1, None]).mul_(probs)
        if d.softcap is not None:
            dscores.mul_(tanh.square_().neg_().add_(1.0))  # d(c tanh(x / c)) / dx = 1 - tanh^2
        dq[:, r0:r1] = torch.bmm(dscores, k_blk)
        dk[:, blk.j0 : blk.j1].baddbmm_(dscores.transpose(1, 2), q_blk)
        if want_scales:
            pk_norm[:, r0:r1] = row_norms(torch.bmm(probs, k_blk))
            squared_p = probs.square_()
            col_p[:, :, blk.j0 : blk.j1] += torch.bmm(row_weights[:, :, r0:r1], squared_p)
            squared_ds = dscores.square_()
            if d.underflow:  # P and dS rounded to float16 err by u max(|x|, tiny) (`underflow_floor`)
                tiny2 = d.underflow**2
                lifted_p = (tiny2 - squared_p).clamp_(min=0.0).mul_(squared_p > 0)  # max(P, tiny)^2 - P^2
                col_pg[:, :, blk.j0 : blk.j1] += torch.bmm(
                    (dout_norm[:, None, r0:r1] * growth[:, None, r0:r1]) ** 2, lifted_p
                )
                squared_ds = torch.where(squared_ds > 0, squared_ds.clamp(min=tiny2), squared_ds)
            col_pg[:, :, blk.j0 : blk.j1] += torch.bmm(row_weights[:, 1:2, r0:r1], squared_p.mul_(squared_weight))
            squared_ds.mul_(squared_weight)
            row_ds[:, r0:r1] = squared_ds.sum(dim=-1)
            col_ds[:, 0, blk.j0 : blk.j1] += squared_ds.sum(dim=1)
    dq.mul_(d.scale)  # dS is w.r.t. the scaled scores; k is unscaled. q was pre-scaled for dk.
    result = {"dq": dq, "dk": dk, "dv": dv}
    if want_scales:
        # Error scales (see `oracle.compare`); the sqrt(count) factors: fp32 summation error growth.
        k_max = row_norms(d.k).amax(dim=1, keepdim=True)
        v_max = row_norms(d.v).amax(dim=1, keepdim=True)
        q_max = row_norms(d.q).amax(dim=1, keepdim=True) / d.scale  # unscaled q
        keys_per_row, rows_per_key = (count.sqrt() for count in visible_counts(d))
        dq_base = d.scale * k_max * (
            row_ds.sqrt() + dout_norm * row_norms(out) + d.rho * fwd["p_norm"] * dout_norm * v_max
        ) + d.scale * renorm * pk_norm
        dk_base = d.scale * q_max * (
            col_ds[:, 0].sqrt() + col_p[:, 0].sqrt() + d.rho * row_norms(d.v) * col_p[:, 1].sqrt()
        ) + col_p[:, 2].sqrt()
        dv_base = col_pg[:, 0].sqrt()
        result["dq_scale"] = (dq_base + row_norms(dq)) * (d.rho * keys_per_row) + dq_base
        result["dk_scale"] = (dk_base + row_norms(dk)) * (d.rho * rows_per_key) + dk_base
        result["dv_scale"] = (dv_base + row_norms(dv)) * (d.rho * rows_per_key) + dv_base
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
    if dout is not None and error_scales and rho >= ALIGNED_SCORE_MIN_RHO:
        buffers += 3  # the partial sums, their weights and a temporary of `aligned_score_growth`'s (float32)
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
        grouped_q = grouped_rows(q_seg, hkv).mul_(case.softmax_scale)
        dense = Dense(
            q=grouped_q,
            k=kv_rows(k_seg),
            v=kv_rows(v_seg),
            lo=lo,
            hi=hi,
            blocks=schedule(lo, hi, rows),
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
            fwd = dense_forward(dense, error_scales)
        grouped = dict(fwd)
        if dout_seg is not None:
            grouped.update(_dense_backward(dense, fwd, grouped_rows(dout_seg, hkv), error_scales))
        # back to the canonical layout of this segment
        seg = {
            "out": ungroup_rows(grouped["out"], batch, len_q, hkv),
            "lse": ungroup_row_values(grouped["lse"], batch, len_q, hkv, lse_layout=True),
        }
        if error_scales:
            seg["out_scale"] = ungroup_row_values(grouped["out_scale"], batch, len_q, hkv, lse_layout=False)
            seg["lse_scale"] = ungroup_row_values(grouped["lse_scale"], batch, len_q, hkv, lse_layout=True)
        if dout_seg is not None:
            seg["dq"] = ungroup_rows(grouped["dq"], batch, len_q, hkv)
            seg["dk"] = unkv_rows(grouped["dk"], batch)
            seg["dv"] = unkv_rows(grouped["dv"], batch)
            if error_scales:
                seg["dq_scale"] = ungroup_row_values(grouped["dq_scale"], batch, len_q, hkv, lse_layout=False)
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
    "TRITON_AUTO_DEVICE_TYPES",
    "ReferenceInputError",
    "ReferenceResult",
    "attention_backward",
    "attention_forward",
    "choose_block_q",
    "reference",
]
