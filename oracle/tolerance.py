"""The error model: how much error a correct kernel may make in each tensor, per tensor and per
tile of rows, from the float64 reference alone (`prepare_tensor` -> `PreparedTensor`), for the
verdicts of `oracle.compare`. Also the numpy fast paths on the host the checks share.

Tolerance model. For a tensor ``T`` with kernel values ``A`` and float64 reference ``R``, over the
whole tensor and over each tile (``tile_rows`` consecutive rows of one (batch, head), all features):

* ``err_backend = ||A - R||_2``;
* rounding baseline ``||round_dtype(R) - R||_2``: the error of the exact result merely rounded to the
  kernel's output dtype (the case dtype; ``float32`` for lse);
* condition floor ``u * ||sigma||_2`` with ``u`` that dtype's unit roundoff and ``sigma`` the
  reference's per-row error scales (`oracle.reference.ReferenceResult.error_scales`; ``||R||`` per
  row when absent). ``sigma`` is the first-order error of a kernel that accumulates in fp32 and rounds
  ``P``, ``dS`` and ``O`` to the case dtype (FlashAttention's numerics), per unit roundoff:

  - ``out_i``: ``||P_i|| max_j||v_j|| (1 + rho (S_i + a_i)) + ||out_i|| (1 + rho a_i)``
  - ``lse_i``: ``|lse_i| + S_i + a_i`` (with ``u`` of float32)
  - ``dq_i``: ``B_i (1 + rho a_i) + rho a_i ||dq_i||`` with ``B_i = c max||k|| (||dS_i g_i|| +
    ||dO_i|| ||O_i|| + rho ||P_i|| ||dO_i|| max||v||)``
  - ``dk_j``: ``C_j (1 + rho b_j) + rho b_j ||dk_j||`` with ``C_j = c max||q|| (||dS_:j g_:j|| +
    ||P_:j ||dO|| ||O|| || + rho ||v_j|| ||P_:j ||dO|| ||)``
  - ``dv_j``: ``E_j (1 + rho b_j) + rho b_j ||dv_j||`` with ``E_j = ||P_:j ||dO|| g_:j||``
  - ``g_ij = 1 + max(rho S_i, rho (e_ij (1 - P_ij) + sum_{l != j} P_il e_il))``, the relative
    error of ``P_ij``, with ``e_ij = |sum_m T_ijm| / sqrt(d)`` over the partial sums ``T_ijm`` of
    the score ``c sum_m q_im k_jm`` summed in channel order (``d`` = head_dim; one GEMM:
    ``sum_m T_ijm = c sum_m (d - m) q_im k_jm``): the float32 error of a score grows with its
    partial sums (Higham, Sec. 4.2, in statistical form, ``>= |sum_m T_ijm| / sqrt(d)`` by
    Cauchy-Schwarz), which products of one sign from the first channels on (q aligned with a
    key: peaked rows, an attention sink) keep large, and softmax gives ``P_ij`` the error
    ``delta s_ij (1 - P_ij) - sum_{l != j} P_il delta s_il``: the dominant score's error is a
    relative error of every other ``P`` of its row, seen in full by a tile of keys the row barely
    attends (a float32 dv tile at 8.9e-13 of its tensor's norm failed at 1.15 on PyTorch's math
    SDPA, whose dominant score was off by -396 u32, as a sequential float32 sum gives it;
    `oracle.reference.aligned_score_growth`, with its sources). Where the partial sums stay
    small, and in bf16/fp16 (`oracle.reference.ALIGNED_SCORE_MIN_RHO`), ``g_ij = 1 + rho S_i``
  - plus, in ``B_i`` and ``C_j``, the normalisation error of the ``P`` a kernel recomputes as
    ``exp(s - lse)`` in fp32 (``sum_j P_ij = 1 + eps_i``, ``|eps_i| <~ u32 L_i``, ``L_i = 2 |lse_i|
    + ln n_i + 1``), which breaks ``sum_j dS_ij = 0``: ``c rho |D_i| L_i ||sum_j P_ij k_j||`` in
    ``B_i`` and ``c rho ||P_:j |D| L ||q|| ||`` in ``C_j`` (`oracle.reference.
    normalisation_error_scale`, with its sources; it matters for float32 score-offset cases,
    ``|lse|`` ~250, and is ~1e-5 of the rest in bf16/fp16)
  - in float16, ``P`` and ``dS`` in ``E_j``, ``C_j`` and ``B_i`` are taken as ``max(|x|,
    lambda)`` (``lambda = 2**-14``, the smallest normal; entries exactly 0 stay 0): rounding to
    float16 errs by ``u max(|x|, lambda)`` with gradual underflow (Higham, ASNA, Sec. 2.1), so a
    probability of ~1e-7 rounded to float16 is off by several %, times ``|dO|`` in ``dv``
    (`oracle.reference.underflow_floor`; visible only where the gradient itself is in the normal
    range, e.g. ``dout_distribution="large"``)

  where ``S_i = c ||q_i|| max_j||k_j||`` bounds the scores (``c`` = softmax_scale), ``rho`` =
  fp32 unit roundoff / dtype unit roundoff, ``a_i = sqrt(keys row i sees)`` and ``b_j = sqrt(rows
  seeing key j)`` (fp32 summation error grows like the square root of the number of terms; this
  matters for float32 kernels, where ``rho = 1``), and the column norms run over the query rows
  (and the GQA group) seeing key ``j``. The ``||dO_i|| ||O_i||`` terms are the error of
  ``D = rowsum(dO * O)`` from the rounded ``O``; they make ``dq`` tolerable where ``dS`` cancels
  (peaked softmax), and the ``||dS||`` terms where ``dq`` itself cancels (``near_constant`` keys:
  ``sum_j dS_ij = 0``, so ``dq`` is ~0 while its rounding error is not).
  Source: the rounding-error model of Higham, "Accuracy and Stability of Numerical Algorithms",
  2nd ed., eq. (3.4) (``|fl(x.y) - x.y| <= gamma_n |x|.|y|``), taken in its statistical (root-sum-
  square) form; the backward formulas are FlashAttention-2, arXiv:2307.08691, Algorithm 2.
* ``err_baseline = max(rounding baseline, u * ||sigma||)``;
  ``allowed = TOLERANCE_FACTORS[dtype][T] * err_baseline + ABSOLUTE_FLOOR[dtype] * sqrt(numel)``;
* ``error_ratio = err_backend / allowed`` (worst of global and tiles); ``> 1`` fails.

The idea is flash-attention's own test criterion (``tests/cute/test_flash_attn.py``: the kernel's
error against a float32 reference must stay within a small multiple of a plain low-precision
implementation's error plus a rounding allowance), with the low-precision run replaced by the
analytic ``sigma`` and the float32 reference by float64.

Calibration (``python benchmarks/oracle_calibrate.py``): the largest error ratio observed with all
factors set to 1 (i.e. ``err_backend / err_baseline``), over random cases (`oracle.calibration.
random_case`: batch 1-3, seqlen_q and seqlen_k 1-1024 weighted toward tile edges, bshd and thd,
1-8 heads incl. GQA/MQA, head_dim 8-128 with head_dim_v != head_dim, causal in both alignments,
windows, softcap, all four input distributions, forward and backward), for the real kernels PyTorch
SDPA ``MATH`` and CPU ``FLASH_ATTENTION`` (torch 2.13 CPU; gradients through autograd, lse from
``aten._scaled_dot_product_flash_attention_for_cpu``; SDPA cannot express softcap, and flash not
``head_dim_v != head_dim``) and an emulation of FlashAttention-2's numerics (fp32 scores and
accumulators; ``P`` and ``dS`` rounded to the dtype before their matmuls; ``D`` from the rounded
output). Seeds 3 and 4, 2000 cases each; in brackets the number of (case, tensor) comparisons:

=========  ============  ============  ============  ============  ============  ============
dtype      kernel        out           lse           dq            dk            dv
=========  ============  ============  ============  ============  ============  ============
bfloat16   sdpa_math     0.351 (1037)  -             0.122 (1037)  0.372 (1037)  0.865 (1037)
bfloat16   sdpa_flash    0.356 (862)   277 (772)     0.376 (862)   0.752 (862)   1.94 (862)
bfloat16   emulated_fa2  0.356 (1290)  2.85 (1290)   0.376 (1290)  0.603 (1290)  1.26 (1290)
float16    sdpa_math     0.294 (1104)  -             0.124 (1104)  0.376 (1104)  0.819 (1104)
float16    sdpa_flash    0.381 (914)   189 (796)     0.434 (914)   0.843 (914)   2.00 (914)
float16    emulated_fa2  0.395 (1364)  3.82 (1364)   0.461 (1364)  0.843 (1364)  1.32 (1364)
float32    sdpa_math     0.546 (1066)  -             0.095 (1066)  0.807 (1066)  1.19 (1066)
float32    sdpa_flash    0.411 (892)   2.48 (775)    0.224 (892)   0.598 (892)   0.886 (892)
float32    emulated_fa2  0.419 (1346)  2.48 (1346)   0.246 (1346)  0.607 (1346)  0.892 (1346)
=========  ============  ============  ============  ============  ============  ============

Two earlier runs (600 and 2000 cases, seeds 1 and 2, with the same bf16/fp16 model) saw at most
bf16 lse 324, dq 0.377, dk 0.768; fp16 dq 0.587, dv 2.14. Each factor is ``max(1.5, 3 x the
largest ratio seen)``, rounded up; 1.5 keeps a perfectly rounded result (ratio ``<= 1 / factor``)
well inside. The bf16/fp16 lse factors are set by PyTorch's CPU flash kernel, whose lse in those
dtypes is ~100x less accurate than FlashAttention's (it normalises with the probabilities rounded
to the dtype); the FA2 emulation stays below 4, so a kernel-specific factor of ~12 would be
possible. Allowed lse errors are then about ``980 * 2**-24 * (|lse| + S)``, ~1e-3 for typical
rows: a log2 lse, a 1% wrong softmax scale or a wrong row still fail by far, and so do a wrong row
among 16k rows, a zeroed tile, a NaN or an all-zero output (``tests/oracle/test_compare.py``).
Rows of a PyTorch CPU flash lse that see no key hold ``0`` (``finite_on_masked``); they were left
out of its calibration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24, "float64": 2.0**-53}
LSE_DTYPE = "float32"  # kernels return lse in float32; it is judged against float32 rounding
TILE_ROWS = 64
MAX_STORED_TILES = 1024  # per tensor: failing verdicts of larger tensors store no tile allowances

# allowed = factor * max(rounding baseline, u * ||sigma||) + floor * sqrt(numel); see the docstring.
TOLERANCE_FACTORS: dict[str, dict[str, float]] = {
    "bfloat16": {"out": 1.5, "lse": 980.0, "dq": 1.5, "dk": 2.4, "dv": 6.0},
    "float16": {"out": 1.5, "lse": 570.0, "dq": 1.8, "dk": 2.6, "dv": 6.5},
    "float32": {"out": 5.6, "lse": 24.0, "dq": 1.5, "dk": 2.5, "dv": 3.6},
}
# The float32 lse factor was 7.5 (3 x the 2.48 of the calibration table) until a CPU campaign of
# 2026-12-05 drew an LLM-like float32 case whose lse every float32 computation misses at 7.69 x its
# baseline (batch 2, seqlen_q = seqlen_k = 1, 32/4 heads, head_dim 224, qk_rank 4, attention sink,
# seq_scale_log2 3, seed 590241021: the lse is one score, a 224-term float32 dot product of aligned
# q and k): a float32 emulation with nothing in a lower precision (`oracle.emulate`) and three
# correct plugins failed it alike. By the calibration rule the factor is 3 x 7.69, rounded up
# (`tests/oracle/test_emulate.py` keeps that case passing in float32). Likewise the float32 out factor
# (1.7, from 0.546) after a float32 case with qk_rank 1 and fully peaked rows (batch 2, 6 x 5,
# 32/4 heads, head_dim 40, softmax_scale 1.94, window (0, 3), seed 2) that every float32
# computation missed at 1.86 x its baseline in one tile: 3 x 1.86, rounded up.
# Absolute floor per element: half the spacing of the dtype's subnormals (u * smallest normal), the
# rounding error of a value that is exactly 0 in float64 but tiny in the kernel's dtype; for the
# dtypes with float32's exponent range (bfloat16, float32) at least float32's smallest normal
# (2**-126, `FLUSH_TO_ZERO_FLOOR`): kernels accumulate in float32 and may flush subnormal
# intermediates and results to zero (CUDA's -ftz=true, x86 DAZ/FTZ), an absolute error up to that
# value per entry. Without it a tile whose reference is ~1e-38 (keys a peaked row never attends:
# P ~ exp(-87)) failed at 4.5x its allowance on PyTorch's CPU flash kernel, whose dv was the
# float64 value rounded to bfloat16 everywhere else (relative L2 error 1.9e-11; 2026-12-01).
FLUSH_TO_ZERO_FLOOR = torch.finfo(torch.float32).tiny
ABSOLUTE_FLOOR = {
    name: max(u * torch.finfo(getattr(torch, name)).tiny, FLUSH_TO_ZERO_FLOOR if name in ("bfloat16", "float32") else 0.0)
    for name, u in UNIT_ROUNDOFF.items()
}


# Host fast paths. On the CPU, torch's elementwise tests and reductions to a bool (``isfinite``,
# ``isnan``, ``==``, ``any``, ``all``, ``argmax``) cost 5-30x numpy's on the same memory (torch
# 2.13 CPU, one thread, 24,576 float64 entries, timed one by one: ``isfinite`` 41 against 4 us,
# ``any`` 19 against 0.7 us, ``equal`` 13 against 3 us; the whole comparison side by side with them
# off: `benchmarks/compare_host_bench.py`, 1.03-1.04x; the preparation of 300 stored CPU cases 2.0
# against 1.65 ms a case, 2026-12-02). Their results are exact (a bool, an index), so
# computing them with numpy on a zero-copy view changes no bit of any verdict. Sums, differences
# and square roots stay in torch (a reduction order of numpy's would change the last bit).
HOST_FAST_PATHS = True
"""Use the numpy fast paths on the host (a switch for `benchmarks/compare_host_bench.py` and the
tests that compare both; every verdict is the same either way)."""

_NUMPY_FLOATS = (torch.float64, torch.float32, torch.float16)


def _on_host(x: torch.Tensor) -> bool:
    return HOST_FAST_PATHS and x.device.type == "cpu"


def _isfinite(x: torch.Tensor) -> torch.Tensor:
    """``torch.isfinite(x)`` (a bool tensor of ``x``'s shape, contiguous on the host)."""
    if _on_host(x) and x.dtype in _NUMPY_FLOATS:
        return torch.from_numpy(np.isfinite(x.detach().numpy()))
    return torch.isfinite(x)


def _any(mask: torch.Tensor) -> bool:
    """``bool(mask.any())`` of a bool or numeric tensor (a host synchronisation on a GPU)."""
    if _on_host(mask) and (mask.dtype == torch.bool or mask.dtype in _NUMPY_FLOATS):
        return bool(mask.detach().numpy().any())
    return bool(mask.any())


def _all(mask: torch.Tensor) -> bool:
    """``bool(mask.all())`` of a bool tensor (a host synchronisation on a GPU)."""
    if _on_host(mask) and mask.dtype == torch.bool:
        return bool(mask.numpy().all())
    return bool(mask.all())


def _argmax(x: torch.Tensor) -> int:
    """``int(x.argmax())``: the flat index of the first largest entry of a float tensor that holds
    no NaN (numpy's ``argmax`` also returns the first maximum)."""
    if _on_host(x) and x.dtype in _NUMPY_FLOATS and x.numel():
        return int(np.argmax(x.detach().numpy()))
    return int(x.argmax())


def unit_roundoff(dtype: str) -> float:
    """Unit roundoff ``u = 2**-p`` of a dtype name (``"bfloat16"`` -> ``2**-8``)."""
    return UNIT_ROUNDOFF[dtype]


def rounding_dtype(name: str, dtype: str) -> str:
    """The dtype a kernel's tensor ``name`` is rounded to: ``float32`` for lse, else ``dtype``."""
    return LSE_DTYPE if name == "lse" else dtype


def tolerance_factor(dtype: str, name: str) -> float:
    """The calibrated factor for tensor ``name`` of a kernel running in ``dtype``."""
    return TOLERANCE_FACTORS[dtype][name]


@dataclass(frozen=True, eq=False)
class PreparedTensor:
    """The reference-only part of judging one tensor (`prepare_tensor`), computed once and reused
    for every kernel output compared with it (`judge_tensor`). Shapes: ``G`` groups (the non-row,
    non-feature dims), ``R`` rows, ``F`` features, ``T`` tiles of ``tile_rows`` rows.

    Attributes:
        name, dtype, shape, row_dim, tile_rows: as given to `prepare_tensor`.
        u, floor, factor: unit roundoff and absolute floor of the rounding dtype, the tolerance factor.
        group_dims, group_shape, has_features, num_groups, num_rows, num_features, num_tiles, pad:
            the grid layout.
        perm: dims permutation to ``[G, R, F]``.
        ref_v: float64 ``[G, R, F]``, the reference with non-judged entries set to 0.
        expect_masked, ref_finite: bool ``[G, R, F]``: entries that must be non-finite / are judged.
        ref_finite_any: some entry is judged.
        floor_global, allowed_global, ref_norm: floats of the whole tensor.
        base2_tiles, scale2_tiles, allowed_tiles: float64 ``[G, T]``.
        overflow: float64 ``[G, R, F]``: ``+-inf`` where the reference, rounded to the rounding
            dtype, overflows (the correctly rounded result is that infinity), else 0; None when
            no entry overflows.
        overflow_edge: float64 ``[G, R, F]``: ``+-inf`` (the reference's sign) where a finite
            reference entry lies within its tile's allowed error of the rounding dtype's largest
            finite value, so a kernel within the tolerance may round it to that infinity; else 0.
            None when no entry is that close. Such entries stay judged when the kernel's value is
            finite.
        masked_count: entries of ``expect_masked``.
        all_judged: every entry is judged (``ref_finite`` all true, nothing overflowed): the
            judging then skips the masks.
        tiles_positive: every allowed tile error is ``> 0`` (so ``err / allowed`` is 0 where the
            error is).
        reference: the reference tensor as given (no copy), for the value at a failing verdict's
            worst index (`TensorVerdict.worst_expected`).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    row_dim: int
    tile_rows: int
    u: float
    floor: float
    factor: float
    group_dims: tuple[int, ...]
    group_shape: tuple[int, ...]
    has_features: bool
    num_groups: int
    num_rows: int
    num_features: int
    num_tiles: int
    pad: int
    perm: tuple[int, ...]
    device: Any
    ref_v: torch.Tensor
    expect_masked: torch.Tensor
    ref_finite: torch.Tensor
    ref_finite_any: bool
    floor_global: float
    allowed_global: float
    ref_norm: float
    base2_tiles: torch.Tensor
    scale2_tiles: torch.Tensor
    allowed_tiles: torch.Tensor
    overflow: torch.Tensor | None = None
    overflow_edge: torch.Tensor | None = None
    judged: torch.Tensor | None = None  # ref_finite less the overflowed entries (None: ref_finite)
    masked_count: int | None = None  # None: count expect_masked when judging
    all_judged: bool = False
    tiles_positive: bool = False
    reference: torch.Tensor | None = field(default=None, repr=False)  # as given (not copied): the worst element's value

    def to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (shaped like the reference) as ``[G, R, F]``."""
        return x.permute(self.perm).reshape(self.num_groups, self.num_rows, self.num_features)

    def to_grid_float64(self, x: torch.Tensor) -> torch.Tensor:
        """``to_grid(x.to(self.device, float64))`` in one copy (the cast and the permutation
        together; none when ``x`` is already a float64 grid): the same values."""
        x = x.detach()
        if x.device != self.device:
            x = x.to(self.device)
        view = x.permute(self.perm)
        if x.dtype == torch.float64 and view.is_contiguous():
            return view.reshape(self.num_groups, self.num_rows, self.num_features)
        grid = torch.empty(view.shape, dtype=torch.float64, device=self.device)
        grid.copy_(view)
        return grid.view(self.num_groups, self.num_rows, self.num_features)

    def tiles(self, x: torch.Tensor) -> torch.Tensor:
        """Row sums ``[G, R]`` -> tile sums ``[G, T]``."""
        x = torch.nn.functional.pad(x, (0, self.pad)) if self.pad else x.contiguous()  # the layout pad gives
        return x.view(self.num_groups, self.num_tiles, self.tile_rows).sum(-1)


@torch.inference_mode()
def prepare_tensor(
    name: str,
    reference: torch.Tensor,
    dtype: str,
    *,
    tile_rows: int = TILE_ROWS,
    row_dim: int = 1,
    visible_rows: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    factor: float | None = None,
) -> PreparedTensor:
    """Everything of `compare_tensor` that depends on the reference only (same arguments, less
    ``actual``): the finite masks, the rounding baseline, the per-row error scales, their tile sums
    and the allowed errors. Pass it to `judge_tensor` once per kernel output.

    Raises:
        KeyError: ``dtype`` or ``name`` has no tolerance factor.
    """
    shape = tuple(reference.shape)
    round_to = rounding_dtype(name, dtype)
    u = UNIT_ROUNDOFF[round_to]
    floor = ABSOLUTE_FLOOR[round_to]
    factor = TOLERANCE_FACTORS[dtype][name] if factor is None else factor

    ndim = reference.dim()
    row_dim = row_dim % ndim
    has_features = row_dim != ndim - 1
    group_dims = [i for i in range(ndim) if i != row_dim and not (has_features and i == ndim - 1)]
    perm = group_dims + [row_dim] + ([ndim - 1] if has_features else [])
    group_shape = tuple(shape[i] for i in group_dims)
    num_groups, num_rows = math.prod(group_shape), shape[row_dim]
    num_features = shape[-1] if has_features else 1

    def rows_to_grid(x: torch.Tensor) -> torch.Tensor:  # row-shaped -> [groups, rows]
        row_perm = [i - (1 if has_features and i > ndim - 1 else 0) for i in group_dims + [row_dim]]
        return x.permute(row_perm).reshape(num_groups, num_rows)

    ref = reference.to(torch.float64).permute(perm).reshape(num_groups, num_rows, num_features)
    finite = _isfinite(ref)
    if visible_rows is not None:
        expect_masked = ~rows_to_grid(visible_rows.to(reference.device, torch.bool))[..., None].expand_as(ref)
        ref_finite = finite & ~expect_masked
    else:  # masked: the non-finite entries (then finite & ~masked is finite)
        expect_masked = ~finite
        ref_finite = finite
    host = _on_host(ref)
    ref_finite_all = _all(ref_finite) if host else None
    # every entry judged (the usual case on the host): the reference itself, read only
    ref_v = ref.contiguous() if ref_finite_all else torch.where(ref_finite, ref, 0.0)
    rounded = ref_v.to(getattr(torch, round_to)).to(torch.float64)
    # the figures the host needs come in two transfers (on a GPU each is a synchronisation)
    if host:
        rounded_sum = float(rounded.sum())
    else:
        ref_finite_all, rounded_sum = torch.stack([ref_finite.all().to(torch.float64), rounded.sum()]).tolist()
        ref_finite_all = bool(ref_finite_all)
    overflow = None  # None: no entry overflows (as all zeros for `judge_tensor`)
    judged = None
    # rounded holds no NaN (ref_v is finite): a finite sum means no infinity either
    if not math.isfinite(rounded_sum):
        overflowed = torch.isinf(rounded) & ref_finite
        if _any(overflowed):
            # An entry whose correctly rounded value is +-inf is left out of the error sums (the
            # kernel's infinity of that sign there is right, see `judge_tensor`; the other sign or
            # NaN is still flagged): its rounding error is infinite, and one such entry must not
            # make the allowance of its row, tile and tensor infinite (that switched the tensor's
            # check off).
            overflow = torch.where(overflowed, rounded, 0.0)
            judged = ref_finite & ~overflowed
            ref_v = torch.where(judged, ref_v, 0.0)
            rounded = torch.where(judged, rounded, 0.0)
    base = rounded - ref_v
    base2_rows = base.square().sum(-1)
    ref2_rows = ref_v.square().sum(-1)
    if row_scale is not None:
        scale2_rows = rows_to_grid(row_scale.to(reference.device, torch.float64)).square()
        if host and ref_finite_all:  # every row has a judged entry: every scale stays (in the layout of the where)
            scale2_rows = scale2_rows.contiguous()
        else:  # a row without a judged entry has no scale
            rows_judged = torch.from_numpy(ref_finite.numpy().any(-1)) if host else ref_finite.any(-1)
            scale2_rows = torch.where(rows_judged, scale2_rows, 0.0)
    else:
        scale2_rows = ref2_rows

    def allowed_for(base2: torch.Tensor, scale2: torch.Tensor, numel: int) -> torch.Tensor:
        return factor * torch.maximum(base2.sqrt(), u * scale2.sqrt()) + floor * math.sqrt(numel)

    base2_sum, scale2_sum = base2_rows.sum(), scale2_rows.sum()
    pad = (-num_rows) % tile_rows
    num_tiles = (num_rows + pad) // tile_rows

    def tiles(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, pad)).view(num_groups, num_tiles, tile_rows).sum(-1)

    base2_tiles, scale2_tiles = tiles(base2_rows), tiles(scale2_rows)
    allowed_tiles = allowed_for(base2_tiles, scale2_tiles, tile_rows * num_features)
    overflow_edge = None
    # The overflow edge. A kernel's error on one entry may be as large as its tile's allowed error
    # (an L2 bound over the tile bounds each entry), so where the float64 value lies within that of
    # the largest finite value, an infinity of the same sign is within the tolerance: IEEE 754-2019
    # 4.3.1, round-to-nearest overflows to +-inf past the largest finite value. Seen on the H200
    # (2026-12-01, 5b9657e and cf04de3; docs/gpu-campaigns.md "Findings", fp16 overflow at the
    # range's edge): float16 dk of about 6.0e4 to 6.5e4 with a large dout, infinite in every float16
    # backend. Checked only when some entry can be that close: a tile's allowance is at most the
    # tensor's and no entry exceeds the tensor's norm (no extra sync). The
    # exported repro's judge applies the same rule with the stored tile allowances.
    largest = torch.finfo(getattr(torch, round_to)).max
    sums = [base2_sum.sqrt(), scale2_sum.sqrt(), allowed_for(base2_sum, scale2_sum, ref.numel()), ref2_rows.sum().sqrt()]
    if host:  # the masks' figures from numpy (exact counts), the sums as torch rounded them
        base_global, scale_global, allowed_global, ref_norm = torch.stack(sums).tolist()
        ref_finite_any = _any(ref_finite)
        masked_count = 0 if ref_finite_all and visible_rows is None else int(np.count_nonzero(expect_masked.numpy()))
        tiles_positive = _all(allowed_tiles > 0)
    else:
        figures = torch.stack([
            *sums, ref_finite.any().to(torch.float64), expect_masked.sum().to(torch.float64),
            (allowed_tiles > 0).all().to(torch.float64),
        ]).tolist()
        base_global, scale_global, allowed_global, ref_norm, ref_finite_any, masked_count, tiles_positive = figures
    floor_global = max(base_global, u * scale_global)
    if ref_norm + allowed_global >= largest:
        allowed_rows = allowed_tiles.repeat_interleave(tile_rows, dim=1)[:, :num_rows]  # each row: its tile's
        edge = (ref_v.abs() >= largest - allowed_rows[..., None]) & ref_finite
        if judged is not None:
            edge &= judged
        if _any(edge):
            overflow_edge = torch.where(edge, torch.sign(ref_v) * math.inf, 0.0)
    return PreparedTensor(
        name=name, dtype=dtype, shape=shape, row_dim=row_dim, tile_rows=tile_rows, u=u, floor=floor,
        factor=factor, group_dims=tuple(group_dims), group_shape=group_shape, has_features=has_features,
        num_groups=num_groups, num_rows=num_rows, num_features=num_features, num_tiles=num_tiles, pad=pad,
        perm=tuple(perm), device=reference.device, ref_v=ref_v, expect_masked=expect_masked,
        ref_finite=ref_finite, ref_finite_any=bool(ref_finite_any), floor_global=floor_global,
        allowed_global=allowed_global, ref_norm=ref_norm, base2_tiles=base2_tiles,
        scale2_tiles=scale2_tiles,
        allowed_tiles=allowed_tiles,
        overflow=overflow,
        overflow_edge=overflow_edge,
        judged=judged,
        masked_count=0 if visible_rows is None and ref_finite_all else int(masked_count),
        all_judged=judged is None and ref_finite_all,
        tiles_positive=bool(tiles_positive),
        reference=reference,
    )
