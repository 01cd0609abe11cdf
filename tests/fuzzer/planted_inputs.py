"""Planted backends for the input-family tests (`tests/fuzzer/test_input_families_found.py`).

Each is correct attention on the CPU (float32 math with an explicit mask, `tests.fuzzer.standins`),
except under one input family (`oracle.inputs`), which it recognises from the tensors alone, the
way a real kernel's defect depends on the values it is given, never from the case's fields:

==========================  ===================  ==============================================
backend                     wrong only under     what it does there (and why only there)
==========================  ===================  ==============================================
``planted-split-exp``       score_offset < 0     NaN output on rows with ``lse < -88`` that see
                                                 >= 8 keys: ``exp(s) * exp(-lse)`` in float32
                                                 overflows (zero-mean scores keep ``lse >=
                                                 max_j s_ij``, so 8 keys all below -88 never occur)
``planted-sink``            attention_sink       output halved where one key (the first) takes
                                                 on average > 0.8 of the weight of >= 8 rows that
                                                 see >= 8 keys
``planted-peaked``          peaked_rows          output halved when a query is parallel to a key
                                                 it sees (cosine > 0.999, head_dim >= 16)
``planted-lowrank``         qk_rank              output halved when a head of q and one of k
                                                 (>= 16 tokens each, head_dim >= 16) have rank
                                                 <= 10 (q alone: peaked rows repeat keys; k
                                                 alone: bf16 near-constant keys)
``planted-massive``         massive_channels     output halved when a channel of k has an
                                                 interquartile range over >= 32 keys above 8 times
                                                 the median channel's, itself > 0.1 (robust to
                                                 outlier entries and near-constant keys)
``planted-seqscale``        seq_scale_log2       output halved when the rms of v differs 3x
                                                 between two sequences of the batch
``planted-dout-ftz``        dout tiny            flushes ``|dout| < 2**-24`` to 0 before the
                                                 backward (zero gradients)
``planted-dout-saturate``   dout large           clamps dout to +-64 (a saturating cast)
``planted-dout-rowscale``   dout sparse          scales each dout row by ``1 / amax`` and back:
                                                 ``0 / 0`` on an all-zero row (NaN gradients)
==========================  ===================  ==============================================
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fuzzer.backends.base import Backend, BackendOutput, Capabilities, run_with_grad
from tests.fuzzer.standins import attention_with_band

# bf16/fp16 only, as the flash kernels: this float32 stand-in's own rounding of q.k on peaked rows
# (q parallel to a key, scores of ~100 nats) exceeds the float32 error model (dk/dq tiles at ~2.5)
CAPS = Capabilities(
    dtypes=("bfloat16", "float16"),
    qkv_formats=("bshd", "sbhd"),
    max_head_dim=128,
    head_dim_v_differs=True,
    windows=True,
    lse=True,
    max_seqlen=256,
)


def _bounds(case):
    right = case.window_size_right
    if case.causal:
        right = 0 if right is None else min(right, 0)
    offset = case.seqlen_k - case.seqlen_q if case.causal_alignment == "bottom_right" else 0
    return case.window_size_left, right, offset


def _keep(case) -> torch.Tensor:
    """[sq, sk] bool visible mask (as `attention_with_band` builds it)."""
    left, right, offset = _bounds(case)
    i = torch.arange(case.seqlen_q).unsqueeze(1)
    j = torch.arange(case.seqlen_k).unsqueeze(0)
    keep = torch.ones(case.seqlen_q, case.seqlen_k, dtype=torch.bool)
    if right is not None:
        keep &= j <= i + offset + right
    if left is not None:
        keep &= j >= i + offset - left
    return keep


def _probs(case, inputs) -> torch.Tensor:
    """float64 [b, h, sq, sk] softmax (0 on masked entries and empty rows)."""
    k = inputs.k.double().repeat_interleave(case.group_size, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", inputs.q.double(), k) * case.softmax_scale
    scores = scores.masked_fill(~_keep(case), -math.inf)
    return torch.nan_to_num(scores.softmax(-1), nan=0.0)


class _Planted(Backend):
    device = "cpu"
    capabilities = CAPS
    variants = ("native",)
    environment = "planted-inputs"

    def forward_wrong(self, case, inputs) -> bool:
        return False

    def out_fault(self, case, inputs, out, lse):
        return out * 0.5

    def dout_fault(self, dout: torch.Tensor) -> torch.Tensor:
        return dout

    def run(self, case, inputs, variant):
        left, right, offset = _bounds(case)
        wrong = self.forward_wrong(case, inputs)

        def fn(q, k, v):
            out, lse = attention_with_band(q, k, v, case.softmax_scale, left, right, offset)
            if wrong:
                out = self.out_fault(case, inputs, out, lse)
            return out, lse

        inputs = dataclasses.replace(inputs, dout=self.dout_fault(inputs.dout))
        out, lse, dq, dk, dv = run_with_grad(fn, case, inputs)
        return BackendOutput(out=out, lse=lse, dq=dq, dk=dk, dv=dv)


class PlantedSplitExpBackend(_Planted):
    name = "planted-split-exp"

    def forward_wrong(self, case, inputs):
        return True

    def out_fault(self, case, inputs, out, lse):
        visible = _keep(case).sum(-1)  # [sq]
        broken = (lse < -88.0) & (visible >= 8)  # [b, h, sq]
        return out.masked_fill(broken.permute(0, 2, 1).unsqueeze(-1), math.nan)


class PlantedSinkBackend(_Planted):
    name = "planted-sink"

    def forward_wrong(self, case, inputs):
        keep = _keep(case)
        rows = keep[:, 0] & (keep.sum(-1) >= 8)
        if int(rows.sum()) < 8:
            return False
        weight = _probs(case, inputs)[..., 0][..., rows]  # [b, h, rows]
        return bool((weight.mean(-1) > 0.8).any())


class PlantedPeakedBackend(_Planted):
    name = "planted-peaked"

    def forward_wrong(self, case, inputs):
        if case.head_dim < 16:
            return False
        q = torch.nn.functional.normalize(inputs.q.double(), dim=-1)
        k = torch.nn.functional.normalize(inputs.k.double().repeat_interleave(case.group_size, dim=2), dim=-1)
        cosine = torch.einsum("bqhd,bkhd->bhqk", q, k).masked_fill(~_keep(case), 0.0)
        return bool((cosine > 0.999).any())


class PlantedLowRankBackend(_Planted):
    name = "planted-lowrank"

    def forward_wrong(self, case, inputs):
        q = inputs.q.double().reshape(-1, case.num_heads, case.head_dim)
        k = inputs.k.double().reshape(-1, case.num_heads_kv, case.head_dim)
        if min(q.shape[0], k.shape[0], case.head_dim) < 16:
            return False

        def rank(x, h):
            return int(torch.linalg.matrix_rank(x[:, h], rtol=1e-3))

        return min(rank(q, h) for h in range(case.num_heads)) <= 10 and min(rank(k, h) for h in range(case.num_heads_kv)) <= 10


class PlantedMassiveBackend(_Planted):
    name = "planted-massive"

    def forward_wrong(self, case, inputs):
        k = inputs.k.double().reshape(-1, case.num_heads_kv, case.head_dim)
        if case.head_dim < 8 or k.shape[0] < 32:
            return False
        spread = torch.quantile(k, 0.75, dim=0) - torch.quantile(k, 0.25, dim=0)  # [hkv, d]
        typical = spread.median(-1).values  # > 0.1: keys that vary (not near-constant ones)
        return bool(((spread.amax(-1) > 8 * typical) & (typical > 0.1)).any())


class PlantedSeqScaleBackend(_Planted):
    name = "planted-seqscale"

    def forward_wrong(self, case, inputs):
        if case.batch_size < 2 or inputs.v[0].numel() < 64:
            return False
        rms = inputs.v.double().square().flatten(1).mean(-1).sqrt()
        return float(rms.max()) > 3 * float(rms.min())


class PlantedDoutFlushBackend(_Planted):
    name = "planted-dout-ftz"

    def dout_fault(self, dout):
        return dout.masked_fill(dout.abs() < 2.0**-24, 0.0)


class PlantedDoutSaturateBackend(_Planted):
    name = "planted-dout-saturate"

    def dout_fault(self, dout):
        return dout.clamp(-64.0, 64.0)


class PlantedDoutRowScaleBackend(_Planted):
    name = "planted-dout-rowscale"

    def dout_fault(self, dout):
        amax = dout.abs().amax(-1, keepdim=True)
        return dout / amax * amax
